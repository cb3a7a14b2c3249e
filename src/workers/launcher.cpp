// Two processes keep the workers running:
// - the launcher (registered in _PG_init, connected to no database) waits for eventbox.database
//   to exist, saying so once as a WARNING while it does not, and keeps the supervisor running;
// - the supervisor (connected to that database) waits for the extension at the schema version
//   of this library, starts the dynamic workers, restarts a dead one with backoff, and stops
//   them when the extension is dropped, re-created or its schema is not this library's.
// Extension changes wake the supervisor when they commit (pg/extension.cpp); a one-second
// check backs that up.
extern "C" {
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
}

#include <climits>
#include <exception>

#include "metrics/collect.hpp"
#include "metrics/pending_estimate.hpp"
#include "metrics/counters.hpp"
#include "metrics/http_server.hpp"
#include "pg/boundary.hpp"
#include "pg/extension.hpp"
#include "pg/guc.hpp"
#include "pg/shmem.hpp"
#include "workers/purge_pacing.hpp"
#include "workers/common.hpp"

using eventbox::pg::call_cpp;

namespace eventbox {

namespace {

// One dynamic worker the launcher keeps running.
struct Managed {
    const char* function;
    const char* type;
    int index;  // ingest and handler workers: which one (passed in bgw_extra)
    BackgroundWorkerHandle* handle;
    BackgroundWorkerHandle* stopping;  // asked to stop, not gone yet
    TimestampTz started_at;
    TimestampTz next_start;
    int backoff_ms;
};

Managed supervisor = {"eventbox_supervisor_main", "eventbox supervisor", 0, nullptr, nullptr, 0, 0,
                      1000};
Managed relay = {"eventbox_relay_main", "eventbox relay", 0, nullptr, nullptr, 0, 0, 1000};
Managed ingest_workers[shmem::kMaxIngestWorkers];
Managed handler_workers[shmem::kMaxHandlerWorkers];

constexpr int kMinBackoffMs = 1000;
constexpr int kMaxBackoffMs = 60000;
// A worker that lived this long before dying is restarted without growing the backoff.
constexpr int kHealthyRunMs = 60000;

// The database the started workers connect to.
Oid served_database = InvalidOid;

pg::ExtensionState read_extension_state() {
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    pg::ExtensionState state = pg::extension_state();
    CommitTransactionCommand();
    return state;
}

// The launcher is connected to no database, so it reads pg_database like the autovacuum
// launcher does: a heap scan. get_database_oid() scans an index of pg_database, whose relcache
// entry must be built from pg_class (an ERROR, hence FATAL and a restart every 10 s, without a
// database) unless a backend has already written the shared relcache init file, which is not
// the case after a start.
Oid lookup_database() {
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    (void)GetTransactionSnapshot();
    Relation rel = table_open(DatabaseRelationId, AccessShareLock);
    ScanKeyData key;
    ScanKeyInit(&key, Anum_pg_database_datname, BTEqualStrategyNumber, F_NAMEEQ,
                CStringGetDatum(guc::database));
    TableScanDesc scan = table_beginscan_catalog(rel, 1, &key);
    HeapTuple tuple = heap_getnext(scan, ForwardScanDirection);
    Oid db = HeapTupleIsValid(tuple) ? reinterpret_cast<Form_pg_database>(GETSTRUCT(tuple))->oid
                                     : InvalidOid;
    table_endscan(scan);
    table_close(rel, AccessShareLock);
    CommitTransactionCommand();
    return db;
}

metrics::WorkerRole role_of(const Managed& w) {
    if (strcmp(w.type, "eventbox relay") == 0) return metrics::WorkerRole::kRelay;
    if (strcmp(w.type, "eventbox ingest") == 0) return metrics::WorkerRole::kIngest;
    if (strcmp(w.type, "eventbox handler") == 0) return metrics::WorkerRole::kHandler;
    return metrics::WorkerRole::kSupervisor;
}

bool is_running(Managed& w) {
    if (w.handle == nullptr) return false;
    pid_t pid;
    BgwHandleStatus status = GetBackgroundWorkerPid(w.handle, &pid);
    if (status == BGWH_STARTED || status == BGWH_NOT_YET_STARTED) return true;
    // Dead: schedule a restart, backing off when it died young.
    TimestampTz now = GetCurrentTimestamp();
    if (TimestampDifferenceExceeds(w.started_at, now, kHealthyRunMs))
        w.backoff_ms = kMinBackoffMs;
    else
        w.backoff_ms = Min(w.backoff_ms * 2, kMaxBackoffMs);
    w.next_start = TimestampTzPlusMilliseconds(now, w.backoff_ms);
    pfree(w.handle);
    w.handle = nullptr;
    metrics::worker_restarted(role_of(w));
    ereport(LOG, (errmsg("%s exited; restarting it in %d ms", w.type, w.backoff_ms)));
    return false;
}

void start(Managed& w) {
    BackgroundWorker worker;
    memset(&worker, 0, sizeof worker);
    worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
    worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
    worker.bgw_restart_time = BGW_NEVER_RESTART;
    snprintf(worker.bgw_library_name, BGW_MAXLEN, "pg_eventbox");
    snprintf(worker.bgw_function_name, BGW_MAXLEN, "%s", w.function);
    snprintf(worker.bgw_name, BGW_MAXLEN, "%s", w.type);
    snprintf(worker.bgw_type, BGW_MAXLEN, "%s", w.type);
    worker.bgw_main_arg = ObjectIdGetDatum(served_database);
    memcpy(worker.bgw_extra, &w.index, sizeof w.index);
    worker.bgw_notify_pid = MyProcPid;
    w.started_at = GetCurrentTimestamp();
    if (!RegisterDynamicBackgroundWorker(&worker, &w.handle)) {
        w.handle = nullptr;
        w.backoff_ms = Min(w.backoff_ms * 2, kMaxBackoffMs);
        w.next_start = TimestampTzPlusMilliseconds(w.started_at, w.backoff_ms);
        ereport(WARNING,
                (errmsg("could not start %s: no free background worker slot", w.type),
                 errhint("Raise max_worker_processes.")));
    }
}

void stop(Managed& w) {
    if (w.handle == nullptr) return;
    TerminateBackgroundWorker(w.handle);
    Assert(w.stopping == nullptr);  // supervise() starts a worker only once its predecessor is gone
    w.stopping = w.handle;
    w.handle = nullptr;
    w.backoff_ms = kMinBackoffMs;
    w.next_start = 0;
}

// Whether a worker asked to stop is still shutting down (its successor waits for it: both
// would take the same shared slot, and an ingest worker the same partitions).
bool still_stopping(Managed& w) {
    if (w.stopping == nullptr) return false;
    pid_t pid;
    if (GetBackgroundWorkerPid(w.stopping, &pid) != BGWH_STOPPED) return true;
    pfree(w.stopping);
    w.stopping = nullptr;
    return false;
}

// Keeps `w` running; returns milliseconds until it next needs attention.
long supervise(Managed& w) {
    if (is_running(w)) return LONG_MAX;
    if (still_stopping(w)) return 100;
    TimestampTz now = GetCurrentTimestamp();
    if (now < w.next_start) return TimestampDifferenceMilliseconds(now, w.next_start);
    start(w);
    return w.handle ? LONG_MAX : w.backoff_ms;
}


// ---- Supervisor duties besides supervising: retention and the metrics endpoint -------------

// Runs fn(arg) in a transaction of its own with SPI connected and a snapshot. An ERROR is
// logged (at most once a minute per `rate`), the transaction aborted and false returned: the
// supervisor keeps supervising.
bool run_in_transaction(void (*fn)(void*), void* arg, const char* what, worker::LogRate* rate) {
    MemoryContext outer = CurrentMemoryContext;
    volatile bool ok = true;
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    PG_TRY();
    {
        if (pg::lock_schema_for_work()) {
            if (SPI_connect() != SPI_OK_CONNECT)
                elog(ERROR, "eventbox supervisor: SPI_connect failed");
            PushActiveSnapshot(GetTransactionSnapshot());
            fn(arg);
            PopActiveSnapshot();
            SPI_finish();
        } else {
            ok = false;  // dropped or re-created while it waited: the supervisor's check sees it
        }
        CommitTransactionCommand();
    }
    PG_CATCH();
    {
        MemoryContextSwitchTo(outer);
        ErrorData* edata = CopyErrorData();
        FlushErrorState();
        AbortCurrentTransaction();
        int held_back = 0;
        if (worker::log_allowed(*rate, &held_back))
            ereport(LOG, (errmsg("eventbox supervisor: %s failed: %s", what, edata->message),
                          held_back ? errdetail("%d similar messages suppressed.", held_back) : 0));
        shmem::record_error(edata->message);
        FreeErrorData(edata);
        ok = false;
    }
    PG_END_TRY();
    MemoryContextSwitchTo(outer);
    return ok;
}

// Retention. Processed and ignored rows are deleted oldest first through the partial index
// inbox_done_idx (processed_at, only those statuses), at most kPurgeBatch per transaction, each
// batch starting where the last one ended (purge_cursor): no batch re-reads what earlier ones
// deleted (their index entries stay until VACUUM, and would make a round over n rows cost n^2).
// A round ends with a batch that is not full; the next starts at the beginning again, which also
// takes rows whose processed_at lies before the cursor because their transaction committed late.
constexpr int kPurgeBatch = 1000;
// While the ingest or handler workers work, the purge yields to them (workers/purge_pacing.hpp).
worker::PurgePacing purge_pacing;
TimestampTz purge_cursor = DT_NOBEGIN;
TimestampTz next_purge = 0;
worker::LogRate purge_log = {1, 60000};

struct PurgeBatch {
    uint64 inbox_deleted;
    TimestampTz last_processed_at;
    uint64 dead_deleted;
    uint64 suppressed_deleted;
};

void purge_batch(void* arg) {
    auto* batch = static_cast<PurgeBatch*>(arg);
    if (guc::inbox_retention_s > 0) {
        Oid types[3] = {TIMESTAMPTZOID, INT4OID, INT4OID};
        SPIPlanPtr plan = SPI_prepare(
            "DELETE FROM eventbox.inbox WHERE ctid = ANY (ARRAY("
            "SELECT ctid FROM eventbox.inbox "
            "WHERE status IN ('processed', 'ignored') AND processed_at >= $1 "
            "AND processed_at < now() - $2 * interval '1 second' "
            "ORDER BY processed_at LIMIT $3 FOR UPDATE SKIP LOCKED)) "
            "RETURNING processed_at",
            3, types);
        if (plan == nullptr) elog(ERROR, "could not prepare the inbox purge");
        Datum values[3] = {TimestampTzGetDatum(purge_cursor),
                           Int32GetDatum(guc::inbox_retention_s), Int32GetDatum(kPurgeBatch)};
        worker::exec_kept("eventbox supervisor", plan, values, false, SPI_OK_DELETE_RETURNING);
        batch->inbox_deleted = SPI_processed;
        for (uint64 i = 0; i < SPI_processed; ++i) {
            bool isnull;
            TimestampTz at = DatumGetTimestampTz(
                SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull));
            if (!isnull && at > batch->last_processed_at) batch->last_processed_at = at;
        }
    }
    if (guc::dead_retention_s > 0) {
        Oid types[2] = {INT4OID, INT4OID};
        SPIPlanPtr plan = SPI_prepare(
            "DELETE FROM eventbox.inbox WHERE ctid = ANY (ARRAY("
            "SELECT ctid FROM eventbox.inbox "
            "WHERE status IN ('dead', 'unparsable') "
            "AND received_at < now() - $1 * interval '1 second' "
            "ORDER BY received_at LIMIT $2 FOR UPDATE SKIP LOCKED))",
            2, types);
        if (plan == nullptr) elog(ERROR, "could not prepare the dead inbox purge");
        Datum values[2] = {Int32GetDatum(guc::dead_retention_s), Int32GetDatum(kPurgeBatch)};
        worker::exec_kept("eventbox supervisor", plan, values, false, SPI_OK_DELETE);
        batch->dead_deleted = SPI_processed;
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
    PurgeBatch batch = {0, DT_NOBEGIN, 0, 0};
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
        purge_cursor = batch.last_processed_at;
    else
        purge_cursor = DT_NOBEGIN;
    long wait = purge_pacing.after_batch(started / 1000, ended / 1000, ok, full,
                                         shmem::inflow_messages());
    next_purge = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait);
    return wait;
}

// The metric counters of dropped subscriptions are freed (metrics::sweep_subscriptions()): their
// series leave eventbox.metrics within two sweeps, and their entries serve new subscriptions.
constexpr long kCounterSweepMs = 10000;
TimestampTz next_counter_sweep = 0;
worker::LogRate sweep_log = {1, 60000};

void sweep_counters(void*) {
    if (SPI_execute("SELECT name FROM eventbox.subscriptions", true, 0) != SPI_OK_SELECT)
        elog(ERROR, "could not read the subscriptions");
    int n = static_cast<int>(SPI_processed);
    char** names = static_cast<char**>(palloc(sizeof(char*) * Max(n, 1)));
    for (int i = 0; i < n; ++i) names[i] = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
    metrics::sweep_subscriptions(names, n);
}

// One sweep when one is due; returns milliseconds until the next.
long counter_sweep_step() {
    TimestampTz now = GetCurrentTimestamp();
    if (now < next_counter_sweep) return TimestampDifferenceMilliseconds(now, next_counter_sweep);
    (void)run_in_transaction(sweep_counters, nullptr, "metrics counter sweep", &sweep_log);
    next_counter_sweep = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), kCounterSweepMs);
    return kCounterSweepMs;
}

