// The supervisor's inbox retention: processed and ignored inbox rows past
// eventbox.inbox_retention, dead and unparsable ones past eventbox.dead_retention, and the sends
// that replays and backfills kept (eventbox.suppressed_sends), deleted in small batches paced
// by workers/purge_pacing.hpp.
extern "C" {
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "pgstat.h"
#include "utils/timestamp.h"
}

#include <climits>

#include "metrics/counters.hpp"
#include "pg/guc.hpp"
#include "pg/shmem.hpp"
#include "workers/common.hpp"
#include "workers/purge_pacing.hpp"
#include "workers/supervisor.hpp"

namespace eventbox::supervisor {

namespace {

// Retention. Processed and ignored rows past eventbox.inbox_retention (by processed_at), and
// dead and unparsable ones past eventbox.dead_retention (by received_at), are deleted oldest
// received first through inbox_received_idx, their status and processed_at tested on the row:
// no index mentions a column a handler's outcome changes, so that the mark is a HOT update
// (docs/design/handlers.md). A row processed after it was received cannot pass the window
// before its received_at did, so the walk starts nothing later than it has to; it also passes
// the older rows that do not qualify (still waiting, dead without dead_retention, processed
// late), once per round. At most kPurgeBatch rows per transaction and kind, each batch starting
// where the last one ended (purge_cursor, dead_cursor): no batch re-reads what earlier ones
// deleted (their index entries stay until VACUUM, and would make a round over n rows cost n^2).
// A round ends with a batch that is not full; the next starts at the beginning again, which also
// takes rows processed since, and rows whose transaction committed late.
constexpr int kPurgeBatch = 1000;
// While the ingest or handler workers work, the purge yields to them (workers/purge_pacing.hpp).
worker::PurgePacing purge_pacing;
TimestampTz purge_cursor = DT_NOBEGIN;
TimestampTz dead_cursor = DT_NOBEGIN;
TimestampTz next_purge = 0;
worker::LogRate purge_log = {1, 60000};

struct PurgeBatch {
    uint64 inbox_deleted;
    TimestampTz last_received_at;
    uint64 dead_deleted;
    TimestampTz last_dead_received_at;
    uint64 suppressed_deleted;
};

void purge_batch(void* arg) {
    auto* batch = static_cast<PurgeBatch*>(arg);
    if (guc::inbox_retention_s > 0) {
        Oid types[3] = {TIMESTAMPTZOID, INT4OID, INT4OID};
        SPIPlanPtr plan = SPI_prepare(
            "DELETE FROM eventbox.inbox WHERE ctid = ANY (ARRAY("
            "SELECT ctid FROM eventbox.inbox "
            "WHERE received_at >= $1 AND received_at < now() - $2 * interval '1 second' "
            "AND status IN ('processed', 'ignored') "
            "AND processed_at < now() - $2 * interval '1 second' "
            "ORDER BY received_at LIMIT $3 FOR UPDATE SKIP LOCKED)) "
            "RETURNING received_at",
            3, types);
        if (plan == nullptr) elog(ERROR, "could not prepare the inbox purge");
        Datum values[3] = {TimestampTzGetDatum(purge_cursor), Int32GetDatum(guc::inbox_retention_s),
                           Int32GetDatum(kPurgeBatch)};
        worker::exec_kept("eventbox supervisor", plan, values, false, SPI_OK_DELETE_RETURNING);
        batch->inbox_deleted = SPI_processed;
        for (uint64 i = 0; i < SPI_processed; ++i) {
            bool isnull;
            TimestampTz at = DatumGetTimestampTz(
                SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull));
            if (!isnull && at > batch->last_received_at) batch->last_received_at = at;
        }
    }
    if (guc::dead_retention_s > 0) {
        Oid types[3] = {TIMESTAMPTZOID, INT4OID, INT4OID};
        SPIPlanPtr plan = SPI_prepare(
            "DELETE FROM eventbox.inbox WHERE ctid = ANY (ARRAY("
            "SELECT ctid FROM eventbox.inbox "
            "WHERE received_at >= $1 AND received_at < now() - $2 * interval '1 second' "
            "AND status IN ('dead', 'unparsable') "
            "ORDER BY received_at LIMIT $3 FOR UPDATE SKIP LOCKED)) "
            "RETURNING received_at",
            3, types);
        if (plan == nullptr) elog(ERROR, "could not prepare the dead inbox purge");
        Datum values[3] = {TimestampTzGetDatum(dead_cursor), Int32GetDatum(guc::dead_retention_s),
                           Int32GetDatum(kPurgeBatch)};
        worker::exec_kept("eventbox supervisor", plan, values, false, SPI_OK_DELETE_RETURNING);
        batch->dead_deleted = SPI_processed;
        for (uint64 i = 0; i < SPI_processed; ++i) {
            bool isnull;
            TimestampTz at = DatumGetTimestampTz(
                SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull));
            if (!isnull && at > batch->last_dead_received_at) batch->last_dead_received_at = at;
        }
    }
    // What replays and backfills did not send (eventbox.suppressed_sends) goes after the same
    // time as the inbox rows whose runs wrote it.
    if (guc::inbox_retention_s > 0) {
        Oid types[2] = {INT4OID, INT4OID};
        SPIPlanPtr plan = SPI_prepare(
            "DELETE FROM eventbox.suppressed_sends WHERE ctid = ANY (ARRAY("
            "SELECT ctid FROM eventbox.suppressed_sends "
            "WHERE created_at < now() - $1 * interval '1 second' "
            "ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED))",
            2, types);
        if (plan == nullptr) elog(ERROR, "could not prepare the suppressed sends purge");
        Datum values[2] = {Int32GetDatum(guc::inbox_retention_s), Int32GetDatum(kPurgeBatch)};
        worker::exec_kept("eventbox supervisor", plan, values, false, SPI_OK_DELETE);
        batch->suppressed_deleted = SPI_processed;
    }
}

}  // namespace

