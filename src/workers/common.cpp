// Shared worker set-up (see workers/common.hpp).
#include "workers/common.hpp"

extern "C" {
#include "access/xact.h"
#include "jit/jit.h"
#include "miscadmin.h"
#include "optimizer/cost.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/plancache.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
}

#include "kafka/client.hpp"
#include "pg/boundary.hpp"
#include "pg/extension.hpp"
#include "pg/shmem.hpp"

namespace eventbox::worker {

void setup_signals() {
    pqsignal(SIGTERM, die);
    pqsignal(SIGHUP, SignalHandlerForConfigReload);
    BackgroundWorkerUnblockSignals();
}

namespace {

// What begin_work() opens after the schema lock.
void connect_spi(const char* who) {
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "%s: SPI_connect failed", who);
    PushActiveSnapshot(GetTransactionSnapshot());
}

}  // namespace

void begin_work(const char* who) {
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    pg::lock_schema_or_exit();
    connect_spi(who);
}

bool try_begin_work(const char* who) {
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    if (!pg::lock_schema_for_work()) {
        CommitTransactionCommand();
        return false;
    }
    connect_spi(who);
    return true;
}

void end_work() {
    PopActiveSnapshot();
    SPI_finish();
    CommitTransactionCommand();
}

namespace {

void work_context_callback(void* arg) {
    const auto* c = static_cast<const WorkContext*>(arg);
    StringInfoData s;
    initStringInfo(&s);
    appendStringInfoString(&s, c->who ? c->who : "eventbox worker");
    const char* sep = ": ";
    if (c->subscription) {
        appendStringInfo(&s, "%ssubscription \"%s\"", sep, c->subscription);
        sep = ", ";
    }
    if (c->topic) {
        appendStringInfo(&s, "%slane \"%s\"[%d]", sep, c->topic, c->partition);
        sep = ", ";
    }
    if (c->batch >= 0) appendStringInfo(&s, "%sbatch " INT64_FORMAT, sep, c->batch);
    errcontext("%s", s.data);
}

}  // namespace

void push_work_context(WorkContext* context) {
    context->callback.callback = work_context_callback;
    context->callback.arg = context;
    context->callback.previous = error_context_stack;
    error_context_stack = &context->callback;
}

void pop_work_context(WorkContext* context) {
    error_context_stack = context->callback.previous;
}

void run_worker(Datum database, const WorkerMain& main) {
    setup_signals();
    BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(database), InvalidOid, 0);
    apply_worker_settings(main.async_commit);
    shmem::attach_worker(main.role, main.index);
    MemoryContext turn_context =
        AllocSetContextCreateInternal(TopMemoryContext, main.context_name, ALLOCSET_DEFAULT_SIZES);
    main.start(turn_context);

    static int error_backoff_ms = 0;  // static: survives the longjmp back to sigsetjmp
    sigjmp_buf local_sigjmp_buf;
    if (sigsetjmp(local_sigjmp_buf, 1) != 0)
        recover_from_error(turn_context, main.after_error, &error_backoff_ms);
    PG_exception_stack = &local_sigjmp_buf;

    for (;;) {
        MemoryContextSwitchTo(turn_context);
        main.turn(turn_context);
        error_backoff_ms = 0;
        MemoryContextSwitchTo(TopMemoryContext);
        MemoryContextReset(turn_context);
    }
}

namespace {

// The planner settings every worker statement runs with (exec_kept), and the workers' sessions
// too (apply_worker_settings). Every worker query is meant to walk an index: a plan built while
// a table was empty (or its statistics stale) would otherwise read the whole table and sort it.
// Their joins are a short unnest() list against a primary key: nested loops only. Their queries
// are tiny and run constantly: JIT compilation only costs time.
struct PlannerSwitch {
    const char* name;
    bool* enabled;
};
const PlannerSwitch kWorkerPlannerOff[] = {{"enable_seqscan", &enable_seqscan},
                                           {"enable_sort", &enable_sort},
                                           {"enable_hashjoin", &enable_hashjoin},
                                           {"enable_mergejoin", &enable_mergejoin},
                                           {"jit", &jit_enabled}};
// What a TID statement turns off besides: only the TID scan is left.
const PlannerSwitch kTidPlannerOff[] = {{"enable_indexscan", &enable_indexscan},
                                        {"enable_indexonlyscan", &enable_indexonlyscan},
                                        {"enable_bitmapscan", &enable_bitmapscan}};

}  // namespace

