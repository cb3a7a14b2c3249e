// The launcher: waits for the extension in eventbox.database, starts the dynamic workers, restarts
// a dead one with backoff, and stops them when the extension is dropped.
extern "C" {
#include "postgres.h"

#include "access/xact.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
}

#include <climits>

#include "pg/guc.hpp"
#include "pg/shmem.hpp"
#include "workers/common.hpp"

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

Managed relay = {"eventbox_relay_main", "eventbox relay", 0, nullptr, nullptr, 0, 0, 1000};
Managed ingest_workers[shmem::kMaxIngestWorkers];
Managed handler_workers[shmem::kMaxHandlerWorkers];

constexpr int kMinBackoffMs = 1000;
constexpr int kMaxBackoffMs = 60000;
// A worker that lived this long before dying is restarted without growing the backoff.
constexpr int kHealthyRunMs = 60000;

bool extension_exists() {
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    bool exists = OidIsValid(get_extension_oid("pg_eventbox", true));
    CommitTransactionCommand();
    return exists;
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
    worker.bgw_main_arg = ObjectIdGetDatum(MyDatabaseId);
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

}  // namespace

}  // namespace eventbox

extern "C" PGDLLEXPORT void eventbox_launcher_main(Datum);

extern "C" void eventbox_launcher_main(Datum) {
    using namespace eventbox;
    worker::setup_signals();
    BackgroundWorkerInitializeConnection(guc::database, nullptr, 0);
    shmem::attach_worker(shmem::Role::kLauncher);
    pgstat_report_activity(STATE_IDLE, nullptr);

    for (int i = 0; i < shmem::kMaxIngestWorkers; ++i)
        ingest_workers[i] = {"eventbox_ingest_main", "eventbox ingest", i, nullptr, nullptr, 0, 0,
                             1000};
    for (int i = 0; i < shmem::kMaxHandlerWorkers; ++i)
        handler_workers[i] = {"eventbox_handler_main", "eventbox handler", i, nullptr, nullptr, 0,
                              0, 1000};
    bool announced_wait = false;
    for (;;) {
        long timeout_ms = 1000;  // how soon to look for the extension again
        if (extension_exists()) {
            if (announced_wait)
                ereport(LOG, (errmsg("pg_eventbox found in database \"%s\"; starting workers",
                                     guc::database)));
            announced_wait = false;
            shmem::set_state("supervising");
            timeout_ms = Min(supervise(relay), 10000L);
            // eventbox.ingest_workers follows reloads: the ones beyond it are stopped (the
            // others take their partitions over at the stored offsets).
            for (int i = 0; i < shmem::kMaxIngestWorkers; ++i) {
                if (i < guc::ingest_workers) timeout_ms = Min(timeout_ms, supervise(ingest_workers[i]));
                else stop(ingest_workers[i]);
            }
            for (int i = 0; i < guc::handler_workers; ++i)
                timeout_ms = Min(timeout_ms, supervise(handler_workers[i]));
        } else {
            if (!announced_wait)
                ereport(LOG, (errmsg("eventbox launcher waiting for CREATE EXTENSION pg_eventbox "
                                     "in database \"%s\"",
                                     guc::database)));
            announced_wait = true;
            stop(relay);
            for (int i = 0; i < shmem::kMaxIngestWorkers; ++i) stop(ingest_workers[i]);
            for (int i = 0; i < guc::handler_workers; ++i) stop(handler_workers[i]);
            shmem::set_state("waiting for extension");
        }
        (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
                        Max(timeout_ms, 1L), PG_WAIT_EXTENSION);
        ResetLatch(MyLatch);
        CHECK_FOR_INTERRUPTS();
        worker::reload_if_requested();
    }
}