// The metrics endpoint (eventbox.metrics_address). Gauges are queried at most once a second;
// every scrape gets the counters as they are and the gauges of that query.
metrics::HttpServer* http = nullptr;
TimestampTz next_listen_attempt = 0;
MemoryContext gauge_context = nullptr;
metrics::Gauges gauges;
TimestampTz gauges_at = 0;
worker::LogRate gauge_log = {1, 60000};

void close_http(int, Datum) {
    delete http;
    http = nullptr;
}

void open_http() {
    if (http != nullptr || guc::metrics_address == nullptr || guc::metrics_address[0] == '\0')
        return;
    TimestampTz now = GetCurrentTimestamp();
    if (now < next_listen_attempt) return;
    char error[256] = "";
    http = call_cpp([&]() -> metrics::HttpServer* {
        try {
            return new metrics::HttpServer(guc::metrics_address, metrics::HttpLimits{});
        } catch (const std::exception& e) {
            snprintf(error, sizeof error, "%s", e.what());
            return nullptr;
        }
    });
    if (http == nullptr) {
        ereport(WARNING, (errmsg("eventbox supervisor: %s", error),
                          errdetail("Trying again in 60 s.")));
        next_listen_attempt = TimestampTzPlusMilliseconds(now, 60000);
    } else {
        ereport(LOG, (errmsg("eventbox supervisor serving metrics on http://%s/metrics",
                             guc::metrics_address)));
    }
}