// One purge batch when one is due; returns milliseconds until the next.
long retention_step() {
    if (guc::inbox_retention_s == 0 && guc::dead_retention_s == 0) {
        // The last batches' deletes may still wait for their flush (at most one a second):
        // without it autovacuum would never see them once retention is switched off.
        long flush_in_ms = pgstat_report_stat(false);
        return flush_in_ms > 0 ? flush_in_ms : LONG_MAX;
    }
    TimestampTz now = GetCurrentTimestamp();
    if (now < next_purge) return TimestampDifferenceMilliseconds(now, next_purge);
    PurgeBatch batch = {0, DT_NOBEGIN, 0, DT_NOBEGIN, 0};
    shmem::set_state("purging");
    TimestampTz started = GetCurrentTimestamp();
    bool ok = run_in_transaction(purge_batch, &batch, "inbox retention", &purge_log);
    TimestampTz ended = GetCurrentTimestamp();
    shmem::set_state("supervising");
    pgstat_report_stat(false);  // lets autovacuum see the deletes
    metrics::purged(metrics::PurgedTable::kInbox, batch.inbox_deleted + batch.dead_deleted);
    bool full = ok && (batch.inbox_deleted == static_cast<uint64>(kPurgeBatch) ||
                       batch.dead_deleted == static_cast<uint64>(kPurgeBatch) ||
                       batch.suppressed_deleted == static_cast<uint64>(kPurgeBatch));
    if (ok && batch.inbox_deleted == static_cast<uint64>(kPurgeBatch))
        purge_cursor = batch.last_received_at;
    else
        purge_cursor = DT_NOBEGIN;
    if (ok && batch.dead_deleted == static_cast<uint64>(kPurgeBatch))
        dead_cursor = batch.last_dead_received_at;
    else
        dead_cursor = DT_NOBEGIN;
    long wait =
        purge_pacing.after_batch(started / 1000, ended / 1000, ok, full, shmem::inflow_messages());
    next_purge = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait);
    return wait;
}

}  // namespace eventbox::supervisor
