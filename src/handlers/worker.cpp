// The handler background workers (eventbox.handler_workers of them) and eventbox.process(): both
// run handler passes (handlers/runner.cpp). A worker sleeps on its latch, which the ingest worker
// sets after each committed batch, until a retry falls due or a poll interval passes.
extern "C" {
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
}

#include <climits>

#include "handlers/quiet.hpp"
#include "handlers/runner.hpp"
#include "pg/boundary.hpp"
#include "pg/extension.hpp"
#include "pg/shmem.hpp"
#include "workers/common.hpp"

namespace {

// Messages whose attempts one synchronous commit counts: the runs then commit (asynchronously)
// kMessagesPerTransaction at a time.
constexpr int kMessagesPerPass = 4 * eventbox::handlers::kMessagesPerTransaction;
constexpr long kIdleWaitMs = 1000;

// Names of the enabled subscriptions, palloc'd in the current memory context.
int enabled_subscriptions(char*** names) {
    MemoryContext outer = CurrentMemoryContext;
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    eventbox::pg::lock_schema_or_exit();
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "eventbox handler: SPI_connect failed");
    PushActiveSnapshot(GetTransactionSnapshot());
    int rc = SPI_execute("SELECT name FROM eventbox.subscriptions WHERE enabled ORDER BY name",
                         true, 0);
    if (rc != SPI_OK_SELECT) elog(ERROR, "eventbox handler: reading subscriptions failed");
    int n = static_cast<int>(SPI_processed);
    MemoryContext keep = MemoryContextSwitchTo(outer);
    *names = static_cast<char**>(palloc(sizeof(char*) * Max(n, 1)));
    for (int i = 0; i < n; ++i) {
        bool isnull;
        Datum d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull);
        (*names)[i] = TextDatumGetCString(d);
    }
    MemoryContextSwitchTo(keep);
    PopActiveSnapshot();
    SPI_finish();
    CommitTransactionCommand();
    MemoryContextSwitchTo(outer);
    return n;
}

// What may have given a subscription work since (handlers/quiet.hpp), read before its pass.
eventbox::handlers::QuietKey quiet_key(const char* subscription) {
    using namespace eventbox;
    shmem::InboxGeneration g = shmem::inbox_generation();
    return handlers::QuietKey{shmem::inbox_stored_count(subscription), g.generation,
                              shmem::subscriptions_generation(), g.in_flight > 0};
}

}  // namespace

extern "C" {
PGDLLEXPORT void eventbox_handler_main(Datum);
PG_FUNCTION_INFO_V1(eventbox_process);
PG_FUNCTION_INFO_V1(eventbox_current_mode);
PG_FUNCTION_INFO_V1(eventbox_dry_run);
}

extern "C" void eventbox_handler_main(Datum arg) {
    using namespace eventbox;
    int index;
    memcpy(&index, MyBgworkerEntry->bgw_extra, sizeof index);
    worker::setup_signals();
    BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(arg), InvalidOid, 0);
    // Synchronous: the commit counting an attempt must survive a handler that crashes the backend.
    worker::apply_worker_settings(false);
    shmem::attach_worker(shmem::Role::kHandler, index);
    shmem::set_state("running");
    MemoryContext pass_context =
        AllocSetContextCreate(TopMemoryContext, "eventbox handler pass", ALLOCSET_DEFAULT_SIZES);
    static handlers::QuietSubscriptions* quiet =
        pg::call_cpp([] { return new handlers::QuietSubscriptions(); });

    static int error_backoff_ms = 0;  // static: survives the longjmp back to sigsetjmp
    sigjmp_buf local_sigjmp_buf;
    if (sigsetjmp(local_sigjmp_buf, 1) != 0) {
        // An ERROR outside a handler's subtransaction: release the lanes, back off.
        worker::recover_from_error(pass_context, handlers::release_lane_locks, &error_backoff_ms);
        shmem::set_state("running");
    }
    PG_exception_stack = &local_sigjmp_buf;

    for (;;) {
        MemoryContextSwitchTo(pass_context);
        char** names;
        int n = enabled_subscriptions(&names);
        int handled = 0;
        int64 next_due = INT64_MAX;
        for (int i = 0; i < n; ++i) {
            // A subscription whose last pass found nothing to do is passed over until something
            // may have given it work, or its recheck time comes.
            handlers::QuietKey key = quiet_key(names[i]);
            int64 now = worker::now_ms();
            int64 due;
            if (pg::call_cpp([&] { return quiet->skip(names[i], key, now, &due); })) {
                next_due = Min(next_due, due);
                continue;
            }
            handled += handlers::run_pass(names[i], kMessagesPerPass, true, &due);
            bool found_work = handlers::last_pass_found_work();  // also true when it handled any
            pg::call_cpp([&] { quiet->after_pass(names[i], key, now, found_work, due); });
            next_due = Min(next_due, due);
            pgstat_report_stat(false);
            CHECK_FOR_INTERRUPTS();
        }
        error_backoff_ms = 0;
        MemoryContextSwitchTo(TopMemoryContext);
        MemoryContextReset(pass_context);

        long timeout = kIdleWaitMs;
        if (next_due != INT64_MAX) timeout = Min(timeout, Max(next_due - worker::now_ms(), 0L));
        if (handled > 0) timeout = 0;
        (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, timeout,
                        PG_WAIT_EXTENSION);
        ResetLatch(MyLatch);
        CHECK_FOR_INTERRUPTS();
        worker::reload_if_requested();
    }
}

