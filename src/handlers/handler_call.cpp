// Calling a handler: how each handler function is called (plan_for()), its authority checked
// again in every run transaction, the role and settings it runs with, its timeouts, and the
// subtransaction a message's handlers run in. PostgreSQL side (see handlers/pass_internal.hpp);
// handler runs use PG_TRY around an internal subtransaction, like PL/pgSQL's exception blocks.
extern "C" {
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_proc.h"
#include "common/hashfn.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "pgstat.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timeout.h"
}

#include <csignal>
#include <cstring>

#include "handlers/pass_internal.hpp"
#include "handlers/runner.hpp"
#include "pg/guc.hpp"
#include "pg/shmem.hpp"

namespace eventbox::handlers {

namespace {

// eventbox.handler_timeout: timeouts of our own (not the statement timeout, which
// eventbox.process() must leave to its caller). The first cancels the running handler. A handler
// can catch that (EXCEPTION WHEN query_canceled): it is cancelled again kRecancelMs later, and if
// it still runs kEscalateMs after its timeout, its backend is terminated (FATAL, which nothing
// catches): a handler worker is restarted and the claim its pass committed counts the attempt;
// a session in eventbox.process() loses its connection. A handler that returns after its
// timeout fired has failed its attempt, whatever it did with the cancel.
//
// A worker's backend terminated that way leaves a note (shmem::HandlerTimeoutNote) for the pass
// that settles its claim, so that the attempt's error names the timeout and its value: without
// it, the claim reads as a crash. The note is made in the escalation's signal handler, from the
// claimed message whose handlers run (copies and a hash: nothing that allocates or locks), and
// left in shared memory on the way out (leave_timeout_note()), before the lane locks go: a real
// crash (SIGKILL, a segfault) runs no exit callback and leaves none.
constexpr int kRecancelMs = 500;
constexpr int kEscalateMs = 2000;
struct HandlerTimeouts {
    TimeoutId cancel = MAX_TIMEOUTS;
    TimeoutId recancel = MAX_TIMEOUTS;
    TimeoutId escalate = MAX_TIMEOUTS;
    volatile sig_atomic_t timed_out = false;  // set by the timeouts' signal handler
    volatile sig_atomic_t noted = false;      // `note` was made by the escalation
    shmem::HandlerTimeoutNote note;
};
HandlerTimeouts timeouts;

// The claimed message whose handlers run now, in a worker's pass (see claim_running()); its
// strings belong to the pass. No subscription: none (eventbox.process(), a dry run).
struct ClaimedRun {
    const char* subscription = nullptr;
    const char* topic = nullptr;
    int32 partition = 0;
    const char* id = nullptr;
    int32 attempts = 0;
};
ClaimedRun claimed;

void on_handler_timeout() {
    timeouts.timed_out = true;
    QueryCancelPending = true;
    InterruptPending = true;
    SetLatch(MyLatch);
}

// In the signal handler: the note of the claimed message, if it has one that fits.
void make_timeout_note() {
    const ClaimedRun& c = claimed;
    shmem::HandlerTimeoutNote& note = timeouts.note;
    if (timeouts.noted || c.subscription == nullptr) return;
    if (strlen(c.subscription) >= sizeof note.subscription || strlen(c.topic) >= sizeof note.topic)
        return;
    note.database = MyDatabaseId;
    strlcpy(note.subscription, c.subscription, sizeof note.subscription);
    strlcpy(note.topic, c.topic, sizeof note.topic);
    note.partition = c.partition;
    note.message_hash = hash_bytes_extended(reinterpret_cast<const unsigned char*>(c.id),
                                            static_cast<int>(strlen(c.id)), 0);
    note.attempts = c.attempts;
    note.timeout_ms = guc::handler_timeout_ms;
    timeouts.noted = true;
}

void on_handler_escalate() {
    timeouts.timed_out = true;
    make_timeout_note();
    ProcDiePending = true;
    InterruptPending = true;
    SetLatch(MyLatch);
}

// before_shmem_exit: a backend the escalation terminates leaves its note, and says why in the
// log (the FATAL line before it reads "due to administrator command").
void leave_timeout_note(int, Datum) {
    if (!timeouts.noted) return;
    timeouts.noted = false;
    shmem::leave_handler_timeout_note(timeouts.note);
    error_context_stack = nullptr;  // the handler's frames are gone
    ereport(LOG, (errmsg("eventbox handler: a handler of subscription \"%s\" ran past "
                         "eventbox.handler_timeout (%d ms) and ignored the cancel: its "
                         "backend was terminated",
                         timeouts.note.subscription, timeouts.note.timeout_ms)));
}

void enable_handler_timeouts() {
    timeouts.timed_out = false;
    if (guc::handler_timeout_ms <= 0) return;
    enable_timeout_after(timeouts.cancel, guc::handler_timeout_ms);
    enable_timeout_after(timeouts.recancel, guc::handler_timeout_ms + kRecancelMs);
    enable_timeout_after(timeouts.escalate, guc::handler_timeout_ms + kEscalateMs);
}

void disable_handler_timeouts() {
    disable_timeout(timeouts.cancel, false);
    disable_timeout(timeouts.recancel, false);
    disable_timeout(timeouts.escalate, false);
}

// How each handler function is called, by function. A plain function is called directly
// through fmgr (as the executor would call it from SELECT f($1), without planning and starting a
// statement per message: ~10% of a trivial handler's cost); a set-returning one through a kept
// SPI plan of SELECT f($1). The fmgr entries (and what the function's language keeps in them)
// live in HandlerCalls::context and are all dropped when any function changes (ALTER FUNCTION
// ... SECURITY DEFINER or SET, CREATE OR REPLACE), so a call always follows the definition.
// The table (a hash by function, any number of them) keeps the kept plans across such changes.
struct HandlerPlan {
    Oid fn;           // the hash key
    FmgrInfo* finfo;  // direct call; nullptr: use plan
    SPIPlanPtr plan;
};
struct HandlerCalls {
    HTAB* plans = nullptr;
    MemoryContext context = nullptr;
    bool callback_registered = false;
    bool stale = false;           // a function changed: the direct calls go before the next call
    Oid inbox_type = InvalidOid;  // eventbox.inbox's row type: a kept call's argument
};
HandlerCalls calls;

// A pg_proc change: the direct calls are forgotten before the next one is looked up (not here:
// this can run while a handler executes, with its FmgrInfo in use). The kept SPI plans are
// invalidated by PostgreSQL itself.
void forget_handler_calls(Datum, int, uint32) {
    calls.stale = true;
}

void forget_direct_calls() {
    HASH_SEQ_STATUS scan;
    hash_seq_init(&scan, calls.plans);
    while (HandlerPlan* e = static_cast<HandlerPlan*>(hash_seq_search(&scan)))
        if (e->finfo != nullptr) (void)hash_search(calls.plans, &e->fn, HASH_REMOVE, nullptr);
    if (calls.context != nullptr) MemoryContextReset(calls.context);
    calls.stale = false;
}

// The direct call of plain function `fn`, in HandlerCalls::context.
FmgrInfo* direct_call(Oid fn) {
    if (calls.context == nullptr)
        calls.context =
            AllocSetContextCreate(TopMemoryContext, "eventbox handler calls", ALLOCSET_SMALL_SIZES);
    if (!calls.callback_registered) {
        CacheRegisterSyscacheCallback(PROCOID, forget_handler_calls, 0);
        calls.callback_registered = true;
    }
    auto* finfo = static_cast<FmgrInfo*>(MemoryContextAllocZero(calls.context, sizeof(FmgrInfo)));
    fmgr_info_cxt(fn, finfo, calls.context);
    return finfo;
}

// eventbox.inbox's row type.
Oid inbox_type() {
    if (!OidIsValid(calls.inbox_type))
        calls.inbox_type = get_rel_type_id(RangeVarGetRelid(
            makeRangeVar(const_cast<char*>("eventbox"), const_cast<char*>("inbox"), -1), NoLock,
            false));
    return calls.inbox_type;
}

// The kept plan of SELECT fn($1) for set-returning function `fn`, whose argument is of type
// `arg_type` (eventbox.inbox, or eventbox.inbox[] for a batch handler).
SPIPlanPtr kept_call(Oid fn, Oid arg_type) {
    char* sql = psprintf(
        "SELECT %s($1)",
        quote_qualified_identifier(get_namespace_name(get_func_namespace(fn)), get_func_name(fn)));
    Oid types[1] = {arg_type};
    return worker::prepare_kept(kWho, sql, 1, types);
}

// `rows` (eventbox.inbox composites) as one eventbox.inbox[] Datum; the elements are copied.
Datum inbox_array(const Datum* rows, int n) {
    return PointerGetDatum(
        construct_array(const_cast<Datum*>(rows), n, inbox_type(), -1, false, TYPALIGN_DOUBLE));
}

// The kept plan calling `fn` with one eventbox.inbox argument.
const HandlerPlan& plan_for(Oid fn) {
    if (calls.plans == nullptr) {
        HASHCTL ctl;
        ctl.keysize = sizeof(Oid);
        ctl.entrysize = sizeof(HandlerPlan);
        calls.plans = hash_create("eventbox handler calls", 64, &ctl, HASH_ELEM | HASH_BLOBS);
    }
    if (calls.stale) forget_direct_calls();
    if (auto* found = static_cast<HandlerPlan*>(hash_search(calls.plans, &fn, HASH_FIND, nullptr)))
        return *found;
    HeapTuple tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn));
    if (!HeapTupleIsValid(tuple))
        ereport(ERROR, (errcode(ERRCODE_UNDEFINED_FUNCTION),
                        errmsg("handler function %u no longer exists", fn),
                        errhint("Unregister the handler or register an existing function.")));
    auto* form = reinterpret_cast<Form_pg_proc>(GETSTRUCT(tuple));
    bool retset = form->proretset;
    Oid arg_type = form->pronargs == 1 ? form->proargtypes.values[0] : inbox_type();
    ReleaseSysCache(tuple);
    HandlerPlan entry{fn, nullptr, nullptr};
    if (!retset)
        entry.finfo = direct_call(fn);
    else
        entry.plan = kept_call(fn, arg_type);
    // Entered only now that the entry is complete (an ERROR above leaves no half entry).
    auto* added = static_cast<HandlerPlan*>(hash_search(calls.plans, &fn, HASH_ENTER, nullptr));
    *added = entry;
    return *added;
}

