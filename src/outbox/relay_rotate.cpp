// The relay's rotation and truncation of eventbox.outbox_rows_0, _1 and _2 (see
// outbox/relay_rotate.hpp and docs/design/outbox-rotation.md). A table goes open -> closed ->
// empty -> open, each step recorded in its eventbox.outbox_state row:
//  - open: writers insert into it (send() and the view's INSERT trigger read which one under a
//    snapshot taken after their xid was assigned: outbox_insert.cpp, open_table());
//  - closed, switched_xid NULL: closed by a transaction that committed; the next call records
//    the next xid read after that commit. Every writer that saw the table open had its xid
//    before the commit, so below switched_xid;
//  - closed, max_id NULL: waits until no transaction below switched_xid runs (the statement's
//    snapshot's xmin, which counts prepared transactions), then takes max(id) in that snapshot:
//    no row can be inserted into the table any more;
//  - closed, settled_at NULL: waits until W (the settled position) is above max_id and no
//    stored gap reaches into it;
//  - closed, settled: after eventbox.outbox_retention, truncated with its outbox_acks_N when
//    both locks are free at once (ConditionalLockRelationOid: a reader postpones it to a later
//    call, nothing waits), and marked empty.
// The open table is closed when it is older than the rotation period or has reached
// eventbox.outbox_rotation_size, holds rows, and the next table is empty; otherwise it stays
// open and grows. The size bounds the truncate's commit, which removes the table's file while
// its lock is held (its time grows with the file: ~300 ms for 600 MB, which the relay's pass
// and every reader of the view waited for).
//
// PostgreSQL-side code: no C++ object lives on these frames.
#include "outbox/relay_rotate.hpp"

extern "C" {
#include "access/relation.h"
#include "access/transam.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/xid8.h"
}

#include "metrics/counters.hpp"
#include "outbox/relay_worker.hpp"
#include "pg/guc.hpp"
#include "workers/common.hpp"