void apply_worker_settings(bool async_commit) {
    for (const PlannerSwitch& p : kWorkerPlannerOff)
        SetConfigOption(p.name, "off", PGC_SUSET, PGC_S_OVERRIDE);
    // A generic plan kept across batches avoids re-planning.
    SetConfigOption("plan_cache_mode", "force_generic_plan", PGC_SUSET, PGC_S_OVERRIDE);
    // Session level, not override: a handler's own search_path (set like a function's SET clause)
    // must be able to take its place while it runs.
    SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_SESSION);
    // Every worker transaction reads committed data as of each statement: the relay's late-commit
    // rechecks and its destination checks take a snapshot per statement, which a server-wide
    // 'repeatable read' or 'serializable' default would freeze at the first one.
    SetConfigOption("default_transaction_isolation", "read committed", PGC_SUSET, PGC_S_OVERRIDE);
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
// Warnings and errors librdkafka logs: at most one line per 10 s per process.
LogRate kafka_log_rate{1, 10000};
}  // namespace

void emit_kafka_logs(kafka::ClientEvents& client, const char* who) {
    std::size_t n = pg::call_cpp([&] { return client.logs().size(); });
    for (std::size_t i = 0; i < n; ++i) {
        const kafka::LogLine& line = client.logs()[i];
        if (line.level > 4) {
            elog(DEBUG1, "%s: kafka: %s", who, line.text.c_str());
            continue;
        }
        int held_back = 0;
        if (!log_allowed(kafka_log_rate, &held_back)) continue;
        ereport(LOG, (errmsg("%s: kafka: %s", who, line.text.c_str()),
                      held_back ? errdetail("%d similar messages suppressed.", held_back) : 0));
        shmem::record_error(line.text.c_str());
    }
    pg::call_cpp([&] { client.logs().clear(); });
}

int64 now_ms() {
    return GetCurrentTimestamp() / 1000;
}

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

Subtransaction begin_subtransaction() {
    Subtransaction sub{CurrentMemoryContext, CurrentResourceOwner};
    BeginInternalSubTransaction(nullptr);
    MemoryContextSwitchTo(sub.context);
    return sub;
}

void end_subtransaction(const Subtransaction& sub, bool commit) {
    if (commit)
        ReleaseCurrentSubTransaction();
    else
        RollbackAndReleaseCurrentSubTransaction();
    MemoryContextSwitchTo(sub.context);
    CurrentResourceOwner = sub.owner;
}

ErrorData* abort_subtransaction(const Subtransaction& sub) {
    MemoryContextSwitchTo(sub.context);
    ErrorData* edata = CopyErrorData();
    FlushErrorState();
    end_subtransaction(sub, false);
    return edata;
}

SPIPlanPtr prepared(KeptStatement& statement, const char* who) {
    if (statement.plan == nullptr)
        statement.plan = prepare_kept(who, statement.sql, statement.nargs, statement.types);
    return statement.plan;
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

// Sets `name` to `value` for the current GUC nest level, opening it first.
void pin_setting(int* nest, const char* name, const char* value) {
    if (*nest < 0) *nest = NewGUCNestLevel();
    (void)set_config_option(name, value, PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0,
                            false);
}

void pin_off(int* nest, const PlannerSwitch* switches, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i)
        if (*switches[i].enabled) pin_setting(nest, switches[i].name, "off");
}

}  // namespace

void exec_kept(const char* who, SPIPlanPtr plan, Datum* values, bool read_only, int expected,
               Access access) {
    int nest = -1;
    pin_off(&nest, kWorkerPlannerOff, lengthof(kWorkerPlannerOff));
    if (plan_cache_mode != PLAN_CACHE_MODE_FORCE_GENERIC_PLAN)
        pin_setting(&nest, "plan_cache_mode", "force_generic_plan");
    if (access == Access::kTid) pin_off(&nest, kTidPlannerOff, lengthof(kTidPlannerOff));
    int rc = SPI_execute_plan(plan, values, nullptr, read_only, 0);
    if (rc != expected) elog(ERROR, "%s: query failed: %s", who, SPI_result_code_string(rc));
    // An ERROR above leaves the settings to the (sub)transaction's abort, which restores them.
    if (nest >= 0) AtEOXact_GUC(true, nest);
}

}  // namespace eventbox::worker
