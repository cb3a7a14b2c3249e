// Shared worker set-up (see workers/common.hpp).
#include "workers/common.hpp"

extern "C" {
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "access/xact.h"
#include "pgstat.h"
#include "postmaster/interrupt.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "jit/jit.h"
#include "optimizer/cost.h"
#include "utils/guc.h"
#include "utils/plancache.h"
#include "utils/timestamp.h"
}

#include "kafka/client.hpp"
#include "pg/boundary.hpp"
#include "pg/shmem.hpp"

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
    // Their joins are a short unnest() list against a primary key: nested loops only.
    SetConfigOption("enable_hashjoin", "off", PGC_SUSET, PGC_S_OVERRIDE);
    SetConfigOption("enable_mergejoin", "off", PGC_SUSET, PGC_S_OVERRIDE);
    // Session level, not override: a handler's own search_path (set like a function's SET clause)
    // must be able to take its place while it runs.
    SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_SESSION);
    // A lost relay commit only means a message is sent again (at-least-once), never lost.
    if (async_commit) SetConfigOption("synchronous_commit", "off", PGC_SUSET, PGC_S_OVERRIDE);
}

bool reload_if_requested() {
    if (!ConfigReloadPending) return false;
    ConfigReloadPending = false;
    ProcessConfigFile(PGC_SIGHUP);
    return true;
}

namespace {
TimestampTz last_warning = 0;
int suppressed_warnings = 0;
constexpr int kWarningIntervalMs = 10000;
}  // namespace

void emit_kafka_logs(kafka::ClientEvents& client, const char* who) {
    std::size_t n = pg::call_cpp([&] { return client.logs().size(); });
    for (std::size_t i = 0; i < n; ++i) {
        const kafka::LogLine& line = client.logs()[i];
        if (line.level > 4) {
            elog(DEBUG1, "%s: kafka: %s", who, line.text.c_str());
            continue;
        }
        TimestampTz now = GetCurrentTimestamp();
        if (last_warning != 0 && !TimestampDifferenceExceeds(last_warning, now, kWarningIntervalMs)) {
            ++suppressed_warnings;
            continue;
        }
        ereport(LOG, (errmsg("%s: kafka: %s", who, line.text.c_str()),
                      suppressed_warnings
                          ? errdetail("%d similar messages suppressed.", suppressed_warnings)
                          : 0));
        shmem::record_error(line.text.c_str());
        last_warning = now;
        suppressed_warnings = 0;
    }
    pg::call_cpp([&] { client.logs().clear(); });
}

int64 now_ms() { return GetCurrentTimestamp() / 1000; }

bool log_allowed(LogRate& rate, int* held_back) {
    int64 now = now_ms();
    if (rate.window_start_ms == 0 || now - rate.window_start_ms >= rate.window_ms) {
        rate.window_start_ms = now;
        rate.lines = 0;
    }
    if (rate.lines >= rate.burst) {
        ++rate.held_back;
        return false;
    }
    ++rate.lines;
    *held_back = rate.held_back;
    rate.held_back = 0;
    return true;
}

void recover_from_error(MemoryContext batch_context, void (*cleanup)(), int* backoff_ms) {
    error_context_stack = nullptr;
    HOLD_INTERRUPTS();
    EmitErrorReport();
    MemoryContextSwitchTo(TopMemoryContext);
    ErrorData* edata = CopyErrorData();
    shmem::record_error(edata->message);
    FreeErrorData(edata);
    AbortCurrentTransaction();
    if (cleanup != nullptr) cleanup();
    FlushErrorState();
    MemoryContextReset(batch_context);
    RESUME_INTERRUPTS();
    *backoff_ms = Min(Max(*backoff_ms * 2, 1000), 30000);
    shmem::set_state("error backoff");
    (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, *backoff_ms,
                    PG_WAIT_EXTENSION);
    ResetLatch(MyLatch);
    CHECK_FOR_INTERRUPTS();
}

SPIPlanPtr prepare_kept(const char* who, const char* sql, int nargs, Oid* types) {
    SPIPlanPtr plan = SPI_prepare(sql, nargs, types);
    if (plan == nullptr)
        elog(ERROR, "%s: could not prepare \"%s\": %s", who, sql,
             SPI_result_code_string(SPI_result));
    if (SPI_keepplan(plan) != 0) elog(ERROR, "%s: SPI_keepplan failed", who);
    return plan;
}

namespace {

// Sets a boolean planner setting to off for the current GUC nest level, opening it first.
void planner_off(int* nest, const char* name) {
    if (*nest < 0) *nest = NewGUCNestLevel();
    (void)set_config_option(name, "off", PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0,
                            false);
}

}  // namespace

void exec_kept(const char* who, SPIPlanPtr plan, Datum* values, bool read_only, int expected,
               Access access) {
    int nest = -1;
    if (enable_seqscan) planner_off(&nest, "enable_seqscan");
    if (enable_sort) planner_off(&nest, "enable_sort");
    if (enable_hashjoin) planner_off(&nest, "enable_hashjoin");
    if (enable_mergejoin) planner_off(&nest, "enable_mergejoin");
    if (jit_enabled) planner_off(&nest, "jit");
    if (plan_cache_mode != PLAN_CACHE_MODE_FORCE_GENERIC_PLAN) {
        if (nest < 0) nest = NewGUCNestLevel();
        (void)set_config_option("plan_cache_mode", "force_generic_plan", PGC_USERSET,
                                PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
    }
    if (access == Access::kTid) {
        if (enable_indexscan) planner_off(&nest, "enable_indexscan");
        if (enable_indexonlyscan) planner_off(&nest, "enable_indexonlyscan");
        if (enable_bitmapscan) planner_off(&nest, "enable_bitmapscan");
    }
    int rc = SPI_execute_plan(plan, values, nullptr, read_only, 0);
    if (rc != expected) elog(ERROR, "%s: query failed: %s", who, SPI_result_code_string(rc));
    // An ERROR above leaves the settings to the (sub)transaction's abort, which restores them.
    if (nest >= 0) AtEOXact_GUC(true, nest);
}

}  // namespace eventbox::worker
