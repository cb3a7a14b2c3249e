// The message ids a subscription's lanes stored last (src/inbox/recent_ids.cpp): ids of
// committed batches are found in their lane until kPerLane newer ones were stored there; a
// batch that did not commit leaves nothing.
#include "inbox/recent_ids.hpp"

#include <gtest/gtest.h>

#include <string>

namespace eventbox::inbox {
namespace {

uint64_t h(int i) {
    return RecentIds::hash("id-" + std::to_string(i));
}

const uint64_t kLane0 = RecentIds::lane("orders", 0);
const uint64_t kLane1 = RecentIds::lane("orders", 1);

void store(RecentIds* r, uint64_t lane, int from, int to) {
    r->begin();
    for (int i = from; i < to; ++i) r->add(lane, h(i));
    r->committed();
}

TEST(RecentIds, IdsOfCommittedBatchesAreFoundInTheirLane) {
    RecentIds r;
    EXPECT_FALSE(r.contains(kLane0, h(1)));
    store(&r, kLane0, 0, 10);
    for (int i = 0; i < 10; ++i) EXPECT_TRUE(r.contains(kLane0, h(i)));
    EXPECT_FALSE(r.contains(kLane0, h(10)));
    EXPECT_FALSE(r.contains(kLane1, h(1)));
    EXPECT_NE(kLane0, kLane1);
    EXPECT_NE(RecentIds::lane("orders", 0), RecentIds::lane("orders0", 0));
}

TEST(RecentIds, ABatchThatDidNotCommitLeavesNothing) {
    RecentIds r;
    r.begin();
    r.add(kLane0, h(1));  // its transaction rolled back: the next batch begins
    store(&r, kLane0, 5, 6);
    EXPECT_FALSE(r.contains(kLane0, h(1)));
    EXPECT_TRUE(r.contains(kLane0, h(5)));
}

TEST(RecentIds, EachLaneKeepsItsLastIds) {
    RecentIds r;
    const int k = static_cast<int>(RecentIds::kPerLane);
    store(&r, kLane0, 0, 10);
    store(&r, kLane1, 1000, 1000 + 3 * k);  // another lane's many ids push nothing out
    EXPECT_TRUE(r.contains(kLane0, h(0)));
    store(&r, kLane0, 10, 10 + k);
    EXPECT_FALSE(r.contains(kLane0, h(9)));
    EXPECT_TRUE(r.contains(kLane0, h(10)));
    EXPECT_TRUE(r.contains(kLane0, h(9 + k)));
    EXPECT_FALSE(r.contains(kLane1, h(1000 + 2 * k - 1)));
    EXPECT_TRUE(r.contains(kLane1, h(1000 + 2 * k)));
    EXPECT_EQ(r.lanes(), 2u);
}

TEST(RecentIds, ClearForgetsEverything) {
    RecentIds r;
    store(&r, kLane0, 0, 10);
    r.clear();
    EXPECT_FALSE(r.contains(kLane0, h(3)));
    EXPECT_EQ(r.lanes(), 0u);
}

}  // namespace
}  // namespace eventbox::inbox