// Pending counts between exact counts (metrics/pending_estimate.hpp).
metrics::PendingEstimate* pending_estimate = nullptr;

int64 outbox_balance(const metrics::Counters& c) {
    return static_cast<int64>(c.outbox_added - c.outbox_settled);
}

int64 inbox_balance(const metrics::Counters& c, const char* subscription) {
    for (int i = 0; i < c.n_subscriptions; ++i)
        if (!c.subscriptions[i].overflow &&
            strncmp(c.subscriptions[i].name, subscription, NAMEDATALEN) == 0)
            return metrics::inbox_pending_balance(c.subscriptions[i]);
    return 0;  // no batch counted yet
}

// An exact count; the balances `c` are read before it, so a batch committed meanwhile is
// counted by both (until the next count) rather than by neither.
void count_gauges(const metrics::Counters& c) {
    int64 started = worker::now_ms();
    MemoryContextReset(gauge_context);
    metrics::query_gauges(&gauges, gauge_context, metrics::GaugeCost::kCounted);
    int64 took = worker::now_ms() - started;
    call_cpp([&] {
        pending_estimate->start_count(started);
        pending_estimate->set_outbox(gauges.outbox_pending, outbox_balance(c));
        for (int i = 0; i < gauges.n_inbox; ++i)
            pending_estimate->set_inbox(gauges.inbox[i].subscription, gauges.inbox[i].pending,
                                        inbox_balance(c, gauges.inbox[i].subscription));
        pending_estimate->end_count(took);
    });
}

