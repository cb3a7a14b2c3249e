// Shared worker set-up (see worker_common.hpp).
#include "worker_common.hpp"

extern "C" {
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
}

namespace eventbox::worker {

void setup_signals() {
    pqsignal(SIGTERM, die);
    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    BackgroundWorkerUnblockSignals();
}

void apply_worker_settings(bool async_commit) {
    // The workers' queries are tiny and run constantly: JIT compilation only costs time, and a
    // generic plan kept across batches avoids re-planning.
    SetConfigOption("jit", "off", PGC_SUSET, PGC_S_OVERRIDE);
    SetConfigOption("plan_cache_mode", "force_generic_plan", PGC_SUSET, PGC_S_OVERRIDE);
    // Every worker query is meant to walk an index. A generic plan built while a table was empty
    // (or its statistics stale) would otherwise read the whole table and sort it on every batch.
    SetConfigOption("enable_seqscan", "off", PGC_SUSET, PGC_S_OVERRIDE);
    SetConfigOption("enable_sort", "off", PGC_SUSET, PGC_S_OVERRIDE);
    SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);
    // A lost relay commit only means a message is sent again (at-least-once), never lost.
    if (async_commit) SetConfigOption("synchronous_commit", "off", PGC_SUSET, PGC_S_OVERRIDE);
}

bool reload_if_requested() {
    if (!ConfigReloadPending) return false;
    ConfigReloadPending = false;
    ProcessConfigFile(PGC_SIGHUP);
    return true;
}

}  // namespace eventbox::worker
