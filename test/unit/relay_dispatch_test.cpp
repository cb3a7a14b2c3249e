// The relay's dispatcher (src/outbox/relay_dispatch.cpp), driven through a fake Sink.
#include "outbox/relay_dispatch.hpp"
#include "relay_dispatch_fake.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace eventbox::relay {
namespace {

// The relay's PostgreSQL side calls these without a guard (outbox/relay_worker.hpp): they must
// not throw.
static_assert(noexcept(std::declval<const Dispatcher&>().acked()));
static_assert(noexcept(std::declval<const Dispatcher&>().failed()));
static_assert(noexcept(std::declval<const Dispatcher&>().capacity()));
static_assert(noexcept(std::declval<const Dispatcher&>().next_due_ms()));
static_assert(noexcept(std::declval<const Dispatcher&>().subscription_name(0)));

// ---- basics -------------------------------------------------------------------------------

TEST(Dispatcher, ProducesAndReportsAcks) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 1);
    TestRow a = keyed(1, "k");
    d.offer(a.row(), 0);
    EXPECT_EQ(sink.produced, std::vector<int64_t>{1});
    EXPECT_EQ(sink.payloads, std::vector<std::string>{"payload-1"});
    EXPECT_EQ(d.in_flight(), 1u);
    EXPECT_TRUE(d.knows(1));
    d.on_delivery(1, 0, false, true, 3, 42, "", 5);
    ASSERT_EQ(d.acked().size(), 1u);
    EXPECT_EQ(d.acked()[0].id, 1);
    EXPECT_EQ(d.acked()[0].partition, 3);
    EXPECT_EQ(d.acked()[0].offset, 42);
    EXPECT_TRUE(d.failed().empty());
    EXPECT_EQ(d.in_flight(), 0u);
    EXPECT_FALSE(d.knows(1));
    d.clear_outcomes(d.acked().size(), d.failed().size());
    EXPECT_TRUE(d.acked().empty());
    EXPECT_EQ(d.next_due_ms(), std::numeric_limits<int64_t>::max());
}

// A handler's send carries its cause to the ack, through retries; other rows carry none.
TEST(Dispatcher, AcksCarryTheCauseOfHandlersSends) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 1);
    TestRow plain = keyed(1, "a"), first = keyed(2, "b"), second = keyed(3, "c"),
            other = keyed(4, "d");
    std::string billing = "billing", shipping = "shipping", billing_again = "billing";
    Row r2 = first.row(), r3 = second.row(), r4 = other.row();
    r2.cause_subscription = billing;
    r2.cause_received_ms = 1000;
    r3.cause_subscription = shipping;
    r3.cause_received_ms = 2000;
    r4.cause_subscription = billing_again;
    r4.cause_received_ms = 3000;
    d.offer(plain.row(), 0);
    d.offer(r2, 0);
    d.offer(r3, 0);
    billing = shipping = "overwritten";  // the dispatcher keeps its own copy of the names
    fail(d, 3, 10);                      // retried: read again from the outbox below
    d.offer(r4, 0);
    ack(d, 1, 20);
    ack(d, 2, 20);
    ack(d, 4, 20);
    std::map<int64_t, TestRow> rows{{3, second}};
    std::vector<int64_t> due = refetch(d, rows, 10000);
    ASSERT_EQ(due, std::vector<int64_t>{3});
    ack(d, 3, 10001);
    ASSERT_EQ(acked_ids(d), (std::vector<int64_t>{1, 2, 4, 3}));
    const std::vector<Acked>& a = d.acked();
    EXPECT_EQ(a[0].cause_subscription, 0u);
    EXPECT_EQ(a[0].cause_received_ms, 0);
    EXPECT_EQ(d.subscription_name(a[0].cause_subscription), "");
    EXPECT_EQ(d.subscription_name(a[1].cause_subscription), "billing");
    EXPECT_EQ(a[1].cause_received_ms, 1000);
    EXPECT_EQ(d.subscription_name(a[2].cause_subscription), "billing");
    EXPECT_EQ(a[2].cause_subscription, a[1].cause_subscription);
    EXPECT_EQ(a[2].cause_received_ms, 3000);
    // The refetched row is offered as the outbox has it: TestRow carries no cause.
    EXPECT_EQ(a[3].cause_subscription, 0u);
    EXPECT_EQ(d.subscription_name(12345), "");
}