void refresh_pending(void*) {
    if (pending_estimate == nullptr)
        pending_estimate = call_cpp([] { return new metrics::PendingEstimate(); });
    metrics::Counters c;
    metrics::snapshot(&c);
    if (call_cpp([&] {
            int64 waiting = pending_estimate->total(
                outbox_balance(c),
                [&](const std::string& name) { return inbox_balance(c, name.c_str()); });
            return pending_estimate->count_due(worker::now_ms(), waiting);
        })) {
        count_gauges(c);
        return;
    }
    MemoryContextReset(gauge_context);
    metrics::query_gauges(&gauges, gauge_context, metrics::GaugeCost::kHeads);
    bool missing = call_cpp([&] {
        gauges.outbox_pending = pending_estimate->outbox(outbox_balance(c));
        for (int i = 0; i < gauges.n_inbox; ++i) {
            metrics::InboxGauge& g = gauges.inbox[i];
            if (!pending_estimate->inbox(g.subscription, inbox_balance(c, g.subscription),
                                         &g.pending))
                return true;
        }
        return false;
    });
    if (missing) count_gauges(c);  // a subscription created since the last count
}

void refresh_gauges(void* arg) {
    refresh_pending(arg);
    gauges.counts = pending_estimate->counts();
    gauges.count_seconds = static_cast<double>(pending_estimate->took_ms()) / 1000.0;
}

