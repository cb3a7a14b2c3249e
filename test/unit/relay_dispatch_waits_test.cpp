// The relay's dispatcher (src/outbox/relay_dispatch.cpp), continued from relay_dispatch_test.cpp:
// rows that wait, capacity, backoff, refusals, tids and rows no sink takes.
#include "relay_dispatch_fake.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace eventbox::relay {
namespace {

// ---- waiting rows -------------------------------------------------------------------------

TEST(Dispatcher, RowsWithNotBeforeInTheFutureWait) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 1);
    std::map<int64_t, TestRow> outbox = {{1, keyed(1, "k")}, {2, keyed(2, "k")}, {3, keyless(3)}};
    outbox[1].not_before_ms = 5000;
    outbox[3].not_before_ms = 100;  // already due at now = 100
    d.offer(outbox[1].row(), 100);
    d.offer(outbox[2].row(), 100);  // same key: behind the waiting row
    d.offer(outbox[3].row(), 100);
    EXPECT_EQ(sink.produced, std::vector<int64_t>{3});
    EXPECT_EQ(d.waiting(), 2u);
    EXPECT_EQ(d.next_due_ms(), 5000);
    EXPECT_TRUE(refetch(d, outbox, 4999).empty());
    EXPECT_EQ(refetch(d, outbox, 5000), std::vector<int64_t>{1});
    ack(d, 1, 5001);
    EXPECT_EQ(refetch(d, outbox, 5001), std::vector<int64_t>{2});
    EXPECT_EQ(sink.produced, (std::vector<int64_t>{3, 1, 2}));
}

TEST(Dispatcher, RefetchDoneForgetsRowsThatVanished) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 1);
    std::map<int64_t, TestRow> outbox = {{1, keyed(1, "k")}, {2, keyed(2, "k")}};
    d.offer(outbox[1].row(), 0);
    fail(d, 1, 0);
    d.offer(outbox[2].row(), 0);
    outbox.erase(1);  // deleted (or no longer pending) meanwhile
    EXPECT_EQ(refetch(d, outbox, 100000), std::vector<int64_t>{1});
    EXPECT_FALSE(d.knows(1));
    EXPECT_EQ(d.waiting(), 1u);
    // B is now the head of the lane and goes.
    EXPECT_EQ(refetch(d, outbox, 100000), std::vector<int64_t>{2});
    EXPECT_EQ(sink.produced, (std::vector<int64_t>{1, 2}));
    EXPECT_EQ(d.waiting(), 0u);
}

TEST(Dispatcher, DueIdsAreBoundedAndAskedOnce) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 1);
    std::map<int64_t, TestRow> outbox;
    for (int64_t id = 1; id <= 5; ++id) {
        outbox[id] = keyless(id);
        outbox[id].not_before_ms = 10;
        d.offer(outbox[id].row(), 0);
    }
    EXPECT_EQ(d.waiting(), 5u);
    std::vector<int64_t> first = d.due_ids(10, 2);
    EXPECT_EQ(first.size(), 2u);
    // Asked-for rows are not asked for again before the refetch is done.
    std::vector<int64_t> second = d.due_ids(10, 10);
    for (int64_t id : second)
        EXPECT_EQ(std::count(first.begin(), first.end(), id), 0) << "asked twice: " << id;
    std::set<int64_t> all(first.begin(), first.end());
    all.insert(second.begin(), second.end());
    EXPECT_EQ(all.size(), 5u);
    for (int64_t id : all) d.offer(outbox[id].row(), 10);
    d.refetch_done();
    EXPECT_EQ(d.waiting(), 0u);
    EXPECT_EQ(sorted(sink.produced), (std::vector<int64_t>{1, 2, 3, 4, 5}));
}

// ---- capacity -----------------------------------------------------------------------------