namespace eventbox::relay_worker {

namespace {

SPIPlanPtr init_plan, stamp_plan, final_plan, settle_plan, state_plan, holds_rows_plan[kTables],
    acked_plan[kTables], emptied_plan, rotate_plan;
TimestampTz last_check = 0;

SPIPlanPtr prepare(const char* sql, int nargs, Oid* types) {
    return worker::prepare_kept(kWho, sql, nargs, types);
}

void prepare_plans() {
    if (init_plan != nullptr) return;
    // eventbox.outbox_state starts empty, which reads as table 0 open and the others empty: the
    // rows are inserted as that when first needed (the open table counts its age from then).
    init_plan = prepare(
        "INSERT INTO eventbox.outbox_state (n, state, opened_at) "
        "SELECT g, CASE WHEN g = 0 THEN 'open' ELSE 'empty' END, CASE WHEN g = 0 THEN now() END "
        "FROM generate_series(0, 2) g ON CONFLICT (n) DO NOTHING",
        0, nullptr);
    Oid xid8_type[1] = {XID8OID};
    stamp_plan = prepare(
        "UPDATE eventbox.outbox_state SET switched_xid = $1 "
        "WHERE n >= 0 AND state = 'closed' AND switched_xid IS NULL",
        1, xid8_type);
    // One snapshot for both: its xmin at or above switched_xid says every writer of the table
    // has ended, and its max(id) then sees all of their rows. An empty table's max_id is 0.
    final_plan = prepare(
        "UPDATE eventbox.outbox_state s SET max_id = coalesce(CASE s.n "
        "WHEN 0 THEN (SELECT max(id) FROM eventbox.outbox_rows_0) "
        "WHEN 1 THEN (SELECT max(id) FROM eventbox.outbox_rows_1) "
        "WHEN 2 THEN (SELECT max(id) FROM eventbox.outbox_rows_2) END, 0) "
        "WHERE s.n >= 0 AND s.state = 'closed' AND s.max_id IS NULL "
        "AND s.switched_xid <= pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot())",
        0, nullptr);
    // Settled: every id up to max_id is below W and outside the stored gaps (no relay row: W is
    // 0, nothing is settled but an empty table).
    settle_plan = prepare(
        "UPDATE eventbox.outbox_state s SET settled_at = now() "
        "WHERE s.n >= 0 AND s.state = 'closed' AND s.max_id IS NOT NULL "
        "AND s.settled_at IS NULL AND (s.max_id = 0 OR s.max_id < coalesce(("
        "SELECT least(w.settled_below, lower(w.gaps)) FROM eventbox.outbox_state w "
        "WHERE w.n = -1), 0))",
        0, nullptr);
    // Each table's row: whether it is due for the truncate ($1: the retention in seconds) and,
    // when open, for the rotation ($2: the period in seconds).
    Oid state_types[2] = {INT4OID, INT4OID};
    state_plan = prepare(
        "SELECT n, state, "
        "state = 'closed' AND settled_at <= now() - $1 * interval '1 second', "
        "state = 'open' AND opened_at <= now() - $2 * interval '1 second' "
        "FROM eventbox.outbox_state WHERE n >= 0 ORDER BY n",
        2, state_types);
    for (int n = 0; n < kTables; ++n) {
        holds_rows_plan[n] = prepare(
            psprintf("SELECT 1 FROM eventbox.outbox_rows_%d ORDER BY id LIMIT 1", n), 0, nullptr);
        // The acknowledged rows a truncate removes (eventbox_retention_purged_rows_total).
        acked_plan[n] = prepare(
            psprintf("SELECT coalesce(sum(cardinality(ids)), 0)::int8 FROM eventbox.outbox_acks_%d",
                     n),
            0, nullptr);
    }
    Oid int2_type[1] = {INT2OID};
    emptied_plan = prepare(
        "UPDATE eventbox.outbox_state SET state = 'empty', switched_xid = NULL, max_id = NULL, "
        "settled_at = NULL, opened_at = NULL WHERE n = $1",
        1, int2_type);
    // Both rows in one statement: a writer's snapshot sees the old open table or the new one.
    Oid rotate_types[2] = {INT2OID, INT2OID};
    rotate_plan = prepare(
        "UPDATE eventbox.outbox_state SET "
        "state = CASE WHEN n = $1 THEN 'closed' ELSE 'open' END, "
        "opened_at = CASE WHEN n = $2 THEN now() END, "
        "switched_xid = NULL, max_id = NULL, settled_at = NULL WHERE n IN ($1, $2)",
        2, rotate_types);
}

// The rotated table n's relation, and its ack table's.
Oid table_oid(const char* kind, int n) {
    char name[NAMEDATALEN];
    snprintf(name, sizeof name, "outbox_%s_%d", kind, n);
    return get_relname_relid(name, get_namespace_oid("eventbox", false));
}

// Whether the open table n has reached eventbox.outbox_rotation_size (AccessShareLock waits for
// none of its writers).
bool outgrown(int n) {
    if (guc::outbox_rotation_size_kb <= 0) return false;
    Oid rows = table_oid("rows", n);
    if (!OidIsValid(rows)) return false;
    Relation rel = relation_open(rows, AccessShareLock);
    BlockNumber blocks = RelationGetNumberOfBlocks(rel);
    relation_close(rel, AccessShareLock);
    return static_cast<int64>(blocks) * (BLCKSZ / 1024) >= guc::outbox_rotation_size_kb;
}

// Truncates table n and its ack rows when both locks are free now. Returns whether it did.
bool truncate_table(int n) {
    Oid rows = table_oid("rows", n);
    Oid acks = table_oid("acks", n);
    if (!OidIsValid(rows) || !OidIsValid(acks)) return false;
    if (!ConditionalLockRelationOid(rows, AccessExclusiveLock)) {
        ereport(DEBUG1, (errmsg("eventbox relay: truncate of eventbox.outbox_rows_%d postponed: "
                                "the table is in use",
                                n)));
        return false;
    }
    if (!ConditionalLockRelationOid(acks, AccessExclusiveLock)) {
        UnlockRelationOid(rows, AccessExclusiveLock);
        ereport(DEBUG1, (errmsg("eventbox relay: truncate of eventbox.outbox_acks_%d postponed: "
                                "the table is in use",
                                n)));
        return false;
    }
    exec(acked_plan[n], nullptr, true, SPI_OK_SELECT);
    bool isnull;
    int64 acked =
        DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
    // The locks are held: TRUNCATE takes them again without waiting.
    int rc = SPI_execute(
        psprintf("TRUNCATE eventbox.outbox_rows_%d, eventbox.outbox_acks_%d", n, n), false, 0);
    if (rc != SPI_OK_UTILITY)
        elog(ERROR, "%s: truncate of eventbox.outbox_rows_%d failed: %s", kWho, n,
             SPI_result_code_string(rc));
    Datum values[1] = {Int16GetDatum(static_cast<int16>(n))};
    exec(emptied_plan, values, false, SPI_OK_UPDATE);
    metrics::purged(metrics::PurgedTable::kOutbox, static_cast<uint64>(acked));
    return true;
}

}  // namespace

void rotate_outbox(TimestampTz now) {
    if (!TimestampDifferenceExceeds(last_check, now, 1000)) return;
    last_check = now;
    prepare_plans();
    PushActiveSnapshot(GetTransactionSnapshot());
    // Read now, in a transaction after the one that closed a table: above every writer's xid
    // that saw the table open.
    Datum next_xid[1] = {FullTransactionIdGetDatum(ReadNextFullTransactionId())};
    exec(stamp_plan, next_xid, false, SPI_OK_UPDATE);
    exec(final_plan, nullptr, false, SPI_OK_UPDATE);
    exec(settle_plan, nullptr, false, SPI_OK_UPDATE);

    int period = Max(guc::outbox_rotation_interval_s, guc::outbox_retention_s);
    Datum limits[2] = {Int32GetDatum(guc::outbox_retention_s), Int32GetDatum(period)};
    exec(state_plan, limits, false, SPI_OK_SELECT);
    if (SPI_processed < kTables) {
        exec(init_plan, nullptr, false, SPI_OK_INSERT);
        PopActiveSnapshot();
        return;
    }
    bool empty[kTables], expired[kTables];
    int open = -1;
    bool due = false;
    for (int i = 0; i < kTables; ++i) {
        HeapTuple tuple = SPI_tuptable->vals[i];
        TupleDesc desc = SPI_tuptable->tupdesc;
        bool isnull;
        int n = DatumGetInt16(SPI_getbinval(tuple, desc, 1, &isnull));
        char* state = SPI_getvalue(tuple, desc, 2);
        Datum e = SPI_getbinval(tuple, desc, 3, &isnull);
        expired[n] = !isnull && DatumGetBool(e);
        empty[n] = strcmp(state, "empty") == 0;
        if (strcmp(state, "open") == 0) {
            open = n;
            Datum d = SPI_getbinval(tuple, desc, 4, &isnull);
            due = !isnull && DatumGetBool(d);
        }
    }
    for (int n = 0; n < kTables; ++n)
        if (expired[n] && truncate_table(n)) empty[n] = true;
    if (open >= 0 && empty[(open + 1) % kTables] && (due || outgrown(open))) {
        exec(holds_rows_plan[open], nullptr, true, SPI_OK_SELECT);
        if (SPI_processed > 0) {
            Datum values[2] = {Int16GetDatum(static_cast<int16>(open)),
                               Int16GetDatum(static_cast<int16>((open + 1) % kTables))};
            exec(rotate_plan, values, false, SPI_OK_UPDATE);
        }
    }
    PopActiveSnapshot();
}

}  // namespace eventbox::relay_worker
