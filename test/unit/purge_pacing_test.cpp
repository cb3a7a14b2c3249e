#include "workers/purge_pacing.hpp"

#include <gtest/gtest.h>

using eventbox::worker::PurgePacing;

TEST(PurgePacing, IdleFullBatchesGoOnAfterTenMilliseconds) {
    PurgePacing p;
    EXPECT_EQ(p.after_batch(0, 50, true, true, 7), PurgePacing::kFullPauseMs);
    EXPECT_EQ(p.after_batch(60, 110, true, true, 7), PurgePacing::kFullPauseMs);
}

TEST(PurgePacing, RoundsAndFailuresWait) {
    PurgePacing p;
    EXPECT_EQ(p.after_batch(0, 5, true, false, 0), PurgePacing::kRoundPauseMs);
    EXPECT_EQ(p.after_batch(10, 15, false, false, 5), PurgePacing::kFailedPauseMs);
}

TEST(PurgePacing, UnderLoadABatchFillsATenthOfTheTime) {
    PurgePacing p;
    (void)p.after_batch(0, 4, true, true, 100);
    EXPECT_EQ(p.after_batch(10, 15, true, true, 200), 45);
    EXPECT_EQ(p.after_batch(60, 90, true, true, 300), 270);
    // A batch too short to measure still waits the full-batch pause.
    EXPECT_EQ(p.after_batch(400, 400, true, true, 400), PurgePacing::kFullPauseMs);
    // The workers stopped: full pace again.
    EXPECT_EQ(p.after_batch(500, 505, true, true, 400), PurgePacing::kFullPauseMs);
}

TEST(PurgePacing, AWorkerRestartCountsAsWork) {
    PurgePacing p;
    (void)p.after_batch(0, 5, true, true, 1000);
    EXPECT_EQ(p.after_batch(10, 15, true, true, 3), 45);  // counters began again from 0
}

TEST(PurgePacing, StopsYieldingAfterAMinuteOfFullBatchesUnderLoad) {
    PurgePacing p;
    uint64_t inflow = 0;
    int64_t t = 0;
    long pause = 0;
    (void)p.after_batch(t, t + 5, true, true, inflow);
    // Full batches under load from t = 10 on: yielding until a minute has passed.
    for (t = 10; t < 59000; t += 50) {
        pause = p.after_batch(t, t + 5, true, true, ++inflow);
        ASSERT_EQ(pause, 45) << "at " << t;
    }
    EXPECT_EQ(p.after_batch(60010, 60015, true, true, ++inflow), PurgePacing::kFullPauseMs);
    EXPECT_EQ(p.after_batch(60030, 60035, true, true, ++inflow), PurgePacing::kFullPauseMs);
    // A batch that was not full ends the catch-up: the next full batches under load yield again.
    EXPECT_EQ(p.after_batch(60050, 60052, true, false, ++inflow), PurgePacing::kRoundPauseMs);
    EXPECT_EQ(p.after_batch(61060, 61065, true, true, ++inflow), 45);
}
