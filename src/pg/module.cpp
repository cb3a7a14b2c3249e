// Module entry: settings, shared memory and the launcher, only when preloaded.
extern "C" {
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"

PG_MODULE_MAGIC;

void _PG_init(void);
}

#include "metrics/counters.hpp"
#include "outbox/http_relay.hpp"
#include "pg/extension.hpp"
#include "pg/guc.hpp"
#include "pg/shmem.hpp"

extern "C" void _PG_init(void) {
    eventbox::guc::define();
    // Workers and shared state need shared_preload_libraries; send() works without them.
    if (!process_shared_preload_libraries_in_progress || IsBinaryUpgrade) return;
    eventbox::shmem::install_hooks();
    eventbox::metrics::install_hooks();
    eventbox::http_relay::install_hooks();
    eventbox::pg::install_extension_hook();

    BackgroundWorker worker;
    memset(&worker, 0, sizeof worker);
    worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
    worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
    worker.bgw_restart_time = 10;  // it exits only on errors it cannot handle
    snprintf(worker.bgw_library_name, BGW_MAXLEN, "pg_eventbox");
    snprintf(worker.bgw_function_name, BGW_MAXLEN, "eventbox_launcher_main");
    snprintf(worker.bgw_name, BGW_MAXLEN, "eventbox launcher");
    snprintf(worker.bgw_type, BGW_MAXLEN, "eventbox launcher");
    RegisterBackgroundWorker(&worker);
}