TEST(Dispatcher, CapacityIsBoundedByInFlightAndWaiting) {
    FakeSink sink;
    Limits limits = small_limits();
    limits.max_in_flight = 3;
    limits.max_waiting = 5;
    Dispatcher d(sink, limits, 1);
    EXPECT_EQ(d.capacity(), 3u);
    std::vector<TestRow> rows;
    for (int64_t id = 1; id <= 10; ++id) rows.push_back(keyless(id));
    d.offer(rows[0].row(), 0);
    d.offer(rows[1].row(), 0);
    EXPECT_EQ(d.capacity(), 1u);
    d.offer(rows[2].row(), 0);
    EXPECT_EQ(d.capacity(), 0u);
    ack(d, 1, 0);
    EXPECT_EQ(d.capacity(), 1u);
    // Waiting rows count against max_waiting.
    fail(d, 2, 0);
    fail(d, 3, 0);
    EXPECT_EQ(d.in_flight(), 0u);
    EXPECT_EQ(d.waiting(), 2u);
    EXPECT_EQ(d.capacity(), 3u);  // min(3 - 0, 5 - 2)
    for (int i = 3; i < 6; ++i) {
        TestRow& r = rows[static_cast<std::size_t>(i)];
        r.not_before_ms = 1000000;
        d.offer(r.row(), 0);
    }
    EXPECT_EQ(d.waiting(), 5u);
    EXPECT_EQ(d.capacity(), 0u);
}

TEST(Dispatcher, CapacityNeverUnderflows) {
    FakeSink sink;
    Limits limits = small_limits();
    limits.max_in_flight = 1;
    Dispatcher d(sink, limits, 1);
    // The caller may offer more than capacity (e.g. refetched rows): capacity stays 0, not huge.
    std::vector<TestRow> rows = {keyless(1), keyless(2), keyless(3)};
    for (const TestRow& r : rows) d.offer(r.row(), 0);
    EXPECT_EQ(d.in_flight(), 3u);
    EXPECT_EQ(d.capacity(), 0u);
}

// ---- backoff ------------------------------------------------------------------------------

TEST(Dispatcher, BackoffGrowsExponentiallyWithJitterAndCap) {
    FakeSink sink;
    Limits limits = small_limits();
    limits.backoff_ms = 100;
    limits.backoff_max_ms = 1000;
    Dispatcher d(sink, limits, 42);
    // attempts -> nominal delay d; every draw must lie in [d/2, d].
    const std::vector<std::pair<int32_t, int64_t>> nominal = {
        {1, 100}, {2, 200}, {3, 400}, {4, 800}, {5, 1000}, {6, 1000}, {40, 1000}, {1 << 30, 1000}};
    for (auto [attempts, delay] : nominal) {
        int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;
        for (int i = 0; i < 2000; ++i) {
            int64_t b = d.backoff_for(attempts);
            ASSERT_GE(b, delay / 2) << "attempts " << attempts;
            ASSERT_LE(b, delay) << "attempts " << attempts;
            lo = std::min(lo, b);
            hi = std::max(hi, b);
        }
        // Jitter covers the range (2000 draws over at most 501 values).
        EXPECT_LE(lo, delay / 2 + delay / 20) << "attempts " << attempts;
        EXPECT_GE(hi, delay - delay / 20) << "attempts " << attempts;
    }
}

TEST(Dispatcher, BackoffForZeroOrNegativeAttemptsIsTheFirstDelay) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 1);
    for (int32_t attempts : {0, -1, std::numeric_limits<int32_t>::min()}) {
        int64_t b = d.backoff_for(attempts);
        EXPECT_GE(b, 50);
        EXPECT_LE(b, 100);
    }
}

TEST(Dispatcher, BackoffIsCappedWhenTheCapIsBelowTheFirstDelay) {
    FakeSink sink;
    Limits limits = small_limits();
    limits.backoff_ms = 5000;
    limits.backoff_max_ms = 300;
    Dispatcher d(sink, limits, 1);
    for (int i = 0; i < 100; ++i) {
        int64_t b = d.backoff_for(1);
        EXPECT_GE(b, 150);
        EXPECT_LE(b, 300);
    }
}

