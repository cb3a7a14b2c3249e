// Two kinds of process keep the workers running:
// - the launcher (registered in _PG_init, connected to no database) waits for each database
//   eventbox.database lists to exist, saying so once as a WARNING while one does not, and keeps
//   one supervisor per database running;
// - a supervisor (connected to its database) waits for the extension at the schema version
//   of this library, starts the dynamic workers, restarts a dead one with backoff, and stops
//   them when the extension is dropped, re-created or its schema is not this library's.
// Extension changes wake the supervisor when they commit (pg/extension.cpp); a one-second
// check backs that up.
// Besides, the supervisor runs inbox retention (workers/retention.cpp) and the metrics endpoint
// (metrics/endpoint.cpp).
extern "C" {
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/latch.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
}

#include <climits>

#include "metrics/counters.hpp"
#include "metrics/endpoint.hpp"
#include "pg/extension.hpp"
#include "pg/guc.hpp"
#include "pg/shmem.hpp"
#include "workers/common.hpp"
#include "workers/supervisor.hpp"

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

// The launcher's: one supervisor per database of eventbox.database (index: its group).
Managed supervisors[shmem::kMaxDatabases];
// In a supervisor: the name of its database (passed in bgw_extra after the index).
char served_name[NAMEDATALEN] = "";
Managed relay = {"eventbox_relay_main", "eventbox relay", 0, nullptr, nullptr, 0, 0, 1000};
Managed ingest_workers[shmem::kMaxIngestWorkers];
Managed handler_workers[shmem::kMaxHandlerWorkers];

constexpr int kMinBackoffMs = 1000;
constexpr int kMaxBackoffMs = 60000;
// A worker that lived this long before dying is restarted without growing the backoff.
constexpr int kHealthyRunMs = 60000;

// The database the started workers connect to (the launcher: of the supervisor at hand).
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
Oid lookup_database(const char* name) {
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    (void)GetTransactionSnapshot();
    Relation rel = table_open(DatabaseRelationId, AccessShareLock);
    ScanKeyData key;
    ScanKeyInit(&key, Anum_pg_database_datname, BTEqualStrategyNumber, F_NAMEEQ,
                CStringGetDatum(name));
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
    metrics::worker_restarted(role_of(w), served_database);
    ereport(LOG, (errmsg("%s exited; restarting it in %d ms", w.type, w.backoff_ms)));
    return false;
}