// A refetched row brings its cause again from the outbox.
TEST(Dispatcher, RefetchedRowsCarryTheirCause) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 1);
    TestRow t = keyed(1, "k");
    Row r = t.row();
    r.cause_subscription = "orders_sub";
    r.cause_received_ms = 500;
    d.offer(r, 0);
    fail(d, 1, 10);
    std::vector<int64_t> due = d.due_ids(10000, 10);
    ASSERT_EQ(due, std::vector<int64_t>{1});
    d.offer(r, 10000);
    d.refetch_done();
    ack(d, 1, 10001);
    ASSERT_EQ(d.acked().size(), 1u);
    EXPECT_EQ(d.subscription_name(d.acked()[0].cause_subscription), "orders_sub");
    EXPECT_EQ(d.acked()[0].cause_received_ms, 500);
}

TEST(Dispatcher, TombstonesAreProducedWithNullPayload) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 1);
    TestRow t = keyed(1, "k");
    Row r = t.row();
    r.payload = nullptr;
    r.payload_len = 0;
    d.offer(r, 0);
    EXPECT_EQ(sink.payloads, std::vector<std::string>{"<null>"});
}

TEST(Dispatcher, OfferingAKnownRowAgainIsIgnored) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 1);
    TestRow a = keyed(1, "k");
    d.offer(a.row(), 0);
    d.offer(a.row(), 0);  // e.g. the sweep read it again while in flight
    EXPECT_EQ(sink.produced, std::vector<int64_t>{1});
    fail(d, 1, 10);
    d.offer(a.row(), 20);  // read again while waiting for its retry
    EXPECT_EQ(sink.produced, std::vector<int64_t>{1});
    EXPECT_EQ(d.waiting(), 1u);
}

TEST(Dispatcher, UnknownDeliveryReportsAreIgnored) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 1);
    d.on_delivery(99, 0, false, true, 0, 0, "", 0);
    fail(d, 98, 0);
    EXPECT_TRUE(d.acked().empty());
    EXPECT_TRUE(d.failed().empty());
    EXPECT_EQ(d.waiting(), 0u);
}

TEST(Dispatcher, RowsOfDifferentKeysGoOutTogether) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 1);
    TestRow a = keyed(1, "a"), b = keyed(2, "b"), c = keyed(3, "c");
    d.offer(a.row(), 0);
    d.offer(b.row(), 0);
    d.offer(c.row(), 0);
    EXPECT_EQ(sink.produced, (std::vector<int64_t>{1, 2, 3}));
    EXPECT_EQ(d.in_flight(), 3u);
}

// ---- per-key order ------------------------------------------------------------------------

// A fails; B (same key) is claimed after that: B waits until A was re-offered and acked.
TEST(Dispatcher, SameKeyRowWaitsBehindAFailedRowUntilItIsAcked) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 7);
    std::map<int64_t, TestRow> outbox = {{1, keyed(1, "k")}, {2, keyed(2, "k")}};

    d.offer(outbox[1].row(), 0);
    fail(d, 1, 10);
    ASSERT_EQ(d.failed().size(), 1u);
    const Failed& f = d.failed()[0];
    EXPECT_EQ(f.id, 1);
    EXPECT_FALSE(f.give_up);
    EXPECT_GE(f.retry_in_ms, 50);
    EXPECT_LE(f.retry_in_ms, 100);
    int64_t retry_at = 10 + f.retry_in_ms;
    outbox[1].attempts = 1;  // what the relay writes back

    d.offer(outbox[2].row(), 20);  // B is claimed now
    EXPECT_EQ(sink.produced, std::vector<int64_t>{1}) << "B must not overtake A";
    EXPECT_EQ(d.waiting(), 2u);

    // Before A is due nothing is asked for: B is not the head of its lane.
    EXPECT_TRUE(refetch(d, outbox, retry_at - 1).empty());
    EXPECT_EQ(d.next_due_ms(), retry_at);

    // A is due: re-offered and produced; B still waits while A is in flight.
    EXPECT_EQ(refetch(d, outbox, retry_at), std::vector<int64_t>{1});
    EXPECT_EQ(sink.produced, (std::vector<int64_t>{1, 1}));
    EXPECT_TRUE(refetch(d, outbox, retry_at + 100000).empty());
    EXPECT_EQ(sink.produced, (std::vector<int64_t>{1, 1}));

    // A acked: now B goes.
    ack(d, 1, retry_at + 5);
    EXPECT_EQ(refetch(d, outbox, retry_at + 5), std::vector<int64_t>{2});
    EXPECT_EQ(sink.produced, (std::vector<int64_t>{1, 1, 2}));
    ack(d, 2, retry_at + 6);
    EXPECT_EQ(acked_ids(d), (std::vector<int64_t>{1, 2}));
    EXPECT_EQ(d.waiting(), 0u);
    EXPECT_EQ(d.in_flight(), 0u);
}