TEST(Dispatcher, BackoffWithTheLargestSettingsDoesNotOverflow) {
    FakeSink sink;
    Limits limits = small_limits();
    limits.backoff_ms = 3600 * 1000;           // eventbox.relay_retry_backoff max
    limits.backoff_max_ms = 24 * 3600 * 1000;  // eventbox.relay_retry_backoff_max max
    Dispatcher d(sink, limits, 1);
    for (int32_t attempts : {1, 2, 10, 100, std::numeric_limits<int32_t>::max()}) {
        int64_t b = d.backoff_for(attempts);
        EXPECT_GT(b, 0);
        EXPECT_LE(b, limits.backoff_max_ms);
    }
}

TEST(Dispatcher, TinyBackoffIsExact) {
    FakeSink sink;
    Limits limits = small_limits();
    limits.backoff_ms = 1;
    limits.backoff_max_ms = 1;
    Dispatcher d(sink, limits, 1);
    EXPECT_EQ(d.backoff_for(1), 1);
    EXPECT_EQ(d.backoff_for(10), 1);
}

TEST(Dispatcher, BackoffIsDeterministicForASeed) {
    FakeSink sink;
    Dispatcher a(sink, small_limits(), 12345), b(sink, small_limits(), 12345),
        c(sink, small_limits(), 54321);
    std::vector<int64_t> va, vb, vc;
    for (int i = 0; i < 50; ++i) {
        va.push_back(a.backoff_for(5));
        vb.push_back(b.backoff_for(5));
        vc.push_back(c.backoff_for(5));
    }
    EXPECT_EQ(va, vb);
    EXPECT_NE(va, vc);
}

TEST(Dispatcher, FailedRowWaitsForItsReportedBackoff) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 9);
    std::map<int64_t, TestRow> outbox = {{1, keyless(1)}};
    d.offer(outbox[1].row(), 0);
    fail(d, 1, 1000);
    int64_t retry_in = d.failed()[0].retry_in_ms;
    EXPECT_EQ(d.next_due_ms(), 1000 + retry_in);
    EXPECT_TRUE(refetch(d, outbox, 1000 + retry_in - 1).empty());
    EXPECT_EQ(refetch(d, outbox, 1000 + retry_in), std::vector<int64_t>{1});
}

}  // namespace
}  // namespace eventbox::relay

namespace eventbox::relay {
namespace {

// A record librdkafka refuses outright is a failed attempt: counted, recorded, retried with
// backoff, and given up after max_attempts (it used to be retried silently forever).
TEST(Dispatcher, LocallyRefusedRowIsAFailedAttemptAndGivesUp) {
    FakeSink sink;
    sink.too_large.insert(1);
    Limits limits = small_limits();
    limits.max_attempts = 2;
    Dispatcher d(sink, limits, 3);
    std::map<int64_t, TestRow> outbox = {{1, keyed(1, "k")}, {2, keyed(2, "k")}};
    d.offer(outbox[1].row(), 0);
    ASSERT_EQ(d.failed().size(), 1u);
    EXPECT_FALSE(d.failed()[0].give_up);
    EXPECT_NE(d.failed()[0].error.find("MSG_SIZE_TOO_LARGE"), std::string::npos);
    d.clear_outcomes(d.acked().size(), d.failed().size());
    outbox[1].attempts = 1;
    d.offer(outbox[2].row(), 1);
    EXPECT_TRUE(sink.produced.empty()) << "row 2 waits behind row 1 of its key";
    for (int64_t now = 1000; now < 1000000 && d.failed().empty(); now += 1000)
        refetch(d, outbox, now);
    ASSERT_EQ(d.failed().size(), 1u);
    EXPECT_TRUE(d.failed()[0].give_up) << "second permanent failure with max_attempts 2";
    d.clear_outcomes(d.acked().size(), d.failed().size());
    for (int64_t now = 1000000; now < 2000000 && sink.produced.empty(); now += 1000)
        refetch(d, outbox, now);
    EXPECT_EQ(sink.produced, (std::vector<int64_t>{2})) << "the key moves on once row 1 failed";
}

// The relay writes the outcomes it has, then offers rows in the same pass; a row the producer
// refuses at once records its failure then. Clearing after the commit must keep that failure
// (it was dropped before: the row stayed pending with no attempt and blocked its key forever).
TEST(Dispatcher, OutcomesRecordedAfterTheWriteSurviveTheClear) {
    FakeSink sink;
    sink.too_large.insert(3);
    Dispatcher d(sink, small_limits(), 5);
    d.offer(keyed(1, "a").row(), 0);
    d.offer(keyed(2, "b").row(), 0);
    ack(d, 1, 1);
    fail(d, 2, 1);
    std::size_t written_acked = d.acked().size(), written_failed = d.failed().size();
    ASSERT_EQ(written_acked, 1u);
    ASSERT_EQ(written_failed, 1u);
    d.offer(keyed(3, "c").row(), 2);  // refused while the written outcomes commit
    ack(d, 4, 2);                     // unknown: ignored
    d.clear_outcomes(written_acked, written_failed);
    EXPECT_TRUE(d.acked().empty());
    ASSERT_EQ(d.failed().size(), 1u);
    EXPECT_EQ(d.failed()[0].id, 3);
    d.clear_outcomes(5, 5);  // more than there are: clears what there is
    EXPECT_TRUE(d.failed().empty());
}

}  // namespace
}  // namespace eventbox::relay

