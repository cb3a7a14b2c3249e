// The relay's writes (see outbox/relay_worker.hpp), in the rotated outbox of
// docs/design/outbox-rotation.md: acknowledged rows get one ack row per pass and rotated table
// (nothing is written per row), failed attempts are held (eventbox.outbox_held) with their retry
// time or given up, the settled position W moves past what is settled, and given-up held rows
// are purged after eventbox.dead_retention.
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

SPIPlanPtr ack_plan, ack_row_plans[kTables], failed_plan, hold_plan, position_plan,
    purge_failed_ids_plan, purge_failed_plan, purge_cancelled_plan;

metrics::LocalHistogram* latency = nullptr;  // publish latencies of the outcomes being written
// Rows the outcomes written in the current transaction took out of 'pending' (acknowledged,
// given up), for metrics::outbox_settled() once it committed.
uint64 settled_in_transaction = 0;
TimestampTz last_purge = 0;      // last retention purge
TimestampTz last_position = 0;   // last store_position() that computed W
bool position_deferred = false;  // a store_position() since then did not

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

// The CTEs that insert one ack row into each rotated table's outbox_acks_N from a CTE `g` of
// (n, max_id, ids, ps, os), grouped by table, with `acked_at` (an SQL expression) as their time.
char* acks_into(const char* acked_at) {
    constexpr const char* kInto =
        "a%d AS (INSERT INTO eventbox.outbox_acks_%d (acked_at, max_id, ids, partitions, offsets) "
        "SELECT %s, max_id, ids, ps, os FROM g WHERE n = %d RETURNING 1)";
    return psprintf("%s, %s, %s", psprintf(kInto, 0, 0, acked_at, 0),
                    psprintf(kInto, 1, 1, acked_at, 1), psprintf(kInto, 2, 2, acked_at, 2));
}

}  // namespace

void init_write_state() {
    latency = static_cast<metrics::LocalHistogram*>(
        MemoryContextAllocZero(TopMemoryContext, sizeof(metrics::LocalHistogram)));
}

