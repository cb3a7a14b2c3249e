// Lane planning for handler passes (src/handlers/plan.cpp): which messages of a lane a pass takes
// under each ordering, what a failure holds back, and the retry backoff.
#include "handlers/plan.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace eventbox::handlers {
namespace {

constexpr int64_t kNow = 1'000'000;
constexpr std::size_t kNoMax = 1000;

// A message due now, with a handler, without a key.
Candidate due() {
    return Candidate{};
}
Candidate keyed(std::string_view key) {
    Candidate c;
    c.key = key;
    c.has_key = true;
    return c;
}
// Waiting for its retry until after kNow.
Candidate waiting(Candidate c = due()) {
    c.not_before_ms = kNow + 1;
    return c;
}
Candidate unhandled(Candidate c = due()) {
    c.handled = false;
    return c;
}
Candidate suspect(Candidate c = due()) {
    c.suspect = true;
    return c;
}

struct Plan {
    std::vector<std::size_t> chosen;
    long suspect;
};

Plan plan(const std::vector<Candidate>& lane, Ordering ordering, bool keep = false,
          std::size_t max = kNoMax) {
    Plan p;
    p.suspect = plan_lane(lane, ordering, keep, kNow, max, p.chosen);
    return p;
}

using Picks = std::vector<std::size_t>;

// ---- ordering_from --------------------------------------------------------------------------

TEST(OrderingFrom, TheThreeSqlNames) {
    EXPECT_EQ(ordering_from("partition"), Ordering::kPartition);
    EXPECT_EQ(ordering_from("key"), Ordering::kKey);
    EXPECT_EQ(ordering_from("none"), Ordering::kNone);
}

TEST(OrderingFrom, AnythingElseIsPartition) {
    EXPECT_EQ(ordering_from(""), Ordering::kPartition);
    EXPECT_EQ(ordering_from("KEY"), Ordering::kPartition) << "names are case-sensitive";
    EXPECT_EQ(ordering_from("None"), Ordering::kPartition);
    EXPECT_EQ(ordering_from("keys"), Ordering::kPartition);
    EXPECT_EQ(ordering_from(" key"), Ordering::kPartition);
    EXPECT_EQ(ordering_from(std::string_view("key\0", 4)), Ordering::kPartition);
}

// ---- plan_lane: every ordering ----------------------------------------------------------------

class EveryOrdering : public ::testing::TestWithParam<Ordering> {};

std::string ordering_name(const ::testing::TestParamInfo<Ordering>& info) {
    switch (info.param) {
        case Ordering::kPartition:
            return "partition";
        case Ordering::kKey:
            return "key";
        case Ordering::kNone:
            return "none";
    }
    return "unknown";
}

INSTANTIATE_TEST_SUITE_P(PlanLane, EveryOrdering,
                         ::testing::Values(Ordering::kPartition, Ordering::kKey, Ordering::kNone),
                         ordering_name);

TEST_P(EveryOrdering, EmptyLaneTakesNothing) {
    Plan p = plan({}, GetParam());
    EXPECT_TRUE(p.chosen.empty());
    EXPECT_EQ(p.suspect, -1);
}

TEST_P(EveryOrdering, DueMessagesAreTakenInOffsetOrder) {
    Plan p = plan({due(), keyed("a"), keyed("b"), due()}, GetParam());
    EXPECT_EQ(p.chosen, (Picks{0, 1, 2, 3}));
    EXPECT_EQ(p.suspect, -1);
}

TEST_P(EveryOrdering, DueAtExactlyNow) {
    Candidate c = due();
    c.not_before_ms = kNow;
    EXPECT_EQ(plan({c}, GetParam()).chosen, (Picks{0}));
    c.not_before_ms = kNow - 1;
    EXPECT_EQ(plan({c}, GetParam()).chosen, (Picks{0}));
    c.not_before_ms = kNow + 1;
    EXPECT_TRUE(plan({c}, GetParam()).chosen.empty());
}

TEST_P(EveryOrdering, MaxBoundsTheChoice) {
    std::vector<Candidate> lane(5, due());
    EXPECT_EQ(plan(lane, GetParam(), false, 2).chosen, (Picks{0, 1}));
    EXPECT_EQ(plan(lane, GetParam(), false, 5).chosen, (Picks{0, 1, 2, 3, 4}));
    EXPECT_TRUE(plan(lane, GetParam(), false, 0).chosen.empty());
}

// `chosen` may already hold other lanes' picks: only the room left is used.
TEST_P(EveryOrdering, AppendsWhileChosenHasRoom) {
    std::vector<std::size_t> chosen{7, 8};
    long s = plan_lane({due(), due(), due()}, GetParam(), false, kNow, 3, chosen);
    EXPECT_EQ(chosen, (Picks{7, 8, 0}));
    EXPECT_EQ(s, -1);
    std::vector<std::size_t> full{7, 8, 9};
    plan_lane({due()}, GetParam(), false, kNow, 3, full);
    EXPECT_EQ(full, (Picks{7, 8, 9}));
}

// Unhandled messages with unhandled = 'keep': neither taken nor holding anything back, even
// when they wait.
TEST_P(EveryOrdering, KeptMessagesAreSkipped) {
    Plan p = plan({unhandled(), due(), unhandled(waiting()), unhandled(keyed("a")), keyed("a")},
                  GetParam(), true);
    EXPECT_EQ(p.chosen, (Picks{1, 4}));
    EXPECT_EQ(p.suspect, -1);
}

TEST_P(EveryOrdering, KeptMessagesDoNotUseUpMax) {
    Plan p = plan({unhandled(), unhandled(), due(), due()}, GetParam(), true, 1);
    EXPECT_EQ(p.chosen, (Picks{2}));
}

// With unhandled = 'ignore' they are taken like any other (to be marked ignored).
TEST_P(EveryOrdering, IgnoredMessagesAreTaken) {
    Plan p = plan({unhandled(), due(), unhandled(keyed("a"))}, GetParam(), false);
    EXPECT_EQ(p.chosen, (Picks{0, 1, 2}));
}

// A message whose last attempt never finished runs alone: planning stops at it and reports it;
// what was chosen before it stays in `chosen`.
TEST_P(EveryOrdering, SuspectFirstIsReportedAlone) {
    Plan p = plan({suspect(), due(), due()}, GetParam());
    EXPECT_EQ(p.suspect, 0);
    EXPECT_TRUE(p.chosen.empty());
}

TEST_P(EveryOrdering, SuspectStopsThePlan) {
    Plan p = plan({due(), keyed("a"), suspect(keyed("b")), due(), suspect()}, GetParam());
    EXPECT_EQ(p.suspect, 2);
    EXPECT_EQ(p.chosen, (Picks{0, 1}));
}

TEST_P(EveryOrdering, SuspectBeyondMaxIsNotReached) {
    Plan p = plan({due(), due(), suspect()}, GetParam(), false, 2);
    EXPECT_EQ(p.suspect, -1);
    EXPECT_EQ(p.chosen, (Picks{0, 1}));
}

// A suspect with no handler under 'keep' is a kept message like the others.
TEST_P(EveryOrdering, KeptSuspectIsSkipped) {
    Plan p = plan({unhandled(suspect()), due()}, GetParam(), true);
    EXPECT_EQ(p.suspect, -1);
    EXPECT_EQ(p.chosen, (Picks{1}));
}

// ---- plan_lane: ordering 'partition' --------------------------------------------------------

TEST(PlanLanePartition, WaitingFirstHoldsBackTheWholeLane) {
    Plan p = plan({waiting(), due(), keyed("x"), due()}, Ordering::kPartition);
    EXPECT_TRUE(p.chosen.empty());
    EXPECT_EQ(p.suspect, -1);
}

TEST(PlanLanePartition, WaitingInTheMiddleStopsThere) {
    Plan p =
        plan({due(), keyed("a"), waiting(keyed("b")), due(), keyed("c")}, Ordering::kPartition);
    EXPECT_EQ(p.chosen, (Picks{0, 1}));
}

TEST(PlanLanePartition, WaitingIgnoredMessageHoldsBackToo) {
    Plan p = plan({due(), unhandled(waiting()), due()}, Ordering::kPartition, false);
    EXPECT_EQ(p.chosen, (Picks{0}));
}

TEST(PlanLanePartition, WaitingSuspectHoldsBackAndIsNotReported) {
    Plan p = plan({due(), waiting(suspect()), due()}, Ordering::kPartition);
    EXPECT_EQ(p.suspect, -1);
    EXPECT_EQ(p.chosen, (Picks{0}));
}

// ---- plan_lane: ordering 'key' -------------------------------------------------------------

TEST(PlanLaneKey, WaitingKeyHoldsBackOnlyItsKey) {
    Plan p = plan({waiting(keyed("a")), keyed("b"), keyed("a"), keyed("c"), keyed("b"), keyed("a")},
                  Ordering::kKey);
    EXPECT_EQ(p.chosen, (Picks{1, 3, 4}));
    EXPECT_EQ(p.suspect, -1);
}

TEST(PlanLaneKey, KeyBlockedLaterStaysBlocked) {
    // 'a' runs once, then waits at index 2: index 4 ('a', due) stays behind it.
    Plan p =
        plan({keyed("a"), keyed("b"), waiting(keyed("a")), keyed("b"), keyed("a")}, Ordering::kKey);
    EXPECT_EQ(p.chosen, (Picks{0, 1, 3}));
}

TEST(PlanLaneKey, MessagesWithoutKeyAreOneKeyOfTheirOwn) {
    Plan p = plan({waiting(), keyed("a"), due(), keyed("a"), due()}, Ordering::kKey);
    EXPECT_EQ(p.chosen, (Picks{1, 3}));
    Plan q = plan({waiting(keyed("a")), due(), keyed("a"), due()}, Ordering::kKey);
    EXPECT_EQ(q.chosen, (Picks{1, 3}));
}

TEST(PlanLaneKey, EmptyKeyIsNotNoKey) {
    Plan p = plan({waiting(keyed("")), due(), keyed(""), due()}, Ordering::kKey);
    EXPECT_EQ(p.chosen, (Picks{1, 3}));
    Plan q = plan({waiting(), keyed(""), due(), keyed("")}, Ordering::kKey);
    EXPECT_EQ(q.chosen, (Picks{1, 3}));
}

TEST(PlanLaneKey, KeysAreComparedAsBytes) {
    std::string_view with_nul("a\0b", 3);
    Plan p = plan({waiting(keyed(with_nul)), keyed("a"), keyed(std::string_view("a\0b", 3)),
                   keyed(std::string_view("a\0c", 3)), keyed("A")},
                  Ordering::kKey);
    EXPECT_EQ(p.chosen, (Picks{1, 3, 4}));
}

TEST(PlanLaneKey, WaitingIgnoredMessageHoldsBackItsKey) {
    Plan p = plan({unhandled(waiting(keyed("a"))), keyed("a"), keyed("b")}, Ordering::kKey, false);
    EXPECT_EQ(p.chosen, (Picks{2}));
}

TEST(PlanLaneKey, SuspectBehindItsWaitingKeyIsHeldBackNotReported) {
    Plan p = plan({waiting(keyed("a")), suspect(keyed("a")), keyed("b")}, Ordering::kKey);
    EXPECT_EQ(p.suspect, -1);
    EXPECT_EQ(p.chosen, (Picks{2}));
}

TEST(PlanLaneKey, MaxCountsOnlyChosenMessages) {
    Plan p = plan({waiting(keyed("a")), keyed("a"), keyed("a"), keyed("b"), keyed("c")},
                  Ordering::kKey, false, 1);
    EXPECT_EQ(p.chosen, (Picks{3}));
}

// ---- plan_lane: ordering 'none' ------------------------------------------------------------

TEST(PlanLaneNone, WaitingHoldsBackNothing) {
    Plan p = plan({waiting(keyed("a")), keyed("a"), waiting(), due(), keyed("b")}, Ordering::kNone);
    EXPECT_EQ(p.chosen, (Picks{1, 3, 4}));
    EXPECT_EQ(p.suspect, -1);
}

TEST(PlanLaneNone, WaitingSuspectIsNotReported) {
    Plan p = plan({waiting(suspect()), due()}, Ordering::kNone);
    EXPECT_EQ(p.suspect, -1);
    EXPECT_EQ(p.chosen, (Picks{1}));
}

TEST(PlanLaneNone, MaxCountsOnlyChosenMessages) {
    Plan p = plan({waiting(), waiting(), due(), due()}, Ordering::kNone, false, 1);
    EXPECT_EQ(p.chosen, (Picks{2}));
}

// ---- held_back_by ---------------------------------------------------------------------------

TEST(HeldBackBy, PartitionHoldsBackEverything) {
    EXPECT_TRUE(held_back_by(keyed("a"), keyed("a"), Ordering::kPartition));
    EXPECT_TRUE(held_back_by(keyed("a"), keyed("b"), Ordering::kPartition));
    EXPECT_TRUE(held_back_by(due(), keyed("b"), Ordering::kPartition));
    EXPECT_TRUE(held_back_by(keyed("a"), due(), Ordering::kPartition));
    EXPECT_TRUE(held_back_by(due(), due(), Ordering::kPartition));
}

TEST(HeldBackBy, KeyHoldsBackTheSameKeyOnly) {
    EXPECT_TRUE(held_back_by(keyed("a"), keyed("a"), Ordering::kKey));
    EXPECT_FALSE(held_back_by(keyed("a"), keyed("b"), Ordering::kKey));
    EXPECT_FALSE(held_back_by(keyed("a"), keyed("A"), Ordering::kKey));
    EXPECT_FALSE(held_back_by(keyed("a"), keyed("ab"), Ordering::kKey));
    EXPECT_TRUE(held_back_by(keyed(std::string_view("x\0y", 3)), keyed(std::string_view("x\0y", 3)),
                             Ordering::kKey));
    EXPECT_FALSE(held_back_by(keyed(std::string_view("x\0y", 3)), keyed("x"), Ordering::kKey));
}

TEST(HeldBackBy, NoKeyIsOneKey) {
    EXPECT_TRUE(held_back_by(due(), due(), Ordering::kKey));
    EXPECT_FALSE(held_back_by(due(), keyed("a"), Ordering::kKey));
    EXPECT_FALSE(held_back_by(keyed("a"), due(), Ordering::kKey));
    EXPECT_FALSE(held_back_by(due(), keyed(""), Ordering::kKey));
    EXPECT_FALSE(held_back_by(keyed(""), due(), Ordering::kKey));
    EXPECT_TRUE(held_back_by(keyed(""), keyed(""), Ordering::kKey));
}

TEST(HeldBackBy, NoneHoldsBackNothing) {
    EXPECT_FALSE(held_back_by(keyed("a"), keyed("a"), Ordering::kNone));
    EXPECT_FALSE(held_back_by(due(), due(), Ordering::kNone));
    EXPECT_FALSE(held_back_by(keyed("a"), keyed("b"), Ordering::kNone));
}

// What the other fields say does not matter.
TEST(HeldBackBy, OnlyKeysMatter) {
    Candidate failed = waiting(suspect(unhandled(keyed("a"))));
    EXPECT_TRUE(held_back_by(failed, keyed("a"), Ordering::kKey));
    EXPECT_FALSE(held_back_by(failed, keyed("b"), Ordering::kKey));
    EXPECT_TRUE(held_back_by(failed, waiting(due()), Ordering::kPartition));
    EXPECT_FALSE(held_back_by(failed, keyed("a"), Ordering::kNone));
}

// ---- retry_delay_ms -------------------------------------------------------------------------

constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();

TEST(RetryDelay, FirstAttemptWaitsTheBackoff) {
    EXPECT_EQ(retry_delay_ms(1, 1000, 600000, 1.0), 1000);
    EXPECT_EQ(retry_delay_ms(1, 1000, 600000, 0.0), 500);
}

TEST(RetryDelay, DoublesWithEachAttempt) {
    int64_t expected = 1000;
    for (int32_t attempts = 1; attempts <= 20; ++attempts, expected *= 2) {
        EXPECT_EQ(retry_delay_ms(attempts, 1000, int64_t{1} << 40, 1.0), expected)
            << "attempts " << attempts;
        EXPECT_EQ(retry_delay_ms(attempts, 1000, int64_t{1} << 40, 0.0), expected / 2)
            << "attempts " << attempts;
    }
}

TEST(RetryDelay, CappedAtBackoffMax) {
    EXPECT_EQ(retry_delay_ms(3, 1000, 5000, 1.0), 4000);
    EXPECT_EQ(retry_delay_ms(4, 1000, 5000, 1.0), 5000);
    EXPECT_EQ(retry_delay_ms(4, 1000, 5000, 0.0), 2500);
    EXPECT_EQ(retry_delay_ms(1000, 1000, 5000, 1.0), 5000);
    EXPECT_EQ(retry_delay_ms(std::numeric_limits<int32_t>::max(), 1000, 600000, 1.0), 600000);
    // Equal bounds: a fixed delay (with jitter).
    EXPECT_EQ(retry_delay_ms(7, 2000, 2000, 1.0), 2000);
    EXPECT_EQ(retry_delay_ms(7, 2000, 2000, 0.0), 1000);
}

// The SQL side refuses backoff_max < backoff; were it passed, backoff wins.
TEST(RetryDelay, BackoffMaxBelowBackoffKeepsTheBackoff) {
    EXPECT_EQ(retry_delay_ms(1, 1000, 500, 1.0), 1000);
    EXPECT_EQ(retry_delay_ms(5, 1000, 500, 1.0), 1000);
}

TEST(RetryDelay, JitterWithinHalfToFullDelay) {
    for (int32_t attempts = 1; attempts <= 12; ++attempts) {
        int64_t d = retry_delay_ms(attempts, 250, 600000, 1.0);
        int64_t previous = -1;
        for (int i = 0; i < 1000; ++i) {
            double unit = i / 1000.0;  // [0, 1), as uniform_real_distribution gives
            int64_t delay = retry_delay_ms(attempts, 250, 600000, unit);
            EXPECT_GE(delay, d / 2) << "attempts " << attempts << " unit " << unit;
            EXPECT_LE(delay, d) << "attempts " << attempts << " unit " << unit;
            EXPECT_GE(delay, previous) << "grows with unit";
            previous = delay;
        }
        EXPECT_LT(retry_delay_ms(attempts, 250, 600000, 0.999), d + 1);
        EXPECT_GT(retry_delay_ms(attempts, 250, 600000, 0.999), d - d / 100 - 1);
    }
}

TEST(RetryDelay, JitterOfOddDelays) {
    EXPECT_EQ(retry_delay_ms(1, 3, 3, 0.0), 1);
    EXPECT_EQ(retry_delay_ms(1, 3, 3, 1.0), 3);
    EXPECT_EQ(retry_delay_ms(1, 3, 3, 0.5), 2);
    EXPECT_EQ(retry_delay_ms(1, 1, 1, 0.0), 0);
    EXPECT_EQ(retry_delay_ms(1, 1, 1, 1.0), 1);
}

TEST(RetryDelay, UnitIsClamped) {
    EXPECT_EQ(retry_delay_ms(1, 1000, 600000, -0.5), 500);
    EXPECT_EQ(retry_delay_ms(1, 1000, 600000, -1e300), 500);
    EXPECT_EQ(retry_delay_ms(1, 1000, 600000, 1.5), 1000);
    EXPECT_EQ(retry_delay_ms(1, 1000, 600000, 1e300), 1000);
    EXPECT_EQ(retry_delay_ms(1, 1000, 600000, std::numeric_limits<double>::infinity()), 1000);
    EXPECT_EQ(retry_delay_ms(1, 1000, 600000, -std::numeric_limits<double>::infinity()), 500);
}

// Attempts counts failures so far; anything below 1 is a first failure.
TEST(RetryDelay, AttemptsBelowOneAreTheFirst) {
    EXPECT_EQ(retry_delay_ms(0, 1000, 600000, 1.0), 1000);
    EXPECT_EQ(retry_delay_ms(-5, 1000, 600000, 1.0), 1000);
    EXPECT_EQ(retry_delay_ms(std::numeric_limits<int32_t>::min(), 1000, 600000, 1.0), 1000);
}

// A backoff below one millisecond (e.g. '1 microsecond' rounds to 0) counts as one.
TEST(RetryDelay, BackoffOfZeroCountsAsOneMillisecond) {
    EXPECT_EQ(retry_delay_ms(1, 0, 1, 1.0), 1);
    EXPECT_EQ(retry_delay_ms(3, 0, 100, 1.0), 4);
    EXPECT_EQ(retry_delay_ms(3, -7, 100, 1.0), 4);
    EXPECT_EQ(retry_delay_ms(30, 0, 100, 1.0), 100);
}

// Doubling never overflows: with a backoff_max beyond any reachable delay, many attempts give
// a delay that is capped, positive and within the jitter range. (backoff_max comes from an
// interval, up to about 178 million years = 5.6e18 ms, beyond 2^62.)
TEST(RetryDelay, NoOverflowWithHugeBackoffMax) {
    int64_t huge = 5'600'000'000'000'000'000;
    for (int32_t attempts : {62, 63, 64, 65, 100, 1000}) {
        int64_t high = retry_delay_ms(attempts, 1, huge, 1.0);
        int64_t low = retry_delay_ms(attempts, 1, huge, 0.0);
        EXPECT_GT(low, 0) << "attempts " << attempts;
        EXPECT_LE(high, huge) << "attempts " << attempts;
        EXPECT_GE(high, low) << "attempts " << attempts;
        EXPECT_GE(low, high / 2) << "attempts " << attempts;
    }
    EXPECT_EQ(retry_delay_ms(100, 1000, kMax64, 1.0), kMax64);
    EXPECT_EQ(retry_delay_ms(100, 1000, kMax64, 0.0), kMax64 / 2);
    EXPECT_EQ(retry_delay_ms(1, kMax64, kMax64, 1.0), kMax64);
}

}  // namespace
}  // namespace eventbox::handlers