// An HTTP Retry-After: the retry waits at least that long, even past the backoff (and
// backoff_max); a shorter one leaves the backoff as it is.
namespace eventbox::relay {
namespace {

TEST(Dispatcher, RetryWaitsAtLeastTheGivenMinimum) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 5);
    d.offer(keyed(1, "a").row(), 0);
    d.offer(keyed(2, "b").row(), 0);
    d.on_delivery(1, kErrTimedOut, false, true, -1, -1, "HTTP 429", 10, 5000);
    d.on_delivery(2, kErrTimedOut, false, true, -1, -1, "HTTP 503", 10, 1);
    ASSERT_EQ(d.failed().size(), 2u);
    EXPECT_EQ(d.failed()[0].retry_in_ms, 5000);
    EXPECT_GE(d.failed()[1].retry_in_ms, 50);
    EXPECT_LE(d.failed()[1].retry_in_ms, 100);
    EXPECT_EQ(d.next_due_ms(), 10 + d.failed()[1].retry_in_ms);
}

}  // namespace
}  // namespace eventbox::relay

namespace eventbox::relay {
namespace {

// An acknowledged row's ack row goes to the rotated table of the read that was produced: after
// a failed attempt the row is held, and the retry's read (from eventbox.outbox_held, table -1)
// is the one acked, so that its rotated copy is looked up.
TEST(Dispatcher, AckedRowCarriesTheTableOfTheReadThatWasProduced) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 1);
    TestRow keep = keyed(1, "k");
    Row first = keep.row();
    first.table = 2;
    d.offer(first, 0);
    fail(d, 1, 10);
    d.clear_outcomes(0, d.failed().size());
    const std::vector<int64_t>& due = d.due_ids(5000, 10);
    ASSERT_EQ(due, std::vector<int64_t>{1});
    Row retry = keep.row();
    retry.table = -1;
    retry.attempts = 1;
    d.offer(retry, 5000);
    d.refetch_done();
    ack(d, 1, 5010);
    ASSERT_EQ(d.acked().size(), 1u);
    EXPECT_EQ(d.acked()[0].table, -1);

    // A row read from a rotated table is acked with it.
    TestRow other = keyed(2, "other");
    Row second = other.row();
    second.table = 1;
    d.offer(second, 5020);
    ack(d, 2, 5030);
    ASSERT_EQ(d.acked().size(), 2u);
    EXPECT_EQ(d.acked()[1].table, 1);
}