void prepare_write_plans() {
    if (ack_plan != nullptr) return;
    // One ack row per rotated table the acknowledged ids are in (their ids, partitions and
    // offsets in id order; -1: no Kafka position), whatever eventbox.outbox_retention is: the
    // view tells an acknowledged row from one in flight by it. Held rows acknowledged leave
    // eventbox.outbox_held. Returns how many acknowledged ids were found. This statement serves
    // the passes that acknowledged a row read from outbox_held; the others, ack_row_plans.
    // A row read from a rotated table comes with its table ($1-$4, relay::Row::table): nothing
    // is looked up for it (probing the three primary keys for each id was more than half of the
    // relay's time in this statement, which was itself more than half of a pass). A row read
    // from outbox_held ($5-$7, apart, so that no scan filters out the others) is probed in the
    // rotated tables' primary keys (a nested loop over the unnested ids; a filter
    // "r.id = ANY ($5)" beside the join made the planner join every row with every id: 286 ms for
    // 2,000 ids against 3.7 ms). The same holds for the failed rows below.
    // The ids are grouped by table first: each table's insert then takes its one row of the
    // grouped result (a filter over the ungrouped ids threw away every other table's ids, three
    // times). outbox_held's primary key is probed for each id only when it holds a row at all.
    Oid ack_types[7] = {INT8ARRAYOID, INT4ARRAYOID, INT8ARRAYOID, INT2ARRAYOID,
                        INT8ARRAYOID, INT4ARRAYOID, INT8ARRAYOID};
    ack_plan = prepare(
        psprintf("WITH j AS MATERIALIZED (SELECT u.n::int4 AS n, u.id, u.p, u.o "
                 "FROM unnest($1::int8[], $2::int4[], $3::int8[], $4::int2[]) AS u(id, p, o, n) "
                 "UNION ALL SELECT r.n, u.id, u.p, u.o "
                 "FROM unnest($5::int8[], $6::int4[], $7::int8[]) AS u(id, p, o) "
                 "JOIN eventbox._outbox_rows r ON r.id = u.id), "
                 "g AS MATERIALIZED (SELECT n, max(id) AS max_id, "
                 "array_agg(id ORDER BY id) AS ids, array_agg(p ORDER BY id) AS ps, "
                 "array_agg(o ORDER BY id) AS os FROM j GROUP BY n), "
                 "%s, "
                 "h AS (DELETE FROM eventbox.outbox_held WHERE id = ANY ($1 || $5) "
                 "AND EXISTS (SELECT FROM eventbox.outbox_held) RETURNING 1) "
                 "SELECT count(*) FROM j",
                 acks_into("now()")),
        7, ack_types);
    // The usual pass: every acknowledged row was read from a rotated table. Its ack rows are
    // formed here, one statement per table with the ids in order: the statement above spent
    // most of its time unnesting, grouping and sorting the arrays the relay already had. A row
    // held while it was in flight (hold_plan, or a user's change) leaves outbox_held.
    Oid row_types[4] = {INT8OID, INT8ARRAYOID, INT4ARRAYOID, INT8ARRAYOID};
    for (int t = 0; t < kTables; ++t)
        ack_row_plans[t] = prepare(
            psprintf("WITH h AS (DELETE FROM eventbox.outbox_held WHERE id = ANY ($2) "
                     "AND EXISTS (SELECT FROM eventbox.outbox_held) RETURNING 1) "
                     "INSERT INTO eventbox.outbox_acks_%d (acked_at, max_id, ids, partitions, "
                     "offsets) VALUES (now(), $1, $2, $3, $4)",
                     t),
            4, row_types);
    // A failed attempt holds the row (a full copy: it outlives its rotated table) with its
    // attempts, error and retry time, or given up; a row held already counts one more attempt
    // there (its rotated copy may be truncated). A row a user cancelled meanwhile stays
    // cancelled.
    Oid failed_types[4] = {INT8ARRAYOID, TEXTARRAYOID, INT8ARRAYOID, BOOLARRAYOID};
    failed_plan = prepare(
        "WITH u AS (SELECT * FROM unnest($1::int8[], $2::text[], $3::int8[], $4::bool[]) "
        "AS u(id, err, delay, give_up)), "
        "again AS (UPDATE eventbox.outbox_held h SET attempts = h.attempts + 1, "
        "last_error = u.err, next_attempt_at = now() + u.delay * interval '1 millisecond', "
        "status = CASE WHEN u.give_up THEN 'failed' ELSE h.status END "
        "FROM u WHERE h.id = u.id AND h.status = 'pending' RETURNING 1) "
        "INSERT INTO eventbox.outbox_held (id, message_id, topic, key, payload, headers, "
        "created_at, cause_subscription, cause_received_at, status, attempts, next_attempt_at, "
        "last_error) "
        "SELECT r.id, r.message_id, r.topic, r.key, r.payload, r.headers, r.created_at, "
        "r.cause_subscription, r.cause_received_at, "
        "CASE WHEN u.give_up THEN 'failed' ELSE 'pending' END, 1, "
        "now() + u.delay * interval '1 millisecond', u.err "
        "FROM u JOIN eventbox._outbox_rows r ON r.id = u.id "
        "WHERE NOT EXISTS (SELECT FROM eventbox.outbox_held h WHERE h.id = r.id) "
        "ON CONFLICT (id) DO NOTHING",
        4, failed_types);
    // Held too long, or taken by no sink: copied into outbox_held as they are (no attempt), so
    // that they no longer hold W. A row held already (failed, changed or cancelled by a user)
    // stays as it is.
    Oid hold_types[1] = {INT8ARRAYOID};
    hold_plan = prepare(
        "INSERT INTO eventbox.outbox_held (id, message_id, topic, key, payload, headers, "
        "created_at, cause_subscription, cause_received_at, status, attempts) "
        "SELECT r.id, r.message_id, r.topic, r.key, r.payload, r.headers, r.created_at, "
        "r.cause_subscription, r.cause_received_at, 'pending', 0 "
        "FROM eventbox._outbox_rows r WHERE r.id = ANY ($1) ON CONFLICT (id) DO NOTHING",
        1, hold_types);
    // W only moves forward: after a reset the relay knows less, never that a settled row is not.
    // A W that did not move writes nothing (no row lock, no xid: an idle relay writes no WAL);
    // the relay's row is created when missing, and a concurrent creator wins (the next pass
    // moves W).
    Oid position_types[1] = {INT8OID};
    position_plan = prepare(
        "WITH moved AS (UPDATE eventbox.outbox_state SET settled_below = $1 "
        "WHERE n = -1 AND settled_below < $1 RETURNING n) "
        "INSERT INTO eventbox.outbox_state (n, settled_below, gaps, held_generation) "
        "SELECT -1, $1, '{}', 0 WHERE NOT EXISTS (SELECT FROM eventbox.outbox_state WHERE n = -1) "
        "ON CONFLICT (n) DO NOTHING",
        1, position_types);
    // eventbox.dead_retention: given-up held rows by age, whatever W is. The ids first (an
    // array, not an IN (subquery), for the reason the purges always had: no merge over a whole
    // index), then their delete; a purged row whose rotated copy is not settled by W yet gets a
    // tombstone ack row (acked_at -infinity: never shown as sent, and old for the truncate), so
    // that the copy does not read as pending again. The rotated copies are found by the deleted
    // ids as an array too: "r.id = ANY ($1) AND r.id IN (SELECT id FROM d)" was planned as a
    // probe per deleted id, each with the whole $1 as an index condition (270 ms for a batch of
    // 1,000 against 3.6 ms).
    Oid purge_types[2] = {INT4OID, INT4OID};
    purge_failed_ids_plan = prepare(
        "SELECT ARRAY(SELECT id FROM eventbox.outbox_held WHERE status = 'failed' "
        "AND created_at < now() - $1 * interval '1 second' ORDER BY created_at LIMIT $2)",
        2, purge_types);
    Oid purge_ids_type[1] = {INT8ARRAYOID};
    purge_failed_plan = prepare(
        psprintf(
            "WITH d AS (DELETE FROM eventbox.outbox_held WHERE id = ANY ($1) "
            "AND status = 'failed' RETURNING id), "
            "j AS MATERIALIZED (SELECT r.n, r.id FROM eventbox._outbox_rows r "
            "WHERE r.id = ANY (ARRAY(SELECT id FROM d)) AND r.id >= coalesce((SELECT "
            "least(s.settled_below, lower(s.gaps)) FROM eventbox.outbox_state s WHERE s.n = -1), "
            "0)), "
            "g AS MATERIALIZED (SELECT n, max(id) AS max_id, array_agg(id ORDER BY id) AS ids, "
            "array_agg(-1) AS ps, array_agg(-1::int8) AS os FROM j GROUP BY n), %s "
            "SELECT count(*) FROM d",
            acks_into("'-infinity'")),
        1, purge_ids_type);
    // Rows users cancelled (deleted from the view before they were sent), once below W: above
    // it their held copy is what keeps them from being read as pending.
    Oid cancelled_types[1] = {INT4OID};
    purge_cancelled_plan = prepare(
        "DELETE FROM eventbox.outbox_held WHERE id = ANY (ARRAY(SELECT id FROM "
        "eventbox.outbox_held WHERE status = 'cancelled' "
        "AND id < (SELECT settled_below FROM eventbox.outbox_state WHERE n = -1) "
        "ORDER BY id LIMIT $1))",
        1, cancelled_types);
}

