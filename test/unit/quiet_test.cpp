// Quiet subscriptions of a handler worker (src/handlers/quiet.cpp): a subscription whose pass
// found nothing is passed over until rows are stored for it, rows are made to wait again,
// subscriptions change, or its recheck time (1 s, or an earlier retry) comes.
#include "handlers/quiet.hpp"

#include <gtest/gtest.h>

#include <climits>
#include <utility>

namespace eventbox::handlers {
namespace {

constexpr int64_t kNever = INT64_MAX;

TEST(QuietSubscriptions, APassThatFoundNothingIsPassedOverUntilItsRecheck) {
    QuietSubscriptions q;
    QuietKey k{5, 10, 1, false};
    int64_t recheck = 0;
    EXPECT_FALSE(q.skip("s", k, 0, &recheck));  // never passed yet
    q.after_pass("s", k, 1000, false, kNever);
    EXPECT_TRUE(q.skip("s", k, 1500, &recheck));
    EXPECT_EQ(recheck, 1000 + kQuietRecheckMs);
    EXPECT_FALSE(q.skip("s", k, 1000 + kQuietRecheckMs, &recheck));  // bounded: direct DML
    EXPECT_FALSE(q.skip("other", k, 1500, &recheck));
}

TEST(QuietSubscriptions, AnythingThatMayGiveWorkEndsTheQuiet) {
    QuietSubscriptions q;
    QuietKey k{5, 10, 1, false};
    q.after_pass("s", k, 0, false, kNever);
    int64_t recheck = 0;
    QuietKey stored = k;
    stored.stored = 6;  // the ingest stored rows for it
    EXPECT_FALSE(q.skip("s", stored, 10, &recheck));
    QuietKey requeued = k;
    requeued.inbox_generation = 11;  // a requeue, a replay, the marks' periodic drop
    EXPECT_FALSE(q.skip("s", requeued, 10, &recheck));
    QuietKey committing = k;
    committing.in_flight = true;  // such a change is being committed
    EXPECT_FALSE(q.skip("s", committing, 10, &recheck));
    QuietKey changed = k;
    changed.subscriptions_generation = 2;  // a handler registered, options altered
    EXPECT_FALSE(q.skip("s", changed, 10, &recheck));
    EXPECT_TRUE(q.skip("s", k, 10, &recheck));
}

TEST(QuietSubscriptions, WorkFoundOrARetryDueShortensOrEndsIt) {
    QuietSubscriptions q;
    QuietKey k{5, 10, 1, false};
    int64_t recheck = 0;
    q.after_pass("s", k, 0, false, 300);  // a retry falls due at 300
    EXPECT_TRUE(q.skip("s", k, 299, &recheck));
    EXPECT_EQ(recheck, 300);
    EXPECT_FALSE(q.skip("s", k, 300, &recheck));
    q.after_pass("s", k, 400, true, kNever);  // found work (e.g. a lane locked by another worker)
    EXPECT_FALSE(q.skip("s", k, 401, &recheck));
    q.after_pass("s", QuietKey{5, 10, 1, true}, 500, false, kNever);  // read while committing
    EXPECT_FALSE(q.skip("s", k, 501, &recheck));
}

TEST(QuietSubscriptions, ANewSubscriptionsGenerationForgetsTheOthers) {
    QuietSubscriptions q;
    q.after_pass("a", QuietKey{1, 1, 1, false}, 0, false, kNever);
    q.after_pass("b", QuietKey{1, 1, 1, false}, 0, false, kNever);
    EXPECT_EQ(q.size(), 2u);
    q.after_pass("a", QuietKey{1, 1, 2, false}, 0, false, kNever);  // "b" may be dropped
    EXPECT_EQ(q.size(), 1u);
}

// The handler worker asks skip() without a guard, after_pass() through one (handlers/worker.cpp).
static_assert(noexcept(std::declval<const QuietSubscriptions&>().skip("s", QuietKey{}, 0,
                                                                      nullptr)));
static_assert(!noexcept(std::declval<QuietSubscriptions&>().after_pass("s", QuietKey{}, 0, false,
                                                                       0)));

}  // namespace
}  // namespace eventbox::handlers