// ---- no Kafka (issue 27, item 7) ---------------------------------------------------------

// Kafka topics to NoKafka, the rest to `http`: the relay's router while eventbox.brokers is empty.
class HttpOnly : public Sink {
  public:
    explicit HttpOnly(FakeSink& http) : http_(http) {}
    Produced produce(const Row& row, std::string& error) override {
        if (row.topic == "hooks") return http_.produce(row, error);
        return kafka_.produce(row, error);
    }

  private:
    FakeSink& http_;
    NoKafka kafka_;
};

TEST(Dispatcher, RowsNoSinkTakesAreForgottenUntouchedAndCounted) {
    FakeSink http;
    HttpOnly sink(http);
    Dispatcher d(sink, small_limits(), 1);
    std::map<int64_t, TestRow> outbox = {{1, keyed(1, "k")},
                                         {2, keyed(2, "k", "hooks")},
                                         {3, keyed(3, "k")},
                                         {4, keyed(4, "k", "other")}};
    for (auto& [id, row] : outbox) d.offer(row.row(), 0);
    EXPECT_EQ(http.produced, std::vector<int64_t>{2});
    // Neither attempts nor waits: the rows stay pending as they are, and take no room.
    EXPECT_TRUE(d.failed().empty());
    EXPECT_EQ(d.waiting(), 0u);
    EXPECT_EQ(d.in_flight(), 1u);
    EXPECT_FALSE(d.knows(1));
    EXPECT_EQ(d.next_due_ms(), std::numeric_limits<int64_t>::max());
    EXPECT_EQ(d.unrouted(), 3u);
    EXPECT_EQ(d.unrouted_topic(), "orders");
    d.forget_unrouted();
    EXPECT_EQ(d.unrouted(), 0u);
    EXPECT_EQ(d.unrouted_topic(), "");

    // Read again, they are offered again, and counted again.
    d.offer(outbox[3].row(), 10);
    EXPECT_EQ(d.unrouted(), 1u);
    EXPECT_EQ(http.produced, std::vector<int64_t>{2});
    ack(d, 2, 20);
    EXPECT_EQ(acked_ids(d), std::vector<int64_t>{2});
}

// ---- the settled position (docs/design/outbox-rotation.md) ------------------------------

static_assert(noexcept(std::declval<const Dispatcher&>().lowest_unsettled()));

TEST(Dispatcher, LowestUnsettledCoversEveryRowNotWrittenBack) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 1);
    EXPECT_EQ(d.lowest_unsettled(), std::numeric_limits<int64_t>::max());
    TestRow a = keyed(5, "a"), b = keyed(6, "a"), c = keyed(7, "c");
    d.offer(a.row(), 0);
    d.offer(b.row(), 0);  // waits behind 5 in its lane
    d.offer(c.row(), 0);
    EXPECT_EQ(d.lowest_unsettled(), 5);
    // Acked: still unsettled until the outcome is written and forgotten.
    ack(d, 5, 10);
    EXPECT_EQ(d.lowest_unsettled(), 5);
    d.clear_outcomes(1, 0);
    EXPECT_EQ(d.lowest_unsettled(), 6) << "6 is in flight now, 7 too";
    // A failed attempt waits for its retry: unsettled until its held copy is written.
    fail(d, 6, 20);
    ack(d, 7, 20);
    EXPECT_EQ(d.lowest_unsettled(), 6);
    d.clear_outcomes(1, d.failed().size());
    EXPECT_TRUE(d.is_held(6));
    EXPECT_EQ(d.lowest_unsettled(), std::numeric_limits<int64_t>::max())
        << "6 waits for its retry in outbox_held: its rotated copy is settled";
}

