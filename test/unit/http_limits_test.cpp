// Rate limits and the circuit breaker of HTTP destinations (src/outbox/http_limits.cpp): the
// token bucket's long-run rate and burst, the pause asked by limit headers, and the breaker's
// states (opens after N failures in a row, no request while open, one probe, closes on success).
#include "outbox/http_limits.hpp"

#include <gtest/gtest.h>

namespace eventbox::http {
namespace {

TEST(HttpTokenBucket, UnlimitedByDefault) {
    TokenBucket b;
    EXPECT_FALSE(b.limited());
    EXPECT_EQ(b.wait_ms(1000, 0), 0);
}

TEST(HttpTokenBucket, BurstThenRate) {
    TokenBucket b(20, 5);  // 20/s, burst 5
    int64_t now = 1000;
    for (int i = 0; i < 5; ++i) {
        ASSERT_EQ(b.wait_ms(1, now), 0) << i;
        b.take(1, now);
    }
    EXPECT_EQ(b.wait_ms(1, now), 50);
    // Taking whenever allowed for 10 s: 5 + 200 requests.
    int taken = 5;
    for (int64_t t = now; t < now + 10000; ++t)
        if (b.wait_ms(1, t) == 0) {
            b.take(1, t);
            ++taken;
        }
    EXPECT_NEAR(taken, 205, 1);
}

TEST(HttpTokenBucket, LargeTakesAreADebt) {
    TokenBucket b(100, 100);  // messages: 100/s
    b.take(100, 0);           // a bulk request of 100
    EXPECT_EQ(b.wait_ms(100, 0), 1000);
    b.take(250, 1000);  // more than the burst: allowed when full, then waited out
    EXPECT_EQ(b.wait_ms(1, 1000), 1510);
}

TEST(HttpLimitHeaders, RemainingZeroPausesUntilReset) {
    EXPECT_EQ(limit_pause_ms("0", "3", 0), 3000);
    EXPECT_EQ(limit_pause_ms(" 0\r\n", "1.5\r\n", 0), 1500);
    EXPECT_EQ(limit_pause_ms("1", "3", 0), -1);
    EXPECT_EQ(limit_pause_ms("0", "", 0), -1);
    EXPECT_EQ(limit_pause_ms("", "3", 0), -1);
    // Epoch seconds (X-RateLimit-Reset of GitHub and others).
    EXPECT_EQ(limit_pause_ms("0", "1700000010", 1700000000), 10000);
    EXPECT_EQ(limit_pause_ms("0", "1700000000", 1700000010), 0);
    EXPECT_EQ(limit_pause_ms("0", "999999", 0), 3600 * 1000);
}

TEST(HttpBreaker, NeverOpensWithoutFailures) {
    Breaker b;
    for (int i = 0; i < 100; ++i) b.ended(false, true, i);
    EXPECT_TRUE(b.allow(100));
    EXPECT_EQ(b.state(), Breaker::State::kClosed);
}

TEST(HttpBreaker, OpensProbesAndCloses) {
    Breaker b(3, 1000);
    b.ended(false, true, 0);
    b.ended(false, true, 1);
    b.ended(false, false, 2);  // a success resets the count
    b.ended(false, true, 3);
    b.ended(false, true, 4);
    EXPECT_EQ(b.state(), Breaker::State::kClosed);
    b.ended(false, true, 5);
    EXPECT_EQ(b.state(), Breaker::State::kOpen);
    EXPECT_EQ(b.due_ms(), 1005);
    EXPECT_FALSE(b.allow(1004));
    b.ended(false, false, 500);  // started before it opened: ignored
    EXPECT_EQ(b.state(), Breaker::State::kOpen);
    EXPECT_TRUE(b.allow(1005));
    EXPECT_EQ(b.state(), Breaker::State::kHalfOpen);
    EXPECT_FALSE(b.probing());
    EXPECT_TRUE(b.started());
    EXPECT_TRUE(b.probing());
    EXPECT_FALSE(b.allow(1006));  // one probe at a time
    b.ended(true, true, 1100);    // the probe failed: open again
    EXPECT_EQ(b.state(), Breaker::State::kOpen);
    EXPECT_EQ(b.due_ms(), 2100);
    EXPECT_TRUE(b.allow(2100));
    EXPECT_TRUE(b.started());
    b.ended(true, false, 2200);
    EXPECT_EQ(b.state(), Breaker::State::kClosed);
    EXPECT_TRUE(b.allow(2201));
    EXPECT_FALSE(b.started());  // closed: not a probe
    uint64_t t[3];
    b.take_transitions(t);
    EXPECT_EQ(t[0], 1u);  // closed
    EXPECT_EQ(t[1], 2u);  // open
    EXPECT_EQ(t[2], 2u);  // half-open
    b.take_transitions(t);
    EXPECT_EQ(t[1], 0u);
}

}  // namespace
}  // namespace eventbox::http
