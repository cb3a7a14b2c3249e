// The relay's writes (see outbox/relay_worker.hpp): acknowledged rows deleted (or marked sent
// under eventbox.outbox_retention), failed attempts recorded with their retry time (or the row
// given up), and the purge of sent and failed rows past their retention.
#include "outbox/relay_worker.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
}

#include <algorithm>

#include "metrics/counters.hpp"
#include "pg/guc.hpp"
#include "pg/shmem.hpp"
#include "workers/common.hpp"

namespace eventbox::relay_worker {

namespace {

SPIPlanPtr delete_plan, tid_delete_plan, sent_plan, failed_plan, purge_plan, purge_failed_plan;

metrics::LocalHistogram* latency = nullptr;  // publish latencies of the outcomes being written
// Rows the outcomes written in the current transaction took out of 'pending' (sent, deleted,
// given up), for metrics::outbox_settled() once it committed.
uint64 settled_in_transaction = 0;
TimestampTz last_purge = 0;  // last retention purge

// End-to-end latencies (inbox received_at -> ack) of the outcomes being written, per cause
// subscription, in TopMemoryContext; added to the metrics once their transaction committed.
struct E2eTally {
    uint32 subscription;  // relay::Acked::cause_subscription
    char name[NAMEDATALEN];
    metrics::LocalHistogram histogram;
};
E2eTally* e2e = nullptr;
int e2e_used = 0, e2e_size = 0;

// The tally of `subscription`, added on first use.
E2eTally& e2e_tally(uint32 subscription) {
    for (int i = e2e_used - 1; i >= 0; --i)
        if (e2e[i].subscription == subscription) return e2e[i];
    if (e2e_used == e2e_size) {
        e2e_size = Max(8, e2e_size * 2);
        e2e = static_cast<E2eTally*>(
            e2e == nullptr ? MemoryContextAlloc(TopMemoryContext, sizeof(E2eTally) * e2e_size)
                           : repalloc(e2e, sizeof(E2eTally) * e2e_size));
    }
    E2eTally& t = e2e[e2e_used++];
    t.subscription = subscription;
    strlcpy(t.name, dispatcher.subscription_name(subscription), NAMEDATALEN);
    t.histogram.clear();
    return t;
}

SPIPlanPtr prepare(const char* sql, int nargs, Oid* types) {
    return worker::prepare_kept(kWho, sql, nargs, types);
}

}  // namespace

void init_write_state() {
    latency = static_cast<metrics::LocalHistogram*>(
        MemoryContextAllocZero(TopMemoryContext, sizeof(metrics::LocalHistogram)));
}

void prepare_write_plans() {
    if (tid_delete_plan != nullptr) return;
    // Acknowledged rows are deleted where they were read (a TID scan: no index descent per
    // row); the ids deleted are checked by the caller.
    Oid tids_type[1] = {TIDARRAYOID};
    tid_delete_plan =
        prepare("DELETE FROM eventbox.outbox WHERE ctid = ANY ($1) RETURNING id", 1, tids_type);
    // What was not found there is deleted by ranges of consecutive acked ids.
    Oid range_pair_types[2] = {INT8ARRAYOID, INT8ARRAYOID};
    delete_plan = prepare(
        "DELETE FROM eventbox.outbox o USING unnest($1::int8[], $2::int8[]) AS r(lo, hi) "
        "WHERE o.id BETWEEN r.lo AND r.hi",
        2, range_pair_types);
    Oid sent_types[3] = {INT8ARRAYOID, INT4ARRAYOID, INT8ARRAYOID};
    // HTTP deliveries report partition and offset -1: no Kafka position.
    sent_plan = prepare(
        "UPDATE eventbox.outbox o SET status = 'sent', sent_at = now(), attempts = o.attempts + 1, "
        "kafka_partition = nullif(u.p, -1), kafka_offset = nullif(u.o, -1), "
        "next_attempt_at = NULL, last_error = NULL "
        "FROM unnest($1::int8[], $2::int4[], $3::int8[]) AS u(id, p, o) "
        "WHERE o.id = ANY ($1) AND o.id = u.id",
        3, sent_types);
    Oid failed_types[4] = {INT8ARRAYOID, TEXTARRAYOID, INT8ARRAYOID, BOOLARRAYOID};
    failed_plan = prepare(
        "UPDATE eventbox.outbox o SET attempts = o.attempts + 1, last_error = u.err, "
        "next_attempt_at = now() + u.delay * interval '1 millisecond', "
        "status = CASE WHEN u.give_up THEN 'failed' ELSE o.status END "
        "FROM unnest($1::int8[], $2::text[], $3::int8[], $4::bool[]) AS u(id, err, delay, give_up) "
        "WHERE o.id = ANY ($1) AND o.id = u.id AND o.status = 'pending'",
        4, failed_types);
    // The ids to purge are an array, not an IN (subquery): a semi-join on id would let the
    // planner drive it with a whole scan of outbox_pkey (useful for merging), which it picks
    // when it planned on an empty outbox, and which then walks every dead row of a drained
    // backlog. `id = ANY (array)` can only be an index condition (the ordered subquery can only
    // read its partial index: sorts are off).
    Oid purge_types[2] = {INT4OID, INT4OID};
    purge_plan = prepare(
        "DELETE FROM eventbox.outbox WHERE id = ANY (ARRAY(SELECT id FROM eventbox.outbox "
        "WHERE status = 'sent' AND sent_at < now() - $1 * interval '1 second' "
        "ORDER BY sent_at LIMIT $2))",
        2, purge_types);
    // eventbox.dead_retention: failed rows (the relay gave up on them) by age.
    purge_failed_plan = prepare(
        "DELETE FROM eventbox.outbox WHERE id = ANY (ARRAY(SELECT id FROM eventbox.outbox "
        "WHERE status = 'failed' AND created_at < now() - $1 * interval '1 second' "
        "ORDER BY created_at LIMIT $2))",
        2, purge_types);
}

namespace {

// Deletes the rows of the sorted ids by ranges of consecutive ids (every id of a range
// acknowledged); returns how many it deleted.
uint64 delete_id_ranges(const int64* ids, int n) {
    if (n == 0) return 0;
    int64* los = static_cast<int64*>(palloc(sizeof(int64) * n));
    int64* his = static_cast<int64*>(palloc(sizeof(int64) * n));
    int runs = 0;
    for (int i = 0; i < n; ++i) {
        if (runs > 0 && ids[i] <= his[runs - 1] + 1) {
            his[runs - 1] = Max(his[runs - 1], ids[i]);
        } else {
            los[runs] = his[runs] = ids[i];
            ++runs;
        }
    }
    Datum values[2] = {PointerGetDatum(int8_array(los, runs)),
                       PointerGetDatum(int8_array(his, runs))};
    exec(delete_plan, values, false, SPI_OK_DELETE);
    return SPI_processed;
}

struct AckedRow {
    int64 id;
    uint64 tid;
};

// Deletes acknowledged rows at the tids they were read from (rows sorted by id), in a
// subtransaction; sets done[i] for each row deleted and returns their count. The acks of a
// pass come from many partitions: their ids are rarely consecutive (about two per range over
// 32 partitions), and a delete by id ranges descended the index and restarted a bitmap heap
// scan per range. A row updated since it was read (a failed attempt is written as a new
// version) is not found at its tid and is left to the caller. A tid that holds another row
// now (the row was deleted by someone else, its space vacuumed and reused) would delete that
// row: then the subtransaction is rolled back and every row is left to the caller.
uint64 delete_at_tids(const AckedRow* rows, int n, bool* done) {
    auto* tids = static_cast<ItemPointerData*>(palloc(sizeof(ItemPointerData) * n));
    Datum* datums = static_cast<Datum*>(palloc(sizeof(Datum) * n));
    int k = 0;
    for (int i = 0; i < n; ++i) {
        if (rows[i].tid == 0) continue;
        ItemPointerSet(&tids[k], static_cast<BlockNumber>(rows[i].tid >> 16),
                       static_cast<OffsetNumber>(rows[i].tid & 0xffff));
        datums[k] = PointerGetDatum(&tids[k]);
        ++k;
    }
    if (k == 0) return 0;
    Datum values[1] = {PointerGetDatum(
        construct_array(datums, k, TIDOID, sizeof(ItemPointerData), false, TYPALIGN_SHORT))};
    volatile uint64 deleted = 0;
    worker::Subtransaction sub = worker::begin_subtransaction();
    PG_TRY();
    {
        worker::exec_kept("eventbox relay", tid_delete_plan, values, false, SPI_OK_DELETE_RETURNING,
                          worker::Access::kTid);
        uint64 found = 0;
        bool foreign = false;
        for (uint64 r = 0; r < SPI_processed && !foreign; ++r) {
            bool isnull;
            int64 id = DatumGetInt64(
                SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1, &isnull));
            const AckedRow* hit = std::lower_bound(
                rows, rows + n, id, [](const AckedRow& a, int64 v) { return a.id < v; });
            if (hit == rows + n || hit->id != id || done[hit - rows]) {
                foreign = true;
            } else {
                done[hit - rows] = true;
                ++found;
            }
        }
        worker::end_subtransaction(sub, !foreign);
        if (foreign) {
            memset(done, 0, sizeof(bool) * n);
            ereport(LOG, (errmsg("eventbox relay: a row read for delivery was replaced at its "
                                 "place in the table; the acknowledged rows are deleted by id")));
        } else {
            deleted = found;
        }
    }
    PG_CATCH();
    { ReThrowError(worker::abort_subtransaction(sub)); }
    PG_END_TRY();
    return deleted;
}

// Deletes the acknowledged rows (eventbox.outbox_retention 0): at their tids, the rest by id.
uint64 delete_acked(const relay::Acked* acked, int n) {
    auto* rows = static_cast<AckedRow*>(palloc(sizeof(AckedRow) * n));
    for (int i = 0; i < n; ++i) rows[i] = AckedRow{acked[i].id, acked[i].tid};
    std::sort(rows, rows + n, [](const AckedRow& a, const AckedRow& b) { return a.id < b.id; });
    bool* done = static_cast<bool*>(palloc0(sizeof(bool) * n));
    uint64 deleted = delete_at_tids(rows, n, done);
    int64* rest = static_cast<int64*>(palloc(sizeof(int64) * n));
    int m = 0;
    for (int i = 0; i < n; ++i)
        if (!done[i]) rest[m++] = rows[i].id;
    return deleted + delete_id_ranges(rest, m);
}

// Acknowledged rows: deleted, or marked sent when eventbox.outbox_retention keeps them.
void write_acked() {
    const std::vector<relay::Acked>& acked = dispatcher.acked();
    int n = static_cast<int>(acked.size());
    if (n == 0) return;
    // Delivery reports were taken just before this pass: "now" is when the acks arrived.
    int64 now = worker::now_ms();
    latency->clear();
    e2e_used = 0;
    E2eTally* last = nullptr;
    for (int i = 0; i < n; ++i) {
        const relay::Acked& a = acked[i];
        if (a.created_ms != 0) latency->observe_us((now - a.created_ms) * 1000);
        if (a.cause_subscription == 0) continue;
        if (last == nullptr || last->subscription != a.cause_subscription)
            last = &e2e_tally(a.cause_subscription);
        last->histogram.observe_us((now - a.cause_received_ms) * 1000);
    }
    if (guc::outbox_retention_s == 0) {
        settled_in_transaction += delete_acked(acked.data(), n);
        return;
    }
    int64* ids = static_cast<int64*>(palloc(sizeof(int64) * n));
    Datum* partitions = static_cast<Datum*>(palloc(sizeof(Datum) * n));
    int64* offsets = static_cast<int64*>(palloc(sizeof(int64) * n));
    for (int i = 0; i < n; ++i) {
        ids[i] = acked[i].id;
        partitions[i] = Int32GetDatum(acked[i].partition);
        offsets[i] = acked[i].offset;
    }
    Datum values[3] = {
        PointerGetDatum(int8_array(ids, n)),
        PointerGetDatum(construct_array(partitions, n, INT4OID, 4, true, TYPALIGN_INT)),
        PointerGetDatum(int8_array(offsets, n))};
    exec(sent_plan, values, false, SPI_OK_UPDATE);
    settled_in_transaction += SPI_processed;
}

// Failed attempts: attempts + 1, the error and the retry time, or 'failed' when given up.
void write_failed() {
    const std::vector<relay::Failed>& failed = dispatcher.failed();
    int m = static_cast<int>(failed.size());
    if (m == 0) return;
    int64* ids = static_cast<int64*>(palloc(sizeof(int64) * m));
    Datum* errors = static_cast<Datum*>(palloc(sizeof(Datum) * m));
    int64* delays = static_cast<int64*>(palloc(sizeof(int64) * m));
    Datum* give_up = static_cast<Datum*>(palloc(sizeof(Datum) * m));
    for (int i = 0; i < m; ++i) {
        ids[i] = failed[i].id;
        errors[i] = CStringGetTextDatum(failed[i].error.c_str());
        delays[i] = failed[i].retry_in_ms;
        give_up[i] = BoolGetDatum(failed[i].give_up);
        settled_in_transaction += failed[i].give_up ? 1 : 0;
    }
    Datum values[4] = {
        PointerGetDatum(int8_array(ids, m)),
        PointerGetDatum(construct_array(errors, m, TEXTOID, -1, false, TYPALIGN_INT)),
        PointerGetDatum(int8_array(delays, m)),
        PointerGetDatum(construct_array(give_up, m, BOOLOID, 1, true, TYPALIGN_CHAR))};
    exec(failed_plan, values, false, SPI_OK_UPDATE);
    ereport(LOG, (errmsg("eventbox relay: %d message(s) failed delivery; first: %s", m,
                         failed[0].error.c_str())));
}

}  // namespace