// Answers the scrapes waiting for a body.
void serve_scrapes(bool schema_ok) {
    if (http == nullptr || call_cpp([] { return http->pending(); }) == 0) return;
    TimestampTz now = GetCurrentTimestamp();
    if (!schema_ok) {
        gauges.valid = false;
    } else if (!gauges.valid || TimestampDifferenceExceeds(gauges_at, now, 1000)) {
        gauges.valid = false;
        if (run_in_transaction(refresh_gauges, nullptr, "metrics gauges", &gauge_log))
            gauges_at = now;
        else
            gauges.valid = false;
    }
    metrics::Counters counters;
    metrics::snapshot(&counters);
    size_t len;
    char* text = metrics::render(counters, &gauges, &len);
    int64 at = worker::now_ms();
    call_cpp([&] { http->respond(std::string_view(text, len), at); });
}

// Waits for the latch, postmaster death, the endpoint's sockets or `timeout_ms`.
void supervisor_wait(long timeout_ms) {
    int n_watch = 0;
    metrics::HttpServer::Watch* watch = nullptr;
    bool listen = false;
    if (http != nullptr) {
        int64 deadline = call_cpp([] { return http->next_deadline_ms(); });
        if (deadline != INT64_MAX) timeout_ms = Min(timeout_ms, Max(deadline - worker::now_ms(), 0L));
        listen = call_cpp([] { return http->accepting(); });
        call_cpp([&] {
            std::vector<metrics::HttpServer::Watch> w = http->watches();
            n_watch = static_cast<int>(w.size());
            watch = static_cast<metrics::HttpServer::Watch*>(
                pg::pg_guard([&] { return palloc(sizeof(metrics::HttpServer::Watch) * (w.size() + 1)); }));
            std::copy(w.begin(), w.end(), watch);
        });
    }
    WaitEventSet* set = CreateWaitEventSet(CurrentMemoryContext, 3 + n_watch);
    AddWaitEventToSet(set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, nullptr);
    AddWaitEventToSet(set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, nullptr, nullptr);
    if (listen) AddWaitEventToSet(set, WL_SOCKET_READABLE, http->listen_fd(), nullptr, nullptr);
    for (int i = 0; i < n_watch; ++i)
        AddWaitEventToSet(set, watch[i].write ? WL_SOCKET_WRITEABLE : WL_SOCKET_READABLE,
                          watch[i].fd, nullptr, nullptr);
    WaitEvent event;
    (void)WaitEventSetWait(set, Max(timeout_ms, 0L), &event, 1, PG_WAIT_EXTENSION);
    FreeWaitEventSet(set);
    ResetLatch(MyLatch);
    if (http != nullptr) {
        int64 now = worker::now_ms();
        call_cpp([&] { http->step(now); });
    }
}

}  // namespace

}  // namespace eventbox

