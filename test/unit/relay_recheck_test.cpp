// Late-commit recheck bookkeeping (src/relay_recheck.cpp).
#include "relay_recheck.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <ostream>
#include <set>
#include <vector>

namespace eventbox::relay {

// Found by argument-dependent lookup, so in the namespace of IdRange; for this test only.
bool operator==(const IdRange& a, const IdRange& b) {
    return a.lo == b.lo && a.hi == b.hi;
}
void PrintTo(const IdRange& r, std::ostream* os) {
    *os << "[" << r.lo << ", " << r.hi << "]";
}

namespace {

bool is_empty(const IdRange& r) {
    return r.lo > r.hi;
}

// A set of running xids, as the relay would see them in the proc array.
struct Running {
    std::set<uint32_t> xids;
    mutable std::vector<uint32_t> asked;
    std::function<bool(uint32_t)> fn() const {
        return [this](uint32_t xid) {
            asked.push_back(xid);
            return xids.count(xid) != 0;
        };
    }
};

// ---- scan_gaps ----------------------------------------------------------------------------

TEST(ScanGaps, NoRowsNoGaps) {
    EXPECT_TRUE(is_empty(scan_gaps(10, {})));
}

TEST(ScanGaps, ContiguousIdsHaveNoGaps) {
    EXPECT_TRUE(is_empty(scan_gaps(10, {11})));
    EXPECT_TRUE(is_empty(scan_gaps(10, {11, 12, 13})));
    EXPECT_TRUE(is_empty(scan_gaps(0, {1, 2})));
}

TEST(ScanGaps, GapAfterTheCursor) {
    EXPECT_EQ(scan_gaps(10, {12}), (IdRange{11, 11}));
    EXPECT_EQ(scan_gaps(10, {15, 16}), (IdRange{11, 14}));
}

TEST(ScanGaps, HolesBetweenIds) {
    EXPECT_EQ(scan_gaps(10, {11, 13}), (IdRange{12, 12}));
    EXPECT_EQ(scan_gaps(10, {11, 12, 20}), (IdRange{13, 19}));
}

TEST(ScanGaps, OneRangeCoversAllHoles) {
    EXPECT_EQ(scan_gaps(10, {11, 15, 16, 20}), (IdRange{12, 19}));
    EXPECT_EQ(scan_gaps(10, {12, 13, 15}), (IdRange{11, 14}));
    EXPECT_EQ(scan_gaps(0, {5, 100}), (IdRange{1, 99}));
}

TEST(ScanGaps, StartsAtCursorZeroAndLargeIds) {
    EXPECT_EQ(scan_gaps(0, {3}), (IdRange{1, 2}));
    int64_t big = int64_t{1} << 60;
    EXPECT_EQ(scan_gaps(big, {big + 3}), (IdRange{big + 1, big + 2}));
}

// ---- Rechecks -----------------------------------------------------------------------------

TEST(Rechecks, StartsEmpty) {
    Rechecks r;
    EXPECT_TRUE(r.empty());
    EXPECT_EQ(r.size(), 0u);
    Running running;
    EXPECT_TRUE(r.take_due(running.fn()).empty());
}

TEST(Rechecks, EmptyRangeIsIgnored) {
    Rechecks r;
    r.add(5, 4, {1});
    r.add(0, -1, {});
    EXPECT_TRUE(r.empty());
}

TEST(Rechecks, RangeWithoutWritersIsDueAtOnce) {
    Rechecks r;
    r.add(11, 14, {});
    EXPECT_FALSE(r.empty());
    Running running;
    auto due = r.take_due(running.fn());
    ASSERT_EQ(due.size(), 1u);
    EXPECT_EQ(due[0], (IdRange{11, 14}));
    EXPECT_TRUE(r.empty());
}

TEST(Rechecks, DueOnlyWhenAllWritersFinished) {
    Rechecks r;
    r.add(11, 14, {100, 101});
    Running running;
    running.xids = {100, 101};
    EXPECT_TRUE(r.take_due(running.fn()).empty());
    EXPECT_EQ(r.size(), 1u);
    running.xids = {101};
    EXPECT_TRUE(r.take_due(running.fn()).empty()) << "101 still runs";
    EXPECT_EQ(r.size(), 1u);
    running.xids = {};
    auto due = r.take_due(running.fn());
    ASSERT_EQ(due.size(), 1u);
    EXPECT_EQ(due[0], (IdRange{11, 14}));
    EXPECT_TRUE(r.empty());
    EXPECT_TRUE(r.take_due(running.fn()).empty()) << "taken only once";
}

TEST(Rechecks, FinishedWritersAreNotAskedAboutAgain) {
    Rechecks r;
    r.add(1, 1, {100, 101});
    Running running;
    running.xids = {101};
    r.take_due(running.fn());
    running.asked.clear();
    r.take_due(running.fn());
    EXPECT_EQ(running.asked, std::vector<uint32_t>{101});
}

TEST(Rechecks, RangesAreIndependent) {
    Rechecks r;
    r.add(1, 2, {100});
    r.add(5, 6, {200});
    Running running;
    running.xids = {200};
    auto due = r.take_due(running.fn());
    ASSERT_EQ(due.size(), 1u);
    EXPECT_EQ(due[0], (IdRange{1, 2}));
    EXPECT_EQ(r.size(), 1u);
    running.xids = {};
    due = r.take_due(running.fn());
    ASSERT_EQ(due.size(), 1u);
    EXPECT_EQ(due[0], (IdRange{5, 6}));
}

TEST(Rechecks, DueRangesAreSortedAndMerged) {
    Rechecks r;
    r.add(20, 25, {});
    r.add(1, 5, {});
    r.add(6, 10, {});   // adjacent to [1, 5]
    r.add(8, 12, {});   // overlaps [6, 10]
    r.add(14, 15, {});  // separate (13 is not covered)
    r.add(21, 22, {});  // inside [20, 25]
    Running running;
    auto due = r.take_due(running.fn());
    EXPECT_EQ(due, (std::vector<IdRange>{{1, 12}, {14, 15}, {20, 25}}));
    EXPECT_TRUE(r.empty());
}

TEST(Rechecks, NotDueRangesAreNotMergedIn) {
    Rechecks r;
    r.add(1, 5, {});
    r.add(6, 10, {7});
    r.add(11, 15, {});
    Running running;
    running.xids = {7};
    auto due = r.take_due(running.fn());
    EXPECT_EQ(due, (std::vector<IdRange>{{1, 5}, {11, 15}}));
    EXPECT_EQ(r.size(), 1u);
    running.xids = {};
    EXPECT_EQ(r.take_due(running.fn()), (std::vector<IdRange>{{6, 10}}));
}

TEST(Rechecks, FoldsIntoTheNewestEntryWhenFull) {
    Rechecks r;
    const std::size_t max = Rechecks::kMaxRanges;
    EXPECT_EQ(max, 64u);
    for (std::size_t i = 0; i < max; ++i) {
        int64_t lo = static_cast<int64_t>(i) * 10;
        r.add(lo, lo + 1, {static_cast<uint32_t>(1000 + i)});
    }
    EXPECT_EQ(r.size(), max);
    // Full: the next range is folded into the newest entry (ids 630..631, writer 1063).
    r.add(5000, 5001, {9000});
    EXPECT_EQ(r.size(), max);
    r.add(4000, 4000, {9001, 1063});
    EXPECT_EQ(r.size(), max);

    Running running;
    for (std::size_t i = 0; i < max; ++i) running.xids.insert(static_cast<uint32_t>(1000 + i));
    running.xids.insert({9000, 9001});
    EXPECT_TRUE(r.take_due(running.fn()).empty());

    // All original writers finish, the folded writers still run: the folded entry stays.
    running.xids = {9000, 9001};
    auto due = r.take_due(running.fn());
    EXPECT_EQ(due.size(), max - 1);
    EXPECT_EQ(due.front(), (IdRange{0, 1}));
    EXPECT_EQ(due.back(), (IdRange{620, 621}));
    EXPECT_EQ(r.size(), 1u);

    // 9000 finishes: 9001 still holds the folded entry back.
    running.xids = {9001};
    EXPECT_TRUE(r.take_due(running.fn()).empty());

    // Then it covers everything folded into it: 630..5001.
    running.xids = {};
    due = r.take_due(running.fn());
    ASSERT_EQ(due.size(), 1u);
    EXPECT_EQ(due[0], (IdRange{630, 5001}));
    EXPECT_TRUE(r.empty());
}

TEST(Rechecks, FoldingNeverLosesAnId) {
    Rechecks r;
    std::vector<IdRange> added;
    for (int64_t i = 0; i < 200; ++i) {
        int64_t lo = 1000 - i * 5;  // descending, so folds widen downwards too
        r.add(lo, lo + 2, {static_cast<uint32_t>(i + 1)});
        added.push_back({lo, lo + 2});
        EXPECT_LE(r.size(), Rechecks::kMaxRanges);
    }
    Running running;
    auto due = r.take_due(running.fn());
    EXPECT_TRUE(r.empty());
    for (const IdRange& a : added) {
        bool covered = false;
        for (const IdRange& d : due) covered = covered || (d.lo <= a.lo && a.hi <= d.hi);
        EXPECT_TRUE(covered) << "[" << a.lo << ", " << a.hi << "] lost";
    }
}

TEST(Rechecks, ClearForgetsEverything) {
    Rechecks r;
    r.add(1, 2, {5});
    r.clear();
    EXPECT_TRUE(r.empty());
    Running running;
    EXPECT_TRUE(r.take_due(running.fn()).empty());
}

}  // namespace
}  // namespace eventbox::relay