// eventbox._process(caller, subscription, max_messages), run as the extension owner by the API
// trampoline: checks that the caller may manage the subscription, then runs passes in the
// caller's transaction until max_messages were handled or nothing is due.
extern "C" Datum eventbox_process(PG_FUNCTION_ARGS) {
    eventbox::pg::require_current_schema("eventbox.process()");
    Oid caller = PG_GETARG_OID(0);
    if (PG_ARGISNULL(1))
        ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                        errmsg("subscription must not be NULL"),
                        errhint("Pass the subscription's name.")));
    char* subscription = text_to_cstring(PG_GETARG_TEXT_PP(1));
    int max = PG_ARGISNULL(2) ? 100 : PG_GETARG_INT32(2);
    if (max < 1)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("max_messages must be at least 1"),
                        errhint("It bounds how many messages this call handles.")));
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    Oid types[2] = {OIDOID, TEXTOID};
    Datum values[2] = {ObjectIdGetDatum(caller), CStringGetTextDatum(subscription)};
    if (SPI_execute_with_args("SELECT eventbox._managed_subscription($1, $2)", 2, types, values,
                              nullptr, false, 1) != SPI_OK_SELECT)
        elog(ERROR, "eventbox.process: checking the subscription failed");
    SPI_finish();
    int handled = 0;
    while (handled < max) {
        int64 due;
        int n = eventbox::handlers::run_pass(subscription, Min(max - handled, eventbox::handlers::kMessagesPerTransaction),
                                             false, &due);
        if (n == 0) break;
        handled += n;
    }
    PG_RETURN_INT32(handled);
}

// eventbox.current_mode(): 'live', 'replay' or 'backfill' inside a handler, NULL outside.
extern "C" Datum eventbox_current_mode(PG_FUNCTION_ARGS) {
    (void)fcinfo;
    const char* mode = eventbox::handlers::current_mode();
    if (mode == nullptr) PG_RETURN_NULL();
    PG_RETURN_TEXT_P(cstring_to_text(mode));
}

// eventbox.dry_run(subscription, message_ids, since, max_messages): see handlers::dry_run().
// Called directly (not through the API trampoline): it checks who calls it itself, and runs the
// handlers in the caller's session.
extern "C" Datum eventbox_dry_run(PG_FUNCTION_ARGS) {
    eventbox::pg::require_current_schema("eventbox.dry_run()");
    if (PG_ARGISNULL(0))
        ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
                        errmsg("subscription must not be NULL"),
                        errhint("Pass the subscription's name.")));
    int max = PG_ARGISNULL(3) ? 100 : PG_GETARG_INT32(3);
    if (max < 1)
        ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
                        errmsg("max_messages must be at least 1"),
                        errhint("It bounds how many messages the dry run runs.")));
    char* subscription = text_to_cstring(PG_GETARG_TEXT_PP(0));
    Datum ids = PG_ARGISNULL(1) ? (Datum)0 : PG_GETARG_DATUM(1);
    bool has_since = !PG_ARGISNULL(2);
    TimestampTz since = has_since ? PG_GETARG_TIMESTAMPTZ(2) : 0;
    InitMaterializedSRF(fcinfo, 0);
    ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    eventbox::handlers::dry_run(subscription, ids, has_since, since, max, rsinfo->setResult,
                                rsinfo->setDesc);
    return (Datum)0;
}
