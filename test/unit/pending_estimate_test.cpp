// The endpoint's pending gauges between exact counts: last count plus the workers' balance.
#include <gtest/gtest.h>

#include <utility>

#include "metrics/pending_estimate.hpp"

using eventbox::metrics::PendingEstimate;

// The supervisor's endpoint calls these without a guard (metrics/endpoint.cpp): they must not
// throw.
static_assert(noexcept(std::declval<const PendingEstimate&>().outbox(0)));
static_assert(noexcept(std::declval<const PendingEstimate&>().counts()));
static_assert(noexcept(std::declval<const PendingEstimate&>().took_ms()));

TEST(PendingEstimate, CountsFirstAndEverySecondWhileCheap) {
    PendingEstimate p;
    EXPECT_TRUE(p.count_due(0, 0));
    p.start_count(0);
    p.set_inbox("orders", 15000, 0);
    p.end_count(4);  // 4 ms x 200 < 1 s: counting every refresh costs under 0.5%
    EXPECT_EQ(p.counts(), 1);
    EXPECT_EQ(p.took_ms(), 4);
    EXPECT_TRUE(p.count_due(1000, 15000));
    EXPECT_TRUE(
        p.count_due(999, 15000));  // refreshes come once a second: never skipped while cheap
}

TEST(PendingEstimate, ExpensiveCountsAreSpacedBy200TimesTheirDuration) {
    PendingEstimate p;
    p.start_count(10000);
    p.set_inbox("orders", 400000, 0);
    p.end_count(200);  // 200 ms: next count 40 s after this one started
    EXPECT_FALSE(p.count_due(11000, 400000));
    EXPECT_FALSE(p.count_due(49999, 400000));
    EXPECT_TRUE(p.count_due(50000, 400000));
    // Twice the rows now: a count would take ~400 ms, so 80 s.
    EXPECT_FALSE(p.count_due(50000, 800000));
    EXPECT_TRUE(p.count_due(90000, 800000));
}

TEST(PendingEstimate, AGrowingBacklogIsNotCountedAtEveryRefresh) {
    PendingEstimate p;
    p.start_count(0);
    p.end_count(1);  // an empty inbox, counted in 1 ms: too few rows to learn a cost per row
    // 75,000 rows stored since: ~75 ms at the default cost per row, so 15 s between counts.
    EXPECT_FALSE(p.count_due(1000, 75000));
    EXPECT_FALSE(p.count_due(14999, 75000));
    EXPECT_TRUE(p.count_due(15000, 75000));
    // Few rows (~5 ms): every refresh.
    EXPECT_TRUE(p.count_due(1000, 5000));
    EXPECT_FALSE(p.count_due(1000, 15000));
}

TEST(PendingEstimate, AddsTheBalanceChangeSinceTheCount) {
    PendingEstimate p;
    p.start_count(0);
    p.set_outbox(1000, 5000);
    p.set_inbox("orders", 300000, 70);
    p.set_inbox("payments", 0, -20);
    p.end_count(500);
    EXPECT_EQ(p.outbox(5000), 1000);
    EXPECT_EQ(p.outbox(5250), 1250);  // 250 more sent than published
    EXPECT_EQ(p.outbox(4100), 100);
    int64_t n = -1;
    ASSERT_TRUE(p.inbox("orders", 70 + 4096 - 10000, &n));
    EXPECT_EQ(n, 300000 + 4096 - 10000);
    ASSERT_TRUE(p.inbox("payments", -20 + 7, &n));
    EXPECT_EQ(n, 7);
}

TEST(PendingEstimate, NeverNegative) {
    PendingEstimate p;
    p.start_count(0);
    p.set_outbox(10, 0);
    p.set_inbox("orders", 10, 100);
    p.end_count(1);
    EXPECT_EQ(p.outbox(-50), 0);  // rows settled that the count had not seen yet
    int64_t n = -1;
    ASSERT_TRUE(p.inbox("orders", 0, &n));
    EXPECT_EQ(n, 0);
}

TEST(PendingEstimate, AnUncountedSubscriptionAsksForACount) {
    PendingEstimate p;
    p.start_count(0);
    p.set_inbox("orders", 5, 0);
    p.end_count(1000);
    int64_t n = -1;
    EXPECT_FALSE(p.inbox("created-since", 0, &n));
    EXPECT_EQ(n, -1);
    // A new count forgets what the last one had.
    p.start_count(60000);
    p.end_count(1);
    EXPECT_FALSE(p.inbox("orders", 0, &n));
}

TEST(PendingEstimate, TotalIsTheEstimateOfEveryGauge) {
    PendingEstimate p;
    p.start_count(0);
    p.set_outbox(10, 100);
    p.set_inbox("a", 1000, 0);
    p.set_inbox("b", 5, 7);
    p.end_count(3);
    auto balance = [](const std::string& name) -> int64_t { return name == "a" ? 500 : 2; };
    EXPECT_EQ(p.total(110, balance), 20 + 1500 + 0);
}