TEST(Dispatcher, ManyRowsOfOneKeyStayInOrderThroughRepeatedFailures) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 3);
    std::map<int64_t, TestRow> outbox;
    for (int64_t id = 1; id <= 3; ++id) outbox[id] = keyed(id, "k");
    d.offer(outbox[1].row(), 0);
    fail(d, 1, 0);
    d.offer(outbox[2].row(), 0);
    d.offer(outbox[3].row(), 0);
    int64_t now = 0;
    // A fails twice more before it gets through.
    for (int round = 0; round < 2; ++round) {
        now += 10000;
        ASSERT_EQ(refetch(d, outbox, now), std::vector<int64_t>{1});
        fail(d, 1, now);
    }
    now += 10000;
    ASSERT_EQ(refetch(d, outbox, now), std::vector<int64_t>{1});
    ack(d, 1, now);
    ASSERT_EQ(refetch(d, outbox, now), std::vector<int64_t>{2});
    ack(d, 2, now);
    ASSERT_EQ(refetch(d, outbox, now), std::vector<int64_t>{3});
    ack(d, 3, now);
    EXPECT_EQ(sink.produced, (std::vector<int64_t>{1, 1, 1, 1, 2, 3}));
    EXPECT_EQ(acked_ids(d), (std::vector<int64_t>{1, 2, 3}));
}

// The outcome that matters: the broker gets the rows of one key in id order. Here A and B of
// one key are both claimed at once; the broker times A out (as librdkafka's idempotent producer
// may do for one message while the next one still succeeds: see "Message timeout
// considerations" in librdkafka's INTRODUCTION.md) and accepts everything else. The simulated
// partition acknowledges in the order it received the messages.
// A row that failed while later rows of its key were already in flight cannot be put back in
// front of them by the dispatcher: the relay prevents that case instead by never letting
// librdkafka time messages out (eventbox.relay_message_timeout = 0, see kafka_producer_test).
// What the dispatcher guarantees is that nothing it still holds overtakes the failed row.
TEST(Dispatcher, RowsOfAKeyOfferedAfterAFailureWaitBehindTheRetriedRow) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 11);
    std::map<int64_t, TestRow> outbox = {
        {1, keyed(1, "k")}, {2, keyed(2, "k")}, {3, keyed(3, "k")}};
    d.offer(outbox[1].row(), 0);
    fail(d, 1, 10);
    d.offer(outbox[2].row(), 20);
    d.offer(outbox[3].row(), 30);
    EXPECT_EQ(sink.produced, (std::vector<int64_t>{1})) << "2 and 3 must wait behind 1";
    for (int64_t now = 1000; now < 100000 && sink.produced.size() < 2; now += 1000)
        refetch(d, outbox, now);
    ASSERT_EQ(sink.produced, (std::vector<int64_t>{1, 1}));
    ack(d, 1, 200000);
    refetch(d, outbox, 200001);  // the lane's next row, and only that one
    EXPECT_EQ(sink.produced, (std::vector<int64_t>{1, 1, 2}));
    ack(d, 2, 200002);
    refetch(d, outbox, 200003);
    EXPECT_EQ(sink.produced, (std::vector<int64_t>{1, 1, 2, 3}));
}

TEST(Dispatcher, SameKeyInAnotherTopicIsAnotherLane) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 1);
    TestRow a = keyed(1, "k", "orders"), b = keyed(2, "k", "invoices");
    d.offer(a.row(), 0);
    fail(d, 1, 0);
    d.offer(b.row(), 0);
    EXPECT_EQ(sink.produced, (std::vector<int64_t>{1, 2}));
}

TEST(Dispatcher, EmptyKeyIsAKeyNotTheAbsenceOfOne) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 1);
    TestRow a = keyed(1, ""), b = keyed(2, "");
    d.offer(a.row(), 0);
    fail(d, 1, 0);
    d.offer(b.row(), 0);
    EXPECT_EQ(sink.produced, std::vector<int64_t>{1}) << "rows with an empty key share a lane";
}

TEST(Dispatcher, KeysAreComparedAsBytes) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 1);
    TestRow a = keyed(1, std::string("a\0b", 3)), b = keyed(2, std::string("a\0c", 3));
    d.offer(a.row(), 0);
    fail(d, 1, 0);
    d.offer(b.row(), 0);
    EXPECT_EQ(sink.produced, (std::vector<int64_t>{1, 2}));
}