extern "C" PGDLLEXPORT void eventbox_launcher_main(Datum);
extern "C" PGDLLEXPORT void eventbox_supervisor_main(Datum);

extern "C" void eventbox_launcher_main(Datum) {
    using namespace eventbox;
    worker::setup_signals();
    // No database: connecting to a missing one would be FATAL, and this process must stay to
    // say so once and wait for it.
    BackgroundWorkerInitializeConnection(nullptr, nullptr, 0);
    pgstat_report_activity(STATE_IDLE, nullptr);
    bool warned = false;
    int missing_backoff_ms = 1000;
    for (;;) {
        long timeout_ms = 10000;  // the supervisor's exit sets our latch (bgw_notify_pid)
        if (!is_running(supervisor) && !still_stopping(supervisor)) {
            served_database = lookup_database();
            if (!OidIsValid(served_database)) {
                if (!warned)
                    ereport(WARNING,
                            (errmsg("eventbox.database \"%s\" does not exist", guc::database),
                             errdetail("The pg_eventbox workers start once it exists; checked "
                                       "again with a backoff of up to 60 s."),
                             errhint("Create the database, or set eventbox.database to an "
                                     "existing one and restart the server.")));
                warned = true;
                timeout_ms = missing_backoff_ms;
                missing_backoff_ms = Min(missing_backoff_ms * 2, 60000);
            } else {
                if (warned)
                    ereport(LOG, (errmsg("eventbox.database \"%s\" exists now", guc::database)));
                warned = false;
                missing_backoff_ms = 1000;
                timeout_ms = Min(supervise(supervisor), 10000L);
            }
        }
        (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
                        Max(timeout_ms, 1L), PG_WAIT_EXTENSION);
        ResetLatch(MyLatch);
        CHECK_FOR_INTERRUPTS();
        worker::reload_if_requested();
    }
}

namespace {

void stop_all_workers() {
    using namespace eventbox;
    stop(relay);
    for (int i = 0; i < shmem::kMaxIngestWorkers; ++i) stop(ingest_workers[i]);
    for (int i = 0; i < shmem::kMaxHandlerWorkers; ++i) stop(handler_workers[i]);
}

}  // namespace

