// Quiet subscriptions of a handler worker (src/handlers/quiet.cpp): a subscription whose pass
// found nothing is passed over until rows are stored for it, rows are made to wait again,
// subscriptions change, or its recheck time (1 s, spread when there are many, or an earlier
// retry) comes.
#include "handlers/quiet.hpp"

#include <gtest/gtest.h>

#include <climits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

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
    requeued.inbox_changes = 11;  // a requeue, a replay (not the marks' periodic drop)
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

TEST(QuietSubscriptions, FewAreRecheckedASecondLaterOnATick) {
    for (int64_t now : {0, 1, 249, 250, 1000, 1234}) {
        int64_t at = QuietSubscriptions::recheck_time(now, 1, 12345);
        EXPECT_GE(at, now + kQuietRecheckMs);
        EXPECT_LT(at, now + kQuietRecheckMs + kQuietTickMs);
        EXPECT_EQ(at % kQuietTickMs, 0);
    }
    // Up to kQuietRechecksPerSecond / 2 quiet ones: no spread, whatever the seed.
    for (uint64_t seed : {0ull, 1ull, 999ull, ~0ull})
        EXPECT_EQ(QuietSubscriptions::recheck_time(1000, kQuietRechecksPerSecond / 2, seed), 2000);
}

TEST(QuietSubscriptions, ManyAreRecheckedAboutRechecksPerSecondAndOnTicks) {
    // 5,000 quiet subscriptions, each going quiet again at its recheck: over 10 minutes a
    // worker rechecks about kQuietRechecksPerSecond a second, and wakes only on ticks.
    QuietSubscriptions q;
    constexpr int kSubs = 5000;
    constexpr int64_t kSpanMs = 600000;
    QuietKey k{1, 1, 1, false};
    std::vector<std::string> names;
    for (int i = 0; i < kSubs; ++i) names.push_back("sub_" + std::to_string(i));
    std::multimap<int64_t, int> due;
    for (int i = 0; i < kSubs; ++i) {
        q.after_pass(names[i], k, 0, false, kNever);
        int64_t at = 0;
        ASSERT_TRUE(q.skip(names[i], k, 0, &at));
        due.emplace(at, i);
    }
    int64_t rechecks = 0, most_in_a_tick = 0;
    std::set<int64_t> wakes;
    while (due.begin()->first < kSpanMs) {
        int64_t now = due.begin()->first;
        EXPECT_EQ(now % kQuietTickMs, 0);
        wakes.insert(now);
        int64_t in_tick = 0;
        while (!due.empty() && due.begin()->first == now) {
            int i = due.begin()->second;
            due.erase(due.begin());
            int64_t at = 0;
            EXPECT_FALSE(q.skip(names[i], k, now, &at));
            q.after_pass(names[i], k, now, false, kNever);
            ASSERT_TRUE(q.skip(names[i], k, now, &at));
            EXPECT_GE(at, now + kQuietRecheckMs);
            EXPECT_LE(at, now + kSubs * 2000 / kQuietRechecksPerSecond + kQuietTickMs);
            due.emplace(at, i);
            ++rechecks;
            ++in_tick;
        }
        // After the first round (its early ones went quiet beside few others: no spread).
        if (now > kSubs * 2000 / kQuietRechecksPerSecond)
            most_in_a_tick = std::max(most_in_a_tick, in_tick);
    }
    double per_second = static_cast<double>(rechecks) * 1000 / kSpanMs;
    EXPECT_GT(per_second, 0.8 * kQuietRechecksPerSecond);
    EXPECT_LT(per_second, 1.25 * kQuietRechecksPerSecond);
    EXPECT_LE(static_cast<int64_t>(wakes.size()), kSpanMs / kQuietTickMs);
    // Spread: no tick holds much more than its share (50 a tick at 200 a second).
    EXPECT_LT(most_in_a_tick, 3 * kQuietRechecksPerSecond * kQuietTickMs / 1000);
}

// The handler worker asks skip() without a guard, after_pass() through one (handlers/worker.cpp).
static_assert(noexcept(std::declval<const QuietSubscriptions&>().skip("s", QuietKey{}, 0,
                                                                      nullptr)));
static_assert(!noexcept(std::declval<QuietSubscriptions&>().after_pass("s", QuietKey{}, 0, false,
                                                                       0)));

}  // namespace
}  // namespace eventbox::handlers
