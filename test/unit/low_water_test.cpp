// Low-water marks of a handler worker's lanes and the ingest's stored offsets
// (src/handlers/low_water.cpp): lanes kept in the order the probes found them, marks that only
// rise and are dropped together, and when a batch stores below what was stored before.
#include "handlers/low_water.hpp"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace eventbox::handlers {
namespace {

std::vector<std::pair<std::string, int32_t>> lanes(const LaneMarks& m, const char* sub) {
    std::vector<std::pair<std::string, int32_t>> out;
    for (std::size_t i = 0; i < m.count(sub); ++i)
        out.emplace_back(m.topic(sub, i), m.partition(sub, i));
    return out;
}

TEST(LaneMarks, LanesKeepTheOrderTheProbesFoundThemIn) {
    LaneMarks m;
    EXPECT_EQ(m.count("s"), 0u);
    EXPECT_EQ(m.find("s", "t", 0), -1);
    // Found past the last known lane, then one between two known lanes, then one before all:
    // the order is the index's (a collation's), never compared here ("b" before "a" is fine).
    EXPECT_EQ(m.learn("s", -1, "b", 0), 0u);
    EXPECT_EQ(m.learn("s", 0, "a", 7), 1u);
    EXPECT_EQ(m.learn("s", 0, "b", 3), 1u);
    EXPECT_EQ(m.learn("s", -1, "0", 1), 0u);
    using L = std::vector<std::pair<std::string, int32_t>>;
    EXPECT_EQ(lanes(m, "s"), (L{{"0", 1}, {"b", 0}, {"b", 3}, {"a", 7}}));
    EXPECT_EQ(m.find("s", "b", 3), 2);
    EXPECT_EQ(m.find("s", "b", 4), -1);
    // A lane known already keeps its place.
    EXPECT_EQ(m.learn("s", -1, "a", 7), 3u);
    EXPECT_EQ(m.count("s"), 4u);
    // Subscriptions are apart.
    EXPECT_EQ(m.count("other"), 0u);
    EXPECT_EQ(m.find("other", "b", 0), -1);
}

TEST(LaneMarks, ALaneIsDrainedWhileItsNextOffsetIsTheOneOfItsLastEmptyProbe) {
    LaneMarks m;
    m.begin_load("s");
    std::size_t a = m.learn("s", -1, "t", 0);
    std::size_t b = m.learn("s", 0, "t", 1);
    m.begin_next("s");
    // In index order, each found at the hint; a wrong hint still finds the lane.
    EXPECT_EQ(m.set_next("s", 0, "t", 0, 50), 0);
    EXPECT_EQ(m.set_next("s", 0, "t", 1, 9), 1);
    EXPECT_EQ(m.set_next("s", 5, "t", 1, 10), 1);
    // A lane the worker does not know (its offsets row is newer than the lanes it loaded).
    EXPECT_EQ(m.set_next("s", 2, "t", 2, 3), -1);
    EXPECT_EQ(m.set_next("other", 0, "t", 0, 3), -1);
    // Never probed empty: probed, whatever the mark.
    EXPECT_FALSE(m.drained("s", a));
    EXPECT_FALSE(m.any_probed_empty("s"));  // a pass need not read the next offsets
    m.probed_empty("s", a, 50);
    EXPECT_TRUE(m.any_probed_empty("s"));
    EXPECT_FALSE(m.any_probed_empty("other"));
    EXPECT_TRUE(m.drained("s", a));
    EXPECT_FALSE(m.drained("s", b));  // lane b never probed empty
    EXPECT_FALSE(m.drained("s", 7));  // no such position
    // The next pass reads again: a lane missing from its read is probed.
    m.begin_next("s");
    EXPECT_FALSE(m.drained("s", a));
    // Stored since the empty probe: probed.
    EXPECT_EQ(m.set_next("s", 0, "t", 0, 60), 0);
    EXPECT_FALSE(m.drained("s", a));
    // eventbox.replay() lowered the next offset below the mark while rows stored before may
    // still wait above it: not drained (a next offset at or below the mark is not enough).
    m.begin_next("s");
    EXPECT_EQ(m.set_next("s", 0, "t", 0, 20), 0);
    EXPECT_FALSE(m.drained("s", a));
    // The empty probe goes with the marks.
    m.begin_next("s");
    m.set_next("s", 0, "t", 0, 50);
    EXPECT_TRUE(m.drained("s", a));
    m.drop_marks();
    EXPECT_FALSE(m.drained("s", a));
    EXPECT_FALSE(m.any_probed_empty("s"));
}

TEST(LaneMarks, MarksStartAtNoneRiseOnlyAndAreDroppedTogether) {
    LaneMarks m;
    std::size_t a = m.learn("s", -1, "t", 0);
    std::size_t b = m.learn("s", 0, "t", 1);
    std::size_t c = m.learn("u", -1, "t", 0);
    EXPECT_EQ(m.mark("s", a).live, kNoMark);
    EXPECT_EQ(m.mark("s", a).replay, kNoMark);
    m.raise("s", a, false, 100);
    m.raise("s", a, false, 40);  // never lowered
    m.raise("s", a, true, 7);
    m.raise("s", b, false, 5);
    m.raise("u", c, true, 9);
    EXPECT_EQ(m.mark("s", a).live, 100);
    EXPECT_EQ(m.mark("s", a).replay, 7);
    EXPECT_EQ(m.mark("s", b).live, 5);
    EXPECT_EQ(m.mark("s", b).replay, kNoMark);
    EXPECT_EQ(m.mark("u", c).replay, 9);
    // A lane learned before a marked one moves it, mark and all.
    m.learn("s", -1, "s", 9);
    EXPECT_EQ(m.mark("s", a + 1).live, 100);
    m.raise("s", 99, false, 1);  // no such lane: nothing happens
    m.drop_marks();
    for (std::size_t i = 0; i < m.count("s"); ++i) {
        EXPECT_EQ(m.mark("s", i).live, kNoMark);
        EXPECT_EQ(m.mark("s", i).replay, kNoMark);
    }
    EXPECT_EQ(m.mark("u", c).replay, kNoMark);
    EXPECT_EQ(m.count("s"), 3u);  // the lanes stay known
}

TEST(LaneMarks, LoadedUntilDropAll) {
    LaneMarks m;
    EXPECT_FALSE(m.loaded("s"));
    m.begin_load("s");  // a subscription without lanes yet is loaded too
    EXPECT_TRUE(m.loaded("s"));
    EXPECT_EQ(m.count("s"), 0u);
    m.learn("s", -1, "t", 0);
    m.learn("s", 0, "t", 1);
    m.raise("s", 1, false, 50);
    m.drop_marks();
    EXPECT_TRUE(m.loaded("s"));
    EXPECT_EQ(m.count("s"), 2u);
    m.raise("s", 1, false, 60);
    m.drop_all();
    EXPECT_FALSE(m.loaded("s"));
    EXPECT_EQ(m.count("s"), 0u);
    EXPECT_EQ(m.find("s", "t", 1), -1);
    m.begin_load("s");
    EXPECT_EQ(m.learn("s", -1, "t", 1), 0u);
    EXPECT_EQ(m.mark("s", 0).live, kNoMark);
}

TEST(LaneMarks, UnknownWorkPerSubscriptionUntilAWalkFindsNoneOrTheLanesGo) {
    LaneMarks m;
    EXPECT_FALSE(m.unknown_work("s"));
    m.set_unknown_work("s", true);
    m.set_unknown_work("s", true);
    EXPECT_TRUE(m.unknown_work("s"));
    EXPECT_FALSE(m.unknown_work("t"));
    m.drop_marks();  // the lanes stay known, and so does what the plain walk found
    EXPECT_TRUE(m.unknown_work("s"));
    m.set_unknown_work("s", false);
    EXPECT_FALSE(m.unknown_work("s"));
    m.set_unknown_work("s", true);
    m.set_unknown_work("t", true);
    m.drop_all();  // lanes loaded again: a walk finds out again
    EXPECT_FALSE(m.unknown_work("s"));
    EXPECT_FALSE(m.unknown_work("t"));
}

TEST(StoredOffsets, BelowWhatWasStoredBeforeOrFirstTimeInALane) {
    StoredOffsets s;
    EXPECT_TRUE(s.below("s", "t", 0, 0));      // nothing stored in the lane yet
    EXPECT_TRUE(s.store("s", "t", 0, 0, 99));  // the lane's first batch in this process
    EXPECT_TRUE(s.below("s", "t", 0, 99));     // below() records nothing:
    EXPECT_FALSE(s.below("s", "t", 0, 100));
    EXPECT_FALSE(s.below("s", "t", 0, 100));
    EXPECT_FALSE(s.store("s", "t", 0, 100, 199));  // consumption goes on
    EXPECT_FALSE(s.store("s", "t", 0, 250, 260));  // a gap (compacted, transactional markers)
    EXPECT_TRUE(s.store("s", "t", 0, 120, 130));   // replay() or a seek: below what is stored
    EXPECT_FALSE(s.store("s", "t", 0, 261, 270));  // the highest stayed 260
    EXPECT_TRUE(s.store("s", "t", 0, 270, 280));   // the same offset again
    EXPECT_TRUE(s.store("s", "t", 1, 500, 510));   // another lane, another subscription
    EXPECT_TRUE(s.store("x", "t", 0, 500, 510));
    s.clear();
    EXPECT_TRUE(s.store("s", "t", 0, 1000, 1001));
}

// The PostgreSQL side calls the reads and the updates that cannot allocate without a guard
// (handlers/marks.cpp): they are noexcept, and a position past the known lanes reads as no lane.
static_assert(noexcept(std::declval<const LaneMarks&>().find("s", "t", 0)));
static_assert(noexcept(std::declval<const LaneMarks&>().topic("s", 0)));
static_assert(noexcept(std::declval<const LaneMarks&>().mark("s", 0)));
static_assert(noexcept(std::declval<const LaneMarks&>().drained("s", 0)));
static_assert(noexcept(std::declval<LaneMarks&>().raise("s", 0, false, 1)));
static_assert(noexcept(std::declval<LaneMarks&>().set_next("s", 0, "t", 0, 1)));
static_assert(noexcept(std::declval<LaneMarks&>().drop_marks()));

TEST(LaneMarks, APositionPastTheKnownLanesReadsAsNoLane) {
    LaneMarks m;
    EXPECT_EQ(m.topic("s", 0), "");
    EXPECT_EQ(m.partition("s", 0), -1);
    EXPECT_EQ(m.mark("s", 0).live, kNoMark);
    m.learn("s", -1, "t", 3);
    m.raise("s", 0, false, 40);
    EXPECT_EQ(m.topic("s", 0), "t");
    EXPECT_EQ(m.partition("s", 0), 3);
    EXPECT_EQ(m.mark("s", 0).live, 40);
    EXPECT_EQ(m.topic("s", 1), "");
    EXPECT_EQ(m.partition("s", 1), -1);
    EXPECT_EQ(m.mark("s", 1).live, kNoMark);
    EXPECT_EQ(m.mark("s", 1).replay, kNoMark);
}

}  // namespace
}  // namespace eventbox::handlers
