// Late-commit recheck bookkeeping (src/outbox/relay_recheck.cpp).
#include "outbox/relay_recheck.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <ostream>
#include <set>
#include <utility>
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

// The relay's PostgreSQL side calls this without a guard (outbox/relay_worker.hpp): it must not
// throw.
static_assert(noexcept(std::declval<const Rechecks&>().empty()));

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

// One pass as the relay runs it: every range is read whole.
std::vector<IdRange> pass(Rechecks& r, const Running& running) {
    std::vector<IdRange> ranges = r.begin_pass(running.fn());
    r.end_pass(ranges.size());
    return ranges;
}

TEST(Rechecks, StartsEmpty) {
    Rechecks r;
    EXPECT_TRUE(r.empty());
    Running running;
    EXPECT_TRUE(pass(r, running).empty());
}

TEST(Rechecks, EmptyRangeIsIgnored) {
    Rechecks r;
    r.add(5, 4, {1});
    EXPECT_TRUE(r.empty());
}

TEST(Rechecks, RangeWithoutWritersIsReadOnceThenForgotten) {
    Rechecks r;
    Running running;
    r.add(11, 14, {});
    EXPECT_EQ(pass(r, running), (std::vector<IdRange>{{11, 14}}));
    EXPECT_TRUE(r.empty());
    EXPECT_TRUE(pass(r, running).empty());
}

// The fix for late rows being overtaken: a gap is read in every pass while its writers run, not
// only once they have finished.
TEST(Rechecks, RangeIsReadInEveryPassWhileAWriterRuns) {
    Rechecks r;
    Running running;
    running.xids = {100, 101};
    r.add(20, 25, {100, 101, 7});
    for (int i = 0; i < 3; ++i) EXPECT_EQ(pass(r, running), (std::vector<IdRange>{{20, 25}}));
    running.xids = {101};
    EXPECT_EQ(pass(r, running), (std::vector<IdRange>{{20, 25}})) << "101 still runs";
    running.xids = {};
    EXPECT_EQ(pass(r, running), (std::vector<IdRange>{{20, 25}})) << "read a last time";
    EXPECT_TRUE(r.empty());
}

TEST(Rechecks, FinishedWritersAreNotAskedAboutAgain) {
    Rechecks r;
    Running running;
    running.xids = {101};
    r.add(1, 2, {100, 101});
    pass(r, running);
    running.asked.clear();
    pass(r, running);
    EXPECT_EQ(running.asked, (std::vector<uint32_t>{101}));
}

TEST(Rechecks, RangesAreMergedAndAscendingForReading) {
    Rechecks r;
    Running running;
    running.xids = {9};
    r.add(30, 35, {9});
    r.add(10, 12, {9});
    r.add(13, 15, {});
    r.add(34, 40, {9});
    EXPECT_EQ(pass(r, running), (std::vector<IdRange>{{10, 15}, {30, 40}}));
    EXPECT_EQ(pass(r, running), (std::vector<IdRange>{{10, 12}, {30, 40}}))
        << "[13, 15] had no writers and was forgotten";
}

TEST(Rechecks, RangesNotReadWholeAreKept) {
    Rechecks r;
    Running running;
    r.add(1, 5, {});
    r.add(10, 15, {});
    std::vector<IdRange> ranges = r.begin_pass(running.fn());
    ASSERT_EQ(ranges.size(), 2u);
    r.end_pass(1);  // the relay ran out of room in the second range
    EXPECT_EQ(pass(r, running), (std::vector<IdRange>{{10, 15}}));
    EXPECT_TRUE(r.empty());
}

TEST(Rechecks, FoldsIntoTheNewestEntryWhenFull) {
    Rechecks r;
    Running running;
    running.xids = {1000};
    for (std::size_t i = 0; i < Rechecks::kMaxRanges; ++i)
        r.add(static_cast<int64_t>(i * 10), static_cast<int64_t>(i * 10 + 1), {1000});
    EXPECT_EQ(r.size(), Rechecks::kMaxRanges);
    r.add(5000, 5001, {2000});
    EXPECT_EQ(r.size(), Rechecks::kMaxRanges);
    running.xids = {2000};  // only the folded-in writer runs
    std::vector<IdRange> ranges = pass(r, running);
    EXPECT_EQ(ranges.back(), (IdRange{630, 5001}));
    EXPECT_EQ(r.size(), 1u) << "the folded entry waits for its own writers";
}

TEST(Rechecks, FoldingNeverLosesAnId) {
    Rechecks r;
    Running running;
    running.xids = {1};
    std::set<int64_t> added;
    for (int64_t i = 0; i < 500; ++i) {
        r.add(i * 7, i * 7 + 2, {1});
        for (int64_t id = i * 7; id <= i * 7 + 2; ++id) added.insert(id);
    }
    std::vector<IdRange> ranges = pass(r, running);
    for (int64_t id : added) {
        bool covered = false;
        for (const IdRange& range : ranges) covered |= id >= range.lo && id <= range.hi;
        EXPECT_TRUE(covered) << id;
    }
}

TEST(Rechecks, ClearForgetsEverything) {
    Rechecks r;
    r.add(1, 2, {1});
    r.clear();
    EXPECT_TRUE(r.empty());
}

TEST(Rechecks, LowestIsTheLowestKeptId) {
    Rechecks r;
    Running running;
    EXPECT_EQ(r.lowest(), INT64_MAX);
    running.xids = {100};
    r.add(30, 31, {100});
    r.add(12, 14, {});
    EXPECT_EQ(r.lowest(), 12);
    pass(r, running);  // 12..14 read a last time and forgotten; 30..31 kept
    EXPECT_EQ(r.lowest(), 30);
}

}  // namespace
}  // namespace eventbox::relay