namespace {

// Acknowledged rows that were all read from rotated tables: one ack row per table, formed here
// (see ack_row_plans). Returns the rows.
int insert_ack_rows(const std::vector<relay::Acked>& acked) {
    int n = static_cast<int>(acked.size());
    // The acknowledgements in (table, id) order: delivery reports come per partition.
    int* order = static_cast<int*>(palloc(sizeof(int) * n));
    for (int i = 0; i < n; ++i) order[i] = i;
    std::sort(order, order + n, [&acked](int a, int b) {
        return acked[a].table != acked[b].table ? acked[a].table < acked[b].table
                                                : acked[a].id < acked[b].id;
    });
    int64* ids = static_cast<int64*>(palloc(sizeof(int64) * n));
    Datum* partitions = static_cast<Datum*>(palloc(sizeof(Datum) * n));
    int64* offsets = static_cast<int64*>(palloc(sizeof(int64) * n));
    for (int i = 0; i < n; ++i) {
        const relay::Acked& a = acked[order[i]];
        ids[i] = a.id;
        partitions[i] = Int32GetDatum(a.partition);
        offsets[i] = a.offset;
    }
    for (int from = 0, to; from < n; from = to) {
        int table = acked[order[from]].table;
        for (to = from + 1; to < n && acked[order[to]].table == table; ++to) {
        }
        if (table >= kTables) elog(ERROR, "%s: no rotated table %d", kWho, table);
        int m = to - from;
        Datum values[4] = {
            Int64GetDatum(ids[to - 1]), PointerGetDatum(int8_array(ids + from, m)),
            PointerGetDatum(construct_array(partitions + from, m, INT4OID, 4, true, TYPALIGN_INT)),
            PointerGetDatum(int8_array(offsets + from, m))};
        exec(ack_row_plans[table], values, false, SPI_OK_INSERT);
    }
    return n;
}

// Acknowledged rows: one ack row per rotated table (see ack_plan and ack_row_plans).
void write_acked() {
    const std::vector<relay::Acked>& acked = dispatcher.acked();
    int n = static_cast<int>(acked.size());
    if (n == 0) return;
    // Delivery reports were taken just before this pass: "now" is when the acks arrived.
    int64 now = worker::now_ms();
    latency->clear();
    e2e_used = 0;
    E2eTally* last = nullptr;
    bool any_held = false;
    for (int i = 0; i < n; ++i) {
        const relay::Acked& a = acked[i];
        any_held = any_held || a.table < 0;
        if (a.created_ms != 0) latency->observe_us((now - a.created_ms) * 1000);
        if (a.cause_subscription == 0) continue;
        if (last == nullptr || last->subscription != a.cause_subscription)
            last = &e2e_tally(a.cause_subscription);
        last->histogram.observe_us((now - a.cause_received_ms) * 1000);
    }
    if (!any_held) {
        settled_in_transaction += static_cast<uint64>(insert_ack_rows(acked));
        return;
    }
    // Rows read from a rotated table first (r of them, with their tables), then those read from
    // outbox_held, from the end of the same arrays.
    int64* ids = static_cast<int64*>(palloc(sizeof(int64) * n));
    Datum* partitions = static_cast<Datum*>(palloc(sizeof(Datum) * n));
    int64* offsets = static_cast<int64*>(palloc(sizeof(int64) * n));
    Datum* tables = static_cast<Datum*>(palloc(sizeof(Datum) * n));
    int r = 0, h = n;
    for (int i = 0; i < n; ++i) {
        int at = acked[i].table >= 0 ? r++ : --h;
        ids[at] = acked[i].id;
        partitions[at] = Int32GetDatum(acked[i].partition);
        offsets[at] = acked[i].offset;
        tables[at] = Int16GetDatum(acked[i].table);
    }
    Datum values[7] = {
        PointerGetDatum(int8_array(ids, r)),
        PointerGetDatum(construct_array(partitions, r, INT4OID, 4, true, TYPALIGN_INT)),
        PointerGetDatum(int8_array(offsets, r)),
        PointerGetDatum(construct_array(tables, r, INT2OID, 2, true, TYPALIGN_SHORT)),
        PointerGetDatum(int8_array(ids + h, n - h)),
        PointerGetDatum(construct_array(partitions + h, n - h, INT4OID, 4, true, TYPALIGN_INT)),
        PointerGetDatum(int8_array(offsets + h, n - h))};
    exec(ack_plan, values, false, SPI_OK_SELECT);
    bool isnull;
    settled_in_transaction += static_cast<uint64>(
        DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)));
}