extern "C" void eventbox_supervisor_main(Datum arg) {
    using namespace eventbox;
    worker::setup_signals();
    BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(arg), InvalidOid, 0);
    served_database = MyDatabaseId;
    shmem::attach_worker(shmem::Role::kLauncher);
    pgstat_report_activity(STATE_IDLE, nullptr);
    // Planner settings of the workers for the purge and the gauge queries.
    worker::apply_worker_settings(true);
    before_shmem_exit(close_http, 0);
    gauge_context = AllocSetContextCreate(TopMemoryContext, "eventbox metrics gauges",
                                          ALLOCSET_SMALL_SIZES);
    MemoryContext loop_context = AllocSetContextCreate(TopMemoryContext, "eventbox supervisor",
                                                       ALLOCSET_DEFAULT_SIZES);

    for (int i = 0; i < shmem::kMaxIngestWorkers; ++i)
        ingest_workers[i] = {"eventbox_ingest_main", "eventbox ingest", i, nullptr, nullptr, 0, 0,
                             1000};
    for (int i = 0; i < shmem::kMaxHandlerWorkers; ++i)
        handler_workers[i] = {"eventbox_handler_main", "eventbox handler", i, nullptr, nullptr, 0,
                              0, 1000};
    bool announced_wait = false;
    char announced_version[64] = "";
    Oid served_extension = InvalidOid;  // the extension the running workers were started for
    for (;;) {
        MemoryContextSwitchTo(loop_context);
        MemoryContextReset(loop_context);
        long timeout_ms = 1000;  // how soon to look at the extension again
        bool schema_ok = false;
        open_http();
        pg::ExtensionState ext = read_extension_state();
        if (OidIsValid(served_extension) && ext.oid != served_extension) {
            // Dropped, or dropped and created again: workers started for the old one hold its
            // plans, row types and cursors. They stop; fresh ones start for the new one.
            ereport(LOG, (errmsg("pg_eventbox was dropped or re-created in database \"%s\"; "
                                 "restarting its workers",
                                 guc::database)));
            stop_all_workers();
            served_extension = InvalidOid;
        }
        if (pg::schema_matches(ext)) {
            if (announced_wait || announced_version[0] != '\0')
                ereport(LOG, (errmsg("pg_eventbox %s found in database \"%s\"; starting workers",
                                     ext.version, guc::database)));
            announced_wait = false;
            announced_version[0] = '\0';
            served_extension = ext.oid;
            shmem::set_state("supervising");
            timeout_ms = Min(supervise(relay), timeout_ms);
            // eventbox.ingest_workers follows reloads: the ones beyond it are stopped (the
            // others take their partitions over at the stored offsets).
            for (int i = 0; i < shmem::kMaxIngestWorkers; ++i) {
                if (i < guc::ingest_workers) timeout_ms = Min(timeout_ms, supervise(ingest_workers[i]));
                else stop(ingest_workers[i]);
            }
            for (int i = 0; i < guc::handler_workers; ++i)
                timeout_ms = Min(timeout_ms, supervise(handler_workers[i]));
            schema_ok = true;
            timeout_ms = Min(timeout_ms, retention_step());
            timeout_ms = Min(timeout_ms, counter_sweep_step());
        } else if (OidIsValid(ext.oid)) {
            // A library of another version than the schema: the workers would misread the
            // tables. One WARNING per version seen, then wait for ALTER EXTENSION ... UPDATE.
            if (strcmp(announced_version, ext.version) != 0)
                ereport(WARNING,
                        (errmsg("pg_eventbox library %s does not match the schema version %s "
                                "installed in database \"%s\"; its workers wait",
                                pg::kLibraryVersion, ext.version, guc::database),
                         errhint("Run ALTER EXTENSION pg_eventbox UPDATE in that database.")));
            strlcpy(announced_version, ext.version, sizeof announced_version);
            stop_all_workers();
            shmem::set_state("waiting for ALTER EXTENSION UPDATE");
        } else {
            if (!announced_wait)
                ereport(LOG, (errmsg("eventbox launcher waiting for CREATE EXTENSION pg_eventbox "
                                     "in database \"%s\"",
                                     guc::database)));
            announced_wait = true;
            announced_version[0] = '\0';
            stop_all_workers();
            shmem::set_state("waiting for extension");
        }
        serve_scrapes(schema_ok);
        supervisor_wait(Max(timeout_ms, 1L));
        serve_scrapes(schema_ok);
        CHECK_FOR_INTERRUPTS();
        worker::reload_if_requested();
    }
}