// Calls a handler the way the executor calls a function in SELECT f($1): in a statement of its
// own (the command counter advanced, so it sees what earlier messages' handlers did, and a
// snapshot taken for it), counted in pg_stat_user_functions.
void call_handler(const HandlerPlan& h, Datum row) {
    if (h.finfo == nullptr) {
        int rc = SPI_execute_plan(h.plan, &row, nullptr, false, 0);
        if (rc < 0) elog(ERROR, "handler call failed: %s", SPI_result_code_string(rc));
        return;
    }
    CommandCounterIncrement();
    PushActiveSnapshot(GetTransactionSnapshot());
    LOCAL_FCINFO(fcinfo, 1);
    InitFunctionCallInfoData(*fcinfo, h.finfo, 1, InvalidOid, nullptr, nullptr);
    fcinfo->args[0].value = row;
    fcinfo->args[0].isnull = false;
    PgStat_FunctionCallUsage usage;
    pgstat_init_function_usage(fcinfo, &usage);
    (void)FunctionCallInvoke(fcinfo);
    pgstat_end_function_usage(&usage, true);
    PopActiveSnapshot();
    CommandCounterIncrement();
}

// Authority, checked again at every run (docs/guide/security.md); raises ERROR 42501 when lost.
void check_authority(const HandlerRef& h) {
    if (!OidIsValid(h.fn) || !SearchSysCacheExists1(PROCOID, ObjectIdGetDatum(h.fn)))
        ereport(ERROR, (errcode(ERRCODE_UNDEFINED_FUNCTION),
                        errmsg("handler function %s does not exist", h.signature),
                        errhint("Create the function again, or unregister the handler.")));
    if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(h.run_as)))
        ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                        errmsg("the handler's run_as role %u no longer exists", h.run_as)));
    if (superuser_arg(h.run_as) && !guc::allow_superuser_handlers)
        ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                        errmsg("handler %s would run as superuser %s", format_procedure(h.fn),
                               GetUserNameFromId(h.run_as, false)),
                        errhint("eventbox.allow_superuser_handlers is off.")));
    if (!is_member_of_role(h.registered_by, h.run_as))
        ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                        errmsg("role %s, which registered handler %s, is no longer a member of %s",
                               role_name(h.registered_by), format_procedure(h.fn),
                               GetUserNameFromId(h.run_as, false)),
                        errhint("Register the handler again as a member of its run_as role.")));
    if (pg_proc_aclcheck(h.fn, h.run_as, ACL_EXECUTE) != ACLCHECK_OK)
        ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                        errmsg("role %s may not execute handler %s",
                               GetUserNameFromId(h.run_as, false), format_procedure(h.fn)),
                        errhint("GRANT EXECUTE on the function to the run_as role.")));
    if (pg_proc_aclcheck(h.fn, h.registered_by, ACL_EXECUTE) != ACLCHECK_OK)
        ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                        errmsg("role %s, which registered handler %s, may no longer execute it",
                               role_name(h.registered_by), format_procedure(h.fn)),
                        errhint("GRANT EXECUTE on the function again, or register it anew.")));
}