TEST(Dispatcher, KeylessRowsDoNotBlockEachOther) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 1);
    TestRow x = keyless(1), y = keyless(2), z = keyless(3);
    d.offer(x.row(), 0);
    fail(d, 1, 0);
    d.offer(y.row(), 1);
    d.offer(z.row(), 1);
    EXPECT_EQ(sink.produced, (std::vector<int64_t>{1, 2, 3}));
    ack(d, 2, 2);
    ack(d, 3, 2);
    EXPECT_EQ(d.waiting(), 1u);
}

// ---- failures -----------------------------------------------------------------------------

TEST(Dispatcher, PermanentErrorsGiveUpAfterMaxAttempts) {
    FakeSink sink;
    Limits limits = small_limits();
    limits.max_attempts = 3;
    Dispatcher d(sink, limits, 1);
    std::map<int64_t, TestRow> outbox = {{1, keyed(1, "k")}, {2, keyed(2, "k")}};
    d.offer(outbox[1].row(), 0);
    d.offer(outbox[2].row(), 0);  // in flight behind A
    ack(d, 2, 0);
    d.clear_outcomes(d.acked().size(), d.failed().size());
    int64_t now = 0;
    for (int32_t attempt = 1; attempt <= 3; ++attempt) {
        fail(d, 1, now, kErrTooLarge, true);
        ASSERT_EQ(d.failed().size(), 1u) << attempt;
        const Failed& f = d.failed()[0];
        EXPECT_EQ(f.id, 1);
        EXPECT_EQ(f.error, "Local: Message timed out");
        if (attempt < 3) {
            EXPECT_FALSE(f.give_up) << attempt;
            EXPECT_GT(f.retry_in_ms, 0);
            EXPECT_TRUE(d.knows(1));
            d.clear_outcomes(d.acked().size(), d.failed().size());
            outbox[1].attempts = attempt;  // the relay stored attempts + 1
            now += 100000;
            ASSERT_EQ(refetch(d, outbox, now), std::vector<int64_t>{1});
        } else {
            EXPECT_TRUE(f.give_up);
            EXPECT_EQ(f.retry_in_ms, 0);
        }
    }
    EXPECT_FALSE(d.knows(1));
    EXPECT_EQ(d.waiting(), 0u);
    EXPECT_EQ(d.in_flight(), 0u);
    EXPECT_EQ(sink.produced, (std::vector<int64_t>{1, 2, 1, 1}));
}

TEST(Dispatcher, GivingUpReleasesTheRowsHeldBehind) {
    FakeSink sink;
    Limits limits = small_limits();
    limits.max_attempts = 1;
    Dispatcher d(sink, limits, 1);
    std::map<int64_t, TestRow> outbox = {{1, keyed(1, "k")}, {2, keyed(2, "k")}};
    d.offer(outbox[1].row(), 0);
    fail(d, 1, 0, kErrTooLarge, false);  // transient first: A waits, B will queue behind
    d.offer(outbox[2].row(), 1);
    EXPECT_EQ(sink.produced, std::vector<int64_t>{1});
    ASSERT_EQ(refetch(d, outbox, 100000), std::vector<int64_t>{1});
    fail(d, 1, 100000, kErrTooLarge, true);  // permanent, max_attempts reached
    EXPECT_TRUE(d.failed().back().give_up);
    EXPECT_EQ(refetch(d, outbox, 100000), std::vector<int64_t>{2});
    EXPECT_EQ(sink.produced, (std::vector<int64_t>{1, 1, 2}));
}

TEST(Dispatcher, TransientErrorsNeverGiveUp) {
    FakeSink sink;
    Limits limits = small_limits();
    limits.max_attempts = 2;
    Dispatcher d(sink, limits, 1);
    TestRow a = keyed(1, "k");
    a.attempts = 1000;
    d.offer(a.row(), 0);
    fail(d, 1, 0, kErrTimedOut, false);
    ASSERT_EQ(d.failed().size(), 1u);
    EXPECT_FALSE(d.failed()[0].give_up);
    EXPECT_TRUE(d.knows(1));
    EXPECT_LE(d.failed()[0].retry_in_ms, limits.backoff_max_ms);
}

TEST(Dispatcher, MaxAttemptsCountsAttemptsStoredBeforeTheRowWasRead) {
    FakeSink sink;
    Limits limits = small_limits();
    limits.max_attempts = 5;
    Dispatcher d(sink, limits, 1);
    TestRow a = keyed(1, "k");
    a.attempts = 4;  // e.g. after a relay restart
    d.offer(a.row(), 0);
    fail(d, 1, 0, kErrTooLarge, true);
    ASSERT_EQ(d.failed().size(), 1u);
    EXPECT_TRUE(d.failed()[0].give_up);
}