TEST(Dispatcher, HeldRowsDoNotHoldTheSettledPosition) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 1);
    TestRow a = keyed(5, "a"), b = keyed(9, "a"), c = keyed(12, "c");
    Row held = a.row();
    held.held = true;  // read from outbox_held
    d.offer(held, 0);
    d.offer(b.row(), 0);  // in flight behind 5 in its lane: not held, unsettled
    d.offer(c.row(), 0);
    EXPECT_EQ(sink.produced, (std::vector<int64_t>{5, 9, 12}));
    EXPECT_EQ(d.lowest_unsettled(), 9);
    // Acknowledged: gone, and forgotten as held once written.
    ack(d, 5, 10);
    d.clear_outcomes(1, 0);
    EXPECT_FALSE(d.is_held(5));
    EXPECT_EQ(d.lowest_unsettled(), 9);
}

TEST(Dispatcher, RowsTrackedTooLongAreHeld) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 1);
    TestRow a = keyed(5, "a"), b = keyed(6, "a"), c = keyed(7, "c");
    d.offer(a.row(), 0);  // in flight
    d.offer(b.row(), 0);  // in flight behind 5
    EXPECT_EQ(d.hold_stale(), 0u) << "first seen: not held yet";
    d.offer(c.row(), 0);  // arrives after the first tick
    EXPECT_EQ(d.hold_stale(), 2u) << "5 and 6 were tracked at the previous tick";
    EXPECT_EQ(d.to_hold(), (std::vector<int64_t>{5, 6}));
    EXPECT_EQ(d.hold_stale(), 1u) << "7 now too; 5 and 6 are queued once";
    EXPECT_EQ(d.to_hold(), (std::vector<int64_t>{5, 6, 7}));
    // Until the hold is written they hold the settled position.
    EXPECT_EQ(d.lowest_unsettled(), 5);
    d.clear_outcomes(0, 0, 2);
    EXPECT_TRUE(d.is_held(5));
    EXPECT_TRUE(d.is_held(6));
    EXPECT_EQ(d.lowest_unsettled(), 7);
    d.clear_outcomes(0, 0, 1);
    EXPECT_EQ(d.lowest_unsettled(), std::numeric_limits<int64_t>::max());
    EXPECT_EQ(d.hold_stale(), 0u) << "held rows are not held again";
    // Held, they go on as before: 6 fails and waits for its retry, then goes out again.
    ack(d, 5, 10);
    fail(d, 6, 10);
    d.clear_outcomes(1, 1);
    EXPECT_FALSE(d.is_held(5)) << "acknowledged: forgotten";
    EXPECT_TRUE(d.is_held(6));
    EXPECT_EQ(d.lowest_unsettled(), std::numeric_limits<int64_t>::max());
    EXPECT_EQ(refetch(d, {{6, b}}, 10000), std::vector<int64_t>{6});
    EXPECT_EQ(sink.produced, (std::vector<int64_t>{5, 6, 7, 6}));
}

TEST(Dispatcher, RowsNoSinkTakesStayUnsettled) {
    FakeSink http;
    HttpOnly sink(http);
    Dispatcher d(sink, small_limits(), 1);
    TestRow kafka_row = keyed(3, "k"), hook = keyed(4, "k", "hooks");
    d.offer(kafka_row.row(), 0);
    d.offer(hook.row(), 0);
    ack(d, 4, 10);
    d.clear_outcomes(1, 0);
    d.forget_unrouted();
    EXPECT_EQ(d.lowest_unsettled(), 3) << "read while Kafka is not configured: not settled";
    EXPECT_EQ(d.to_hold(), std::vector<int64_t>{3});
    d.clear_outcomes(0, 0, 1);
    EXPECT_EQ(d.lowest_unsettled(), std::numeric_limits<int64_t>::max())
        << "held: it is read again from outbox_held after a reset";
    // Read again from outbox_held, still no sink: not held a second time.
    Row again = kafka_row.row();
    again.held = true;
    d.offer(again, 20);
    EXPECT_TRUE(d.to_hold().empty());
    EXPECT_EQ(d.lowest_unsettled(), std::numeric_limits<int64_t>::max());
}

}  // namespace
}  // namespace eventbox::relay