// What this backend's handlers run with now.
struct Running {
    Datum message = (Datum)0;  // the row whose handlers run now (see current_message())
    // A dry run is in progress (see dry_run()): run_message() rolls every message back, send()
    // only records what it would send.
    bool dry_run = false;
    // The GUC nest level of the settings handlers start from, pinned by pin_handler_settings()
    // around the handler calls of a run transaction's messages.
    int settings_nest = 0;
};
Running running;

// Calls handler `h` on `row` as its run_as role, within its timeouts; ERROR when it fails.
void call_as_run_as(HandlerRef& h, Datum row) {
    // Once per run transaction (up to kMessagesPerTransaction messages): a REVOKE or DROP
    // ROLE that commits meanwhile holds from the next transaction on, a few milliseconds
    // later (the checks cost ~1.5 us per message and handler).
    if (h.authorized_in != MyProc->lxid) {
        check_authority(h);
        h.authorized_in = MyProc->lxid;
    }
    const HandlerPlan& call = plan_for(h.fn);
    Oid saved_user;
    int saved_context;
    GetUserIdAndSecContext(&saved_user, &saved_context);
    SetUserIdAndSecContext(
        h.run_as, saved_context | SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION);
    int nest = NewGUCNestLevel();
    enable_handler_timeouts();
    call_handler(call, row);
    disable_handler_timeouts();
    // The timeout fired and the handler returned anyway (it caught the cancel, or it
    // returned as the timeout fired): the attempt failed. Its pending cancel must not
    // cancel what runs next; the error below rolls the handler's effects back.
    if (timeouts.timed_out) {
        QueryCancelPending = false;
        ereport(ERROR, (errcode(ERRCODE_QUERY_CANCELED),
                        errmsg("handler ran past eventbox.handler_timeout")));
    }
    // Whatever the handler changed goes back, even for the session (set_config(...,
    // false)): the next handler, which may run as another role, and the caller of
    // process() start from the pinned settings (as index_build does after running index
    // expressions).
    AtEOXact_GUC(false, nest);
    SetUserIdAndSecContext(saved_user, saved_context);
}

}  // namespace