void start(Managed& w, const char* database_name) {
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
    strlcpy(worker.bgw_extra + sizeof w.index, database_name, NAMEDATALEN);
    worker.bgw_notify_pid = MyProcPid;
    w.started_at = GetCurrentTimestamp();
    if (!RegisterDynamicBackgroundWorker(&worker, &w.handle)) {
        w.handle = nullptr;
        w.backoff_ms = Min(w.backoff_ms * 2, kMaxBackoffMs);
        w.next_start = TimestampTzPlusMilliseconds(w.started_at, w.backoff_ms);
        ereport(WARNING, (errmsg("could not start %s: no free background worker slot", w.type),
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
long supervise(Managed& w, const char* database_name = served_name) {
    if (is_running(w)) return LONG_MAX;
    if (still_stopping(w)) return 100;
    TimestampTz now = GetCurrentTimestamp();
    if (now < w.next_start) return TimestampDifferenceMilliseconds(now, w.next_start);
    start(w, database_name);
    return w.handle ? LONG_MAX : w.backoff_ms;
}

}  // namespace

namespace supervisor {

bool run_in_transaction(void (*fn)(void*), void* arg, const char* what, worker::LogRate* rate) {
    MemoryContext outer = CurrentMemoryContext;
    volatile bool ok = true;
    PG_TRY();
    {
        if (worker::try_begin_work("eventbox supervisor")) {
            fn(arg);
            worker::end_work();
        } else {
            ok = false;  // dropped or re-created while it waited: the supervisor's check sees it
        }
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

}  // namespace supervisor

namespace {

void stop_all_workers() {
    stop(relay);
    for (int i = 0; i < shmem::kMaxIngestWorkers; ++i) stop(ingest_workers[i]);
    for (int i = 0; i < shmem::kMaxHandlerWorkers; ++i) stop(handler_workers[i]);
}

// What the supervisor said last, so that each state is announced once.
bool announced_wait = false;
char announced_version[64] = "";
Oid served_extension = InvalidOid;  // the extension the running workers were started for

// The extension at this library's schema version: its workers are kept running (the ingest
// workers beyond eventbox.ingest_workers stopped), retention and the counter sweep run.
// Returns milliseconds until something needs attention.
long serve_extension(const pg::ExtensionState& ext) {
    if (announced_wait || announced_version[0] != '\0')
        ereport(LOG, (errmsg("pg_eventbox %s found in database \"%s\"; starting workers",
                             ext.version, served_name)));
    announced_wait = false;
    announced_version[0] = '\0';
    served_extension = ext.oid;
    shmem::set_state("supervising");
    long timeout_ms = Min(supervise(relay), 1000L);  // how soon to look at the extension again
    // eventbox.ingest_workers follows reloads: the ones beyond it are stopped (the others take
    // their partitions over at the stored offsets).
    for (int i = 0; i < shmem::kMaxIngestWorkers; ++i) {
        if (i < guc::ingest_workers)
            timeout_ms = Min(timeout_ms, supervise(ingest_workers[i]));
        else
            stop(ingest_workers[i]);
    }
    for (int i = 0; i < guc::handler_workers; ++i)
        timeout_ms = Min(timeout_ms, supervise(handler_workers[i]));
    timeout_ms = Min(timeout_ms, supervisor::retention_step());
    timeout_ms = Min(timeout_ms, metrics::endpoint::sweep_step());
    return timeout_ms;
}

// A library of another version than the schema: the workers would misread the tables. One
// WARNING per version seen, then wait for ALTER EXTENSION ... UPDATE.
void wait_for_update(const pg::ExtensionState& ext) {
    if (strcmp(announced_version, ext.version) != 0)
        ereport(WARNING, (errmsg("pg_eventbox library %s does not match the schema version %s "
                                 "installed in database \"%s\"; its workers wait",
                                 pg::kLibraryVersion, ext.version, served_name),
                          errhint("Run ALTER EXTENSION pg_eventbox UPDATE in that database.")));
    strlcpy(announced_version, ext.version, sizeof announced_version);
    stop_all_workers();
    shmem::set_state("waiting for ALTER EXTENSION UPDATE");
}

void wait_for_extension() {
    if (!announced_wait)
        ereport(LOG, (errmsg("eventbox launcher waiting for CREATE EXTENSION pg_eventbox "
                             "in database \"%s\"",
                             served_name)));
    announced_wait = true;
    announced_version[0] = '\0';
    stop_all_workers();
    shmem::set_state("waiting for extension");
}

void supervisor_start(MemoryContext) {
    served_database = MyDatabaseId;
    strlcpy(served_name, MyBgworkerEntry->bgw_extra + sizeof(int), sizeof served_name);
    int group = 0;
    memcpy(&group, MyBgworkerEntry->bgw_extra, sizeof group);
    pgstat_report_activity(STATE_IDLE, nullptr);
    // With several databases, each supervisor serves its own database's metrics, on the port of
    // eventbox.metrics_address plus its position in the list, each series labelled database.
    metrics::endpoint::start(group, strchr(guc::database, ',') != nullptr ? served_name : nullptr);
    for (int i = 0; i < shmem::kMaxIngestWorkers; ++i)
        ingest_workers[i] = {
            "eventbox_ingest_main", "eventbox ingest", i, nullptr, nullptr, 0, 0, 1000};
    for (int i = 0; i < shmem::kMaxHandlerWorkers; ++i)
        handler_workers[i] = {
            "eventbox_handler_main", "eventbox handler", i, nullptr, nullptr, 0, 0, 1000};
}

// One look at the extension, what follows from it, and a wait.
void supervisor_turn(MemoryContext) {
    long timeout_ms = 1000;  // how soon to look at the extension again
    bool schema_ok = false;
    metrics::endpoint::open_listener();
    pg::ExtensionState ext = read_extension_state();
    if (OidIsValid(served_extension) && ext.oid != served_extension) {
        // Dropped, or dropped and created again: workers started for the old one hold its
        // plans, row types and cursors. They stop; fresh ones start for the new one.
        ereport(LOG, (errmsg("pg_eventbox was dropped or re-created in database \"%s\"; "
                             "restarting its workers",
                             served_name)));
        stop_all_workers();
        served_extension = InvalidOid;
    }
    if (pg::schema_matches(ext)) {
        timeout_ms = serve_extension(ext);
        schema_ok = true;
    } else if (OidIsValid(ext.oid)) {
        wait_for_update(ext);
    } else {
        wait_for_extension();
    }
    metrics::endpoint::serve_scrapes(schema_ok);
    metrics::endpoint::wait_for_events(Max(timeout_ms, 1L));
    metrics::endpoint::serve_scrapes(schema_ok);
    CHECK_FOR_INTERRUPTS();
    worker::reload_if_requested();
}

// The launcher's view of each database of eventbox.database.
struct ListedDatabase {
    char name[NAMEDATALEN];
    Oid oid;
    bool warned;  // that it does not exist
    int missing_backoff_ms;
    TimestampTz next_lookup;
};
ListedDatabase listed[shmem::kMaxDatabases];

// Splits eventbox.database (checked by its GUC hook) into `listed`; returns how many.
int split_database_list() {
    int n = 0;
    const char* item = guc::database;
    while (item != nullptr && n < shmem::kMaxDatabases) {
        const char* comma = strchr(item, ',');
        size_t len = comma ? static_cast<size_t>(comma - item) : strlen(item);
        while (len > 0 && (*item == ' ' || *item == '\t')) ++item, --len;
        while (len > 0 && (item[len - 1] == ' ' || item[len - 1] == '\t')) --len;
        ListedDatabase& d = listed[n++];
        memset(&d, 0, sizeof d);
        memcpy(d.name, item, Min(len, static_cast<size_t>(NAMEDATALEN - 1)));
        d.missing_backoff_ms = 1000;
        item = comma ? comma + 1 : nullptr;
    }
    return n;
}

// Keeps the supervisor of listed database `i` running while the database exists; returns
// milliseconds until it next needs attention.
long keep_supervisor(int i) {
    ListedDatabase& d = listed[i];
    Managed& w = supervisors[i];
    served_database = d.oid;
    if (is_running(w) || still_stopping(w)) return 10000;
    TimestampTz now = GetCurrentTimestamp();
    if (now < d.next_lookup) return TimestampDifferenceMilliseconds(now, d.next_lookup);
    d.oid = served_database = lookup_database(d.name);
    if (!OidIsValid(d.oid)) {
        if (!d.warned)
            ereport(WARNING,
                    (errmsg("eventbox.database \"%s\" does not exist", d.name),
                     errdetail("The pg_eventbox workers of that database start once it exists; "
                               "checked again with a backoff of up to 60 s."),
                     errhint("Create the database, or remove it from eventbox.database and "
                             "restart the server.")));
        d.warned = true;
        d.next_lookup = TimestampTzPlusMilliseconds(now, d.missing_backoff_ms);
        long wait = d.missing_backoff_ms;
        d.missing_backoff_ms = Min(d.missing_backoff_ms * 2, 60000);
        return wait;
    }
    if (d.warned) ereport(LOG, (errmsg("eventbox.database \"%s\" exists now", d.name)));
    d.warned = false;
    d.missing_backoff_ms = 1000;
    shmem::set_database(i, d.oid);
    return Min(supervise(w, d.name), 10000L);
}

}  // namespace

}  // namespace eventbox

extern "C" PGDLLEXPORT void eventbox_launcher_main(Datum);
extern "C" PGDLLEXPORT void eventbox_supervisor_main(Datum);

// The launcher cannot start through worker::run_worker(): it connects to no database (the one
// it waits for may not exist), holds no worker slot and runs no statements.
extern "C" void eventbox_launcher_main(Datum) {
    using namespace eventbox;
    worker::setup_signals();
    // No database: connecting to a missing one would be FATAL, and this process must stay to
    // say so once and wait for it.
    BackgroundWorkerInitializeConnection(nullptr, nullptr, 0);
    pgstat_report_activity(STATE_IDLE, nullptr);
    int n = split_database_list();
    for (int i = 0; i < n; ++i)
        supervisors[i] = {
            "eventbox_supervisor_main", "eventbox supervisor", i, nullptr, nullptr, 0, 0, 1000};
    for (;;) {
        long timeout_ms = 10000;  // a supervisor's exit sets our latch (bgw_notify_pid)
        for (int i = 0; i < n; ++i) timeout_ms = Min(timeout_ms, keep_supervisor(i));
        (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
                        Max(timeout_ms, 1L), PG_WAIT_EXTENSION);
        ResetLatch(MyLatch);
        CHECK_FOR_INTERRUPTS();
        worker::reload_if_requested();
    }
}

// Planner settings of the workers (async commit on) for the purge and the gauge queries.
extern "C" void eventbox_supervisor_main(Datum arg) {
    using namespace eventbox;
    worker::run_worker(arg,
                       worker::WorkerMain{shmem::Role::kSupervisor, 0, true, "eventbox supervisor",
                                          supervisor_start, nullptr, supervisor_turn});
}