// Failed attempts: held with attempts + 1, the error and the retry time, or 'failed' when given
// up.
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
    exec(failed_plan, values, false, SPI_OK_INSERT);
    ereport(LOG, (errmsg("eventbox relay: %d message(s) failed delivery; first: %s", m,
                         failed[0].error.c_str())));
}

// Rows to hold: copied into outbox_held (see hold_plan). Before the acknowledgements, which
// delete the held copy of a row acknowledged in the meantime.
void write_holds() {
    const std::vector<int64_t>& hold = dispatcher.to_hold();
    int n = static_cast<int>(hold.size());
    if (n == 0) return;
    Datum values[1] = {PointerGetDatum(int8_array(hold.data(), n))};
    exec(hold_plan, values, false, SPI_OK_INSERT);
}

}  // namespace

void write_outcomes() {
    settled_in_transaction = 0;
    write_holds();
    write_acked();
    write_failed();
}

void settle_outcomes(std::size_t acked, std::size_t failed, std::size_t held) {
    dispatcher.clear_outcomes(acked, failed, held);
    shmem::count_messages(acked);
    if (acked > 0) metrics::relay_published(acked, *latency);
    for (int i = 0; i < e2e_used; ++i) metrics::e2e_observed(e2e[i].name, e2e[i].histogram);
    e2e_used = 0;
    if (failed > 0) metrics::relay_failures(failed);
    metrics::outbox_settled(settled_in_transaction);
}