void register_handler_timeouts() {
    if (timeouts.cancel != MAX_TIMEOUTS) return;
    timeouts.cancel = RegisterTimeout(USER_TIMEOUT, on_handler_timeout);
    timeouts.recancel = RegisterTimeout(USER_TIMEOUT, on_handler_timeout);
    timeouts.escalate = RegisterTimeout(USER_TIMEOUT, on_handler_escalate);
    // After InitPostgres()'s own: runs before it, while the lanes are still locked.
    before_shmem_exit(leave_timeout_note, 0);
}

char* timeout_termination_error(int timeout_ms) {
    return psprintf(
        "57014: handler ran past eventbox.handler_timeout (%d ms) and ignored the "
        "cancel: its backend was terminated",
        timeout_ms);
}

void claim_running(const char* subscription, const char* topic, int32 partition, const char* id,
                   int32 attempts) noexcept {
    claimed = ClaimedRun{subscription, topic, partition, id, attempts};
}

const char* role_name(Oid role) {
    const char* name = GetUserNameFromId(role, true);
    return name ? name : psprintf("(dropped role %u)", role);
}

// Pins search_path to PostgreSQL's default whatever the session had, the way a function's SET
// clause does it, in a nest level of its own: unpin_handler_settings() (or the transaction's
// abort) gives the session back its own. pg_temp comes last: left out, it would be searched
// first, and in process() the caller's temporary tables would shadow the handler's tables.
void pin_handler_settings() {
    running.settings_nest = NewGUCNestLevel();
    (void)set_config_option("search_path", "\"$user\", public, pg_temp", PGC_USERSET, PGC_S_SESSION,
                            GUC_ACTION_SAVE, true, 0, false);
}

