// The endpoint's pending gauges between exact counts: last count plus the workers' balance.
#include <gtest/gtest.h>

#include "metrics/pending_estimate.hpp"

using eventbox::metrics::PendingEstimate;

TEST(PendingEstimate, CountsFirstAndEverySecondWhileCheap) {
    PendingEstimate p;
    EXPECT_TRUE(p.count_due(0));
    p.start_count(0);
    p.end_count(19);  // 19 ms x 50 < 1 s: counting every refresh costs under 2%
    EXPECT_TRUE(p.count_due(1000));
    EXPECT_TRUE(p.count_due(999));  // refreshes come once a second: never skipped while cheap
}

TEST(PendingEstimate, ExpensiveCountsAreSpacedByFiftyTimesTheirDuration) {
    PendingEstimate p;
    p.start_count(10000);
    p.end_count(200);  // 200 ms: next count 10 s after this one started
    EXPECT_FALSE(p.count_due(11000));
    EXPECT_FALSE(p.count_due(19999));
    EXPECT_TRUE(p.count_due(20000));
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