void store_position(TimestampTz now) {
    if (!TimestampDifferenceExceeds(last_position, now, kPositionEveryMs)) {
        position_deferred = true;
        return;
    }
    last_position = now;
    position_deferred = false;
    // The lowest id the relay still has to settle: one the dispatcher holds, one in a gap kept
    // (a late commit may still fill it), or the next one above the cursor.
    int64 w = Min(cursor + 1, Min(dispatcher.lowest_unsettled(), rechecks.lowest()));
    Datum values[1] = {Int64GetDatum(w)};
    exec(position_plan, values, false, SPI_OK_INSERT);
}

long position_due_ms() {
    if (!position_deferred) return -1;
    TimestampTz due = TimestampTzPlusMilliseconds(last_position, kPositionEveryMs);
    return TimestampDifferenceMilliseconds(GetCurrentTimestamp(), due);
}

bool purge_outbox(TimestampTz now) {
    // Sent rows are not purged one by one: they leave with their table (rotation and truncate,
    // docs/design/outbox-rotation.md), and the view hides them past eventbox.outbox_retention.
    // Held rows: cancelled ones below W, and given-up ones past eventbox.dead_retention, when
    // set.
    if (!TimestampDifferenceExceeds(last_purge, now, 1000)) return false;
    Datum limit[1] = {Int32GetDatum(guc::relay_batch_size)};
    PushActiveSnapshot(GetTransactionSnapshot());
    exec(purge_cancelled_plan, limit, false, SPI_OK_DELETE);
    bool full = SPI_processed == static_cast<uint64>(guc::relay_batch_size);
    uint64 purged = 0;
    if (guc::dead_retention_s > 0) {
        Datum values[2] = {Int32GetDatum(guc::dead_retention_s),
                           Int32GetDatum(guc::relay_batch_size)};
        exec(purge_failed_ids_plan, values, true, SPI_OK_SELECT);
        bool isnull;
        Datum ids = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
        int n = isnull ? 0
                       : ArrayGetNItems(ARR_NDIM(DatumGetArrayTypeP(ids)),
                                        ARR_DIMS(DatumGetArrayTypeP(ids)));
        if (n > 0) {
            // The array lives in SPI's result memory: copy it out before the next statement.
            Datum kept[1] = {PointerGetDatum(DatumGetArrayTypePCopy(ids))};
            exec(purge_failed_plan, kept, false, SPI_OK_SELECT);
            purged = static_cast<uint64>(DatumGetInt64(
                SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)));
        }
        full = full || n == guc::relay_batch_size;
    }
    PopActiveSnapshot();
    metrics::purged(metrics::PurgedTable::kOutbox, purged);
    if (!full) last_purge = now;
    return full;
}

}  // namespace eventbox::relay_worker