void unpin_handler_settings() {
    AtEOXact_GUC(false, running.settings_nest);
}

// Each handler runs as its run_as role with the pinned settings; the caller's subtransaction
// takes back what they did when one fails.
void call_handlers(Datum row, HandlerRef* const* handlers, int n) {
    running.message = row;
    Datum one = (Datum)0;  // the message as a one-element array, for batch handlers
    for (int i = 0; i < n; ++i) {
        if (handlers[i]->batch && one == (Datum)0) one = inbox_array(&row, 1);
        call_as_run_as(*handlers[i], handlers[i]->batch ? one : row);
    }
    if (one != (Datum)0) pfree(DatumGetPointer(one));
    running.message = (Datum)0;
    claimed = ClaimedRun{};
}

// The chunk's first message stands for the chunk in send()'s lineage and current_mode(): a
// chunk holds messages of one lane and one mode (run.cpp).
void call_batch_handlers(const Datum* rows, int n, HandlerRef* const* handlers, int n_handlers) {
    Datum chunk = inbox_array(rows, n);
    running.message = rows[0];
    for (int i = 0; i < n_handlers; ++i) call_as_run_as(*handlers[i], chunk);
    running.message = (Datum)0;
    claimed = ClaimedRun{};
    pfree(DatumGetPointer(chunk));
}

// The subtransaction's rollback also restores the user id and the settings.
char* handlers_failed(const worker::Subtransaction& sub) {
    running.message = (Datum)0;
    claimed = ClaimedRun{};
    disable_handler_timeouts();
    ErrorData* edata = worker::abort_subtransaction(sub);
    char* error;
    if (timeouts.timed_out && edata->sqlerrcode == ERRCODE_QUERY_CANCELED)
        error = psprintf("57014: handler cancelled after eventbox.handler_timeout (%d ms)",
                         guc::handler_timeout_ms);
    else
        error = psprintf("%s: %s%s%s", unpack_sql_state(edata->sqlerrcode), edata->message,
                         edata->detail ? " DETAIL: " : "", edata->detail ? edata->detail : "");
    timeouts.timed_out = false;
    FreeErrorData(edata);
    return error;
}

char* run_message(Datum row, HandlerRef* const* handlers, int n) {
    char* volatile error = nullptr;
    worker::Subtransaction sub = worker::begin_subtransaction();
    PG_TRY();
    {
        call_handlers(row, handlers, n);
        worker::end_subtransaction(sub, !running.dry_run);
    }
    PG_CATCH();
    { error = handlers_failed(sub); }
    PG_END_TRY();
    return error;
}

void set_dry_run(bool on) noexcept {
    running.dry_run = on;
}

bool dry_running() noexcept {
    return running.dry_run;
}

Datum current_message() {
    return running.message;
}

const char* current_mode() {
    if (running.message == (Datum)0) return nullptr;
    if (running.dry_run) return "replay";
    bool isnull;
    Datum mode = GetAttributeByName(DatumGetHeapTupleHeader(running.message), "mode", &isnull);
    return isnull ? "live" : TextDatumGetCString(mode);
}

}  // namespace eventbox::handlers