TEST(Dispatcher, PurgesAreNotAttempts) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 1);
    std::map<int64_t, TestRow> outbox = {{1, keyed(1, "k")}, {2, keyed(2, "k")}};
    d.offer(outbox[1].row(), 0);
    d.offer(outbox[2].row(), 0);
    purge(d, 1, 5);
    purge(d, 2, 5);
    EXPECT_TRUE(d.failed().empty()) << "a purge writes nothing back";
    EXPECT_TRUE(d.acked().empty());
    EXPECT_EQ(d.waiting(), 2u);
    EXPECT_EQ(d.in_flight(), 0u);
    // Due at once, and in their order: A first, B after A was acked.
    EXPECT_EQ(d.next_due_ms(), 5);
    EXPECT_EQ(refetch(d, outbox, 5), std::vector<int64_t>{1});
    ack(d, 1, 6);
    EXPECT_EQ(refetch(d, outbox, 6), std::vector<int64_t>{2});
    ack(d, 2, 7);
    EXPECT_EQ(sink.produced, (std::vector<int64_t>{1, 2, 1, 2}));
    EXPECT_EQ(acked_ids(d), (std::vector<int64_t>{1, 2}));
}

TEST(Dispatcher, PurgedRowKeepsItsAttemptCountForGivingUp) {
    FakeSink sink;
    Limits limits = small_limits();
    limits.max_attempts = 2;
    Dispatcher d(sink, limits, 1);
    std::map<int64_t, TestRow> outbox = {{1, keyed(1, "k")}};
    outbox[1].attempts = 1;
    d.offer(outbox[1].row(), 0);
    for (int i = 0; i < 5; ++i) {
        purge(d, 1, i);
        ASSERT_EQ(refetch(d, outbox, i), std::vector<int64_t>{1});
    }
    EXPECT_TRUE(d.failed().empty());
    fail(d, 1, 10, kErrTooLarge, true);
    ASSERT_EQ(d.failed().size(), 1u);
    EXPECT_TRUE(d.failed()[0].give_up) << "attempts 1 + this one = max_attempts 2";
}

TEST(Dispatcher, SinkRefusalWaitsAndRetriesWithoutCounting) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 1);
    std::map<int64_t, TestRow> outbox = {{1, keyed(1, "k")}, {2, keyed(2, "k")}};
    sink.refuse.insert(1);
    d.offer(outbox[1].row(), 0);
    EXPECT_EQ(sink.calls, 1);
    EXPECT_TRUE(sink.produced.empty());
    EXPECT_EQ(d.in_flight(), 0u);
    EXPECT_EQ(d.waiting(), 1u);
    EXPECT_TRUE(d.failed().empty()) << "not enqueued is not a delivery attempt";
    EXPECT_TRUE(d.knows(1));
    int64_t due = d.next_due_ms();
    EXPECT_GE(due, 50);
    EXPECT_LE(due, 100);

    // A row of the same key does not overtake the refused one.
    d.offer(outbox[2].row(), 1);
    EXPECT_TRUE(sink.produced.empty());

    EXPECT_TRUE(refetch(d, outbox, due - 1).empty());
    sink.refuse.clear();
    EXPECT_EQ(refetch(d, outbox, due), std::vector<int64_t>{1});
    EXPECT_EQ(sink.produced, std::vector<int64_t>{1});
    ack(d, 1, due);
    EXPECT_EQ(refetch(d, outbox, due), std::vector<int64_t>{2});
    EXPECT_EQ(sink.produced, (std::vector<int64_t>{1, 2}));
}

TEST(Dispatcher, SinkRefusalOnRefetchWaitsAgain) {
    FakeSink sink;
    Dispatcher d(sink, small_limits(), 1);
    std::map<int64_t, TestRow> outbox = {{1, keyless(1)}};
    sink.refuse_all = true;
    d.offer(outbox[1].row(), 0);
    ASSERT_EQ(refetch(d, outbox, 1000), std::vector<int64_t>{1});
    EXPECT_EQ(sink.calls, 2);
    EXPECT_EQ(d.waiting(), 1u);
    EXPECT_GT(d.next_due_ms(), 1000);
    sink.refuse_all = false;
    ASSERT_EQ(refetch(d, outbox, 10000), std::vector<int64_t>{1});
    EXPECT_EQ(sink.produced, std::vector<int64_t>{1});
    EXPECT_EQ(d.waiting(), 0u);
}

}  // namespace
}  // namespace eventbox::relay