void write_outcomes() {
    settled_in_transaction = 0;
    write_acked();
    write_failed();
}

void settle_outcomes(std::size_t acked, std::size_t failed) {
    dispatcher.clear_outcomes(acked, failed);
    shmem::count_messages(acked);
    if (acked > 0) metrics::relay_published(acked, *latency);
    for (int i = 0; i < e2e_used; ++i) metrics::e2e_observed(e2e[i].name, e2e[i].histogram);
    e2e_used = 0;
    if (failed > 0) metrics::relay_failures(failed);
    metrics::outbox_settled(settled_in_transaction);
}

bool purge_outbox(TimestampTz now) {
    // Sent rows past eventbox.outbox_retention, also when it is 0: rows kept under an earlier
    // setting would stay forever otherwise (the probe of the empty partial index costs nothing).
    // Failed rows past eventbox.dead_retention, when set.
    if (!TimestampDifferenceExceeds(last_purge, now, 1000)) return false;
    Datum values[2] = {Int32GetDatum(guc::outbox_retention_s),
                       Int32GetDatum(guc::relay_batch_size)};
    PushActiveSnapshot(GetTransactionSnapshot());
    exec(purge_plan, values, false, SPI_OK_DELETE);
    uint64 purged = SPI_processed;
    bool full = purged == static_cast<uint64>(guc::relay_batch_size);
    if (guc::dead_retention_s > 0) {
        values[0] = Int32GetDatum(guc::dead_retention_s);
        exec(purge_failed_plan, values, false, SPI_OK_DELETE);
        purged += SPI_processed;
        full = full || SPI_processed == static_cast<uint64>(guc::relay_batch_size);
    }
    PopActiveSnapshot();
    metrics::purged(metrics::PurgedTable::kOutbox, purged);
    if (!full) last_purge = now;
    return full;
}

}  // namespace eventbox::relay_worker
