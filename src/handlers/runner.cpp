// One handler pass (see handlers/runner.hpp).
//
// PostgreSQL-side code. The lanes read by a pass and the messages it chose live in a heap-held
// PassState (handlers/pass_state.hpp), whose operations are called only through call_cpp();
// handler runs use PG_TRY around an internal subtransaction, like PL/pgSQL's exception blocks.
extern "C" {
#include "postgres.h"

#include "access/heapam.h"
#include "access/table.h"
#include "utils/rel.h"
#include "access/xact.h"
#include "storage/bufmgr.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "nodes/makefuncs.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/regproc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"
#include "utils/inval.h"
#include "utils/json.h"
#include "executor/executor.h"
#include "utils/jsonb.h"
#include "utils/tuplestore.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_proc.h"
#include "pgstat.h"
}

#include <climits>

#include "pg/guc.hpp"
#include "handlers/dead_letters.hpp"
#include "handlers/low_water.hpp"
#include "handlers/pass_state.hpp"
#include "handlers/plan.hpp"
#include "handlers/runner.hpp"
#include "pg/arrays.hpp"
#include "pg/boundary.hpp"
#include "pg/extension.hpp"
#include "metrics/counters.hpp"
#include "pg/shmem.hpp"
#include "workers/common.hpp"

using eventbox::pg::call_cpp;

namespace eventbox::handlers {

namespace {

struct HandlerRef {
    char* event_type;  // NULL: every type
    char* signature;   // as registered: schema-qualified, resolved again at every pass
    Oid fn;            // InvalidOid when no function has that signature now
    Oid run_as;
    Oid registered_by;
    // The transaction (MyProc->lxid) in which check_authority() last passed for this handler:
    // authority is checked once per transaction that runs it, like the catalog it reads.
    LocalTransactionId authorized_in;
};

struct Options {
    Ordering ordering;
    int32 max_attempts;
    int64 backoff_ms;
    int64 backoff_max_ms;
    bool unhandled_keep;
    dead_letters::Policy dead;  // non_retryable, on_dead, dead_letter_topic
    bool replays;               // eventbox.reprocess() queued messages that still wait
};

// The pass's working set (heap; begun anew by each pass; the cursors outlive passes).
PassState* state = nullptr;
// What a pass allocates lives here, across its two transactions and SPI connections.
MemoryContext pass_context = nullptr;

// eventbox.handler_timeout: timeouts of our own (not the statement timeout, which
// eventbox.process() must leave to its caller). The first cancels the running handler. A handler
// can catch that (EXCEPTION WHEN query_canceled): it is cancelled again kRecancelMs later, and if
// it still runs kEscalateMs after its timeout, its backend is terminated (FATAL, which nothing
// catches): a handler worker is restarted and the claim its pass committed counts the attempt;
// a session in eventbox.process() loses its connection. A handler that returns after its
// timeout fired has failed its attempt, whatever it did with the cancel.
TimeoutId handler_timeout_id = MAX_TIMEOUTS;
TimeoutId handler_recancel_id = MAX_TIMEOUTS;
TimeoutId handler_escalate_id = MAX_TIMEOUTS;
constexpr int kRecancelMs = 500;
constexpr int kEscalateMs = 2000;
volatile sig_atomic_t handler_timed_out = false;

void on_handler_timeout() {
    handler_timed_out = true;
    QueryCancelPending = true;
    InterruptPending = true;
    SetLatch(MyLatch);
}

void on_handler_escalate() {
    handler_timed_out = true;
    ProcDiePending = true;
    InterruptPending = true;
    SetLatch(MyLatch);
}

void enable_handler_timeouts() {
    handler_timed_out = false;
    if (guc::handler_timeout_ms <= 0) return;
    enable_timeout_after(handler_timeout_id, guc::handler_timeout_ms);
    enable_timeout_after(handler_recancel_id, guc::handler_timeout_ms + kRecancelMs);
    enable_timeout_after(handler_escalate_id, guc::handler_timeout_ms + kEscalateMs);
}

void disable_handler_timeouts() {
    disable_timeout(handler_timeout_id, false);
    disable_timeout(handler_recancel_id, false);
    disable_timeout(handler_escalate_id, false);
}
SPIPlanPtr options_plan, handlers_plan, next_lane_plan, next_lane_upto_plan, known_lane_plan,
    lanes_plan, lane_plan,
    replay_lane_plan, waiting_keys_plan, claim_read_plan, crash_plan, claim_write_plan,
    claim_clear_plan,
    processed_plan, processed_by_id_plan, ignored_plan, failed_plan;
Oid inbox_type = InvalidOid;

// How each handler function is called, by function. A plain function is called directly
// through fmgr (as the executor would call it from SELECT f($1), without planning and starting a
// statement per message: ~10% of a trivial handler's cost); a set-returning one through a kept
// SPI plan of SELECT f($1). The fmgr entries (and what the function's language keeps in them)
// live in handler_calls_context and are all dropped when any function changes (ALTER FUNCTION
// ... SECURITY DEFINER or SET, CREATE OR REPLACE), so a call always follows the definition.
// The table (a hash by function, any number of them) keeps the kept plans across such changes.
struct HandlerPlan {
    Oid fn;            // the hash key
    FmgrInfo* finfo;   // direct call; nullptr: use plan
    SPIPlanPtr plan;
};
HTAB* handler_plans = nullptr;
MemoryContext handler_calls_context = nullptr;
bool handler_calls_callback = false;

bool handler_calls_stale = false;

// A pg_proc change: the direct calls are forgotten before the next one is looked up (not here:
// this can run while a handler executes, with its FmgrInfo in use). The kept SPI plans are
// invalidated by PostgreSQL itself.
void forget_handler_calls(Datum, int, uint32) { handler_calls_stale = true; }

SPIPlanPtr prepare(const char* sql, int nargs, Oid* types) {
    return worker::prepare_kept("eventbox handlers", sql, nargs, types);
}

void prepare_plans() {
    if (options_plan != nullptr) return;
    Oid text1[1] = {TEXTOID};
    options_plan = prepare(
        "SELECT ordering, max_attempts, (extract(epoch FROM backoff) * 1000)::int8, "
        "(extract(epoch FROM backoff_max) * 1000)::int8, unhandled = 'keep', "
        // One probe of inbox_replay_idx (empty but for queued replays): lanes are read for
        // replays only while there are some. (ORDER BY ... LIMIT 1 rather than EXISTS, which
        // drops the ORDER BY: only that index gives the order without a sort, the workers turn
        // sorts off, so no statistics can pick inbox_pkey and walk the subscription's rows.)
        "(SELECT 1 FROM eventbox.inbox i WHERE i.subscription = $1"
        "        AND i.status IN ('received', 'retry') AND i.mode = 'replay'"
        "  ORDER BY i.topic, i.\"partition\", i.\"offset\" LIMIT 1) IS NOT NULL "
        "FROM eventbox.subscriptions WHERE name = $1 AND enabled",
        1, text1);
    handlers_plan = prepare(
        "SELECT event_type, coalesce(pg_catalog.to_regprocedure(handler)::oid, 0), run_as::oid, "
        "registered_by::oid, handler "
        "FROM eventbox.handlers WHERE subscription = $1 ORDER BY created_at, handler",
        1, text1);
    // The next lane with work after ($2, $3), one probe of the todo index (up to ($4, $5)
    // inclusive in the second plan): a pass looks for lanes only as far as it needs them.
    Oid next_types[5] = {TEXTOID, TEXTOID, INT4OID, TEXTOID, INT4OID};
    next_lane_plan = prepare(
        "SELECT topic, \"partition\" FROM eventbox.inbox"
        " WHERE subscription = $1 AND status IN ('received', 'retry')"
        "   AND (topic, \"partition\") > ($2, $3)"
        " ORDER BY topic, \"partition\" LIMIT 1",
        3, next_types);
    next_lane_upto_plan = prepare(
        "SELECT topic, \"partition\" FROM eventbox.inbox"
        " WHERE subscription = $1 AND status IN ('received', 'retry')"
        "   AND (topic, \"partition\") > ($2, $3) AND (topic, \"partition\") <= ($4, $5)"
        " ORDER BY topic, \"partition\" LIMIT 1",
        5, next_types);
    // Whether a lane a worker knows has work at or above its low-water marks ($4: live range,
    // $5: replay range, read when $6): one descent of the todo index each, which lands past the
    // entries of the messages handled before. (A probe crossing a range of such entries walks
    // them, whatever its bounds: a btree scan skips the killed ones before it checks a bound.)
    // ORDER BY "offset" LIMIT 1 pins the index: only inbox_todo_idx (inbox_replay_idx) gives
    // that order without a sort, which the workers turn off. An EXISTS would drop the ORDER BY,
    // and on a small table the planner may find inbox_pkey as cheap: a scan of the
    // subscription's rows from the first, past every message handled before. The second
    // column is the lane's next offset to store, read in the same snapshot: a lane without
    // work has none below it (next_known_lane()).
    Oid known_types[6] = {TEXTOID, TEXTOID, INT4OID, INT8OID, INT8OID, BOOLOID};
    known_lane_plan = prepare(
        "SELECT (SELECT 1 FROM eventbox.inbox i"
        "    WHERE i.subscription = $1 AND i.topic = $2 AND i.\"partition\" = $3"
        "      AND i.status IN ('received', 'retry') AND (i.mode = 'replay') IS FALSE"
        "      AND i.\"offset\" >= $4 ORDER BY i.\"offset\" LIMIT 1) IS NOT NULL"
        "  OR ($6 AND (SELECT 1 FROM eventbox.inbox i"
        "    WHERE i.subscription = $1 AND i.topic = $2 AND i.\"partition\" = $3"
        "      AND i.status IN ('received', 'retry') AND i.mode = 'replay'"
        "      AND i.\"offset\" >= $5 ORDER BY i.\"offset\" LIMIT 1) IS NOT NULL),"
        " (SELECT o.next_offset FROM eventbox.offsets o"
        "   WHERE o.subscription = $1 AND o.topic = $2 AND o.\"partition\" = $3)",
        6, known_types);
    // The lanes a worker knows: the subscription's stored offsets, in the index's order, with
    // the next offset the ingest stores at in each (read at a pass when some lane was probed
    // empty: one whose next offset did not move since is not probed).
    lanes_plan = prepare(
        "SELECT topic, \"partition\", next_offset FROM eventbox.offsets WHERE subscription = $1"
        " ORDER BY topic, \"partition\"",
        1, text1);
    // A locked lane's first messages, read after the lock was taken. Messages that cannot run
    // now are left out so they do not use up the limit: without a handler when they are kept
    // ($5; $9: a handler takes every type, $10: the types handlers take), behind a waiting message of their key ($6, $7: ordering 'key'), or waiting
    // themselves when nothing waits behind them ($8: ordering 'none'). A worker starts at the
    // range's low-water mark ($11, an index condition: the descent lands past the entries of
    // the messages handled before; -1 without one).
    Oid lane_types[11] = {TEXTOID, TEXTOID, INT4OID, INT4OID, BOOLOID, BYTEAARRAYOID, BOOLOID,
                          BOOLOID, BOOLOID, TEXTARRAYOID, INT8OID};
#define LANE_READ(MODE)                                                                    \
    "SELECT i.message_id, i.key, i.event_type, i.attempts, i.next_attempt_at, i.ctid,"     \
    "       i.\"offset\""                                                                  \
    "  FROM eventbox.inbox i"                                                              \
    " WHERE i.subscription = $1 AND i.topic = $2 AND i.\"partition\" = $3"                  \
    "   AND i.status IN ('received', 'retry') AND " MODE                                   \
    "   AND i.\"offset\" >= $11"                                                           \
    "   AND (NOT $5 OR $9 OR i.event_type = ANY ($10))"                                    \
    "   AND (i.key IS NULL OR NOT i.key = ANY ($6))"                                       \
    "   AND NOT ($7 AND i.key IS NULL)"                                                    \
    "   AND (NOT $8 OR i.next_attempt_at IS NULL OR i.next_attempt_at <= clock_timestamp())" \
    " ORDER BY i.\"offset\" LIMIT $4"
    // Live (and backfill) messages first, an index range of inbox_todo_idx of their own (IS
    // FALSE: the planner turns it into an index condition, where NOT or <> would not be); then,
    // with the room left, the messages queued by eventbox.reprocess(), through inbox_replay_idx:
    // a replay never holds a lane's live messages back by more than the pass it shares with
    // them, and reading either costs what the batch costs, whatever is queued.
    lane_plan = prepare(LANE_READ("(i.mode = 'replay') IS FALSE"), 11, lane_types);
    replay_lane_plan = prepare(LANE_READ("i.mode = 'replay'"), 11, lane_types);
#undef LANE_READ
    // Keys of a lane that wait for a retry (ordering 'key'). The inner ORDER BY (a subquery
    // with one is planned on its own) pins inbox_retry_idx, the only index in that order: the
    // todo index or inbox_pkey would walk the lane's (the subscription's) backlog.
    Oid waiting_types[3] = {TEXTOID, TEXTOID, INT4OID};
    waiting_keys_plan = prepare(
        "SELECT DISTINCT w.key FROM (SELECT i.key FROM eventbox.inbox i"
        " WHERE i.subscription = $1 AND i.topic = $2 AND i.\"partition\" = $3"
        "   AND i.status = 'retry' AND i.next_attempt_at > clock_timestamp()"
        " ORDER BY i.next_attempt_at) w",
        3, waiting_types);
    // A lane's claim: what the last worker pass in it took (empty once their outcomes committed).
    claim_read_plan = prepare(
        "SELECT message_ids, attempts FROM eventbox.handler_claims"
        " WHERE subscription = $1 AND topic = $2 AND \"partition\" = $3",
        3, waiting_types);
    // Messages of a claim left by a crashed pass that still wait with the attempts they had then
    // (no outcome committed): their attempt never finished and counts; dead when that was the
    // last one ($3 = max_attempts). The others run alone next. (The status test is on
    // coalesce(): a plain one implies inbox_todo_idx's predicate, and the planner could walk
    // that whole index instead of probing the ids.)
    Oid crash_types[4] = {TEXTOID, TEXTARRAYOID, INT4OID, INT4ARRAYOID};
    crash_plan = prepare(
        "UPDATE eventbox.inbox i SET attempts = i.attempts + 1, next_attempt_at = NULL, "
        "status = CASE WHEN i.attempts + 1 >= $3 THEN 'dead' ELSE i.status END, "
        "last_error = CASE WHEN i.attempts + 1 >= $3 THEN format('attempt %s never finished: the "
        "backend running it crashed or was killed', i.attempts + 1) ELSE i.last_error END "
        "FROM unnest($2::text[], $4::int4[]) AS u(id, attempts) "
        EVENTBOX_INBOX_BY_ID("x.ctid AS t", "")
        "WHERE i.ctid = x.t AND i.attempts = u.attempts "
        "  AND coalesce(i.status, '') IN ('received', 'retry') "
        "RETURNING i.status = 'dead', i.message_id",
        4, crash_types);
    Oid claim_types[5] = {TEXTOID, TEXTOID, INT4OID, TEXTARRAYOID, INT4ARRAYOID};
    claim_write_plan = prepare(
        "INSERT INTO eventbox.handler_claims (subscription, topic, \"partition\", message_ids, "
        "attempts) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (subscription, topic, \"partition\") "
        "DO UPDATE SET message_ids = EXCLUDED.message_ids, attempts = EXCLUDED.attempts",
        5, claim_types);
    Oid clear_types[3] = {TEXTOID, TEXTARRAYOID, INT4ARRAYOID};
    claim_clear_plan = prepare(
        "UPDATE eventbox.handler_claims c SET message_ids = '{}', attempts = '{}' "
        "FROM unnest($2::text[], $3::int4[]) AS u(topic, p) "
        "WHERE c.subscription = $1 AND c.topic = u.topic AND c.\"partition\" = u.p"
        "  AND c.message_ids <> '{}'",
        3, clear_types);
    // Processed rows are found by the ctid their fetch in the same transaction read them at
    // (a TID scan: no index probe, no join); the ids come back, and a row another transaction
    // updated since is marked by its id (processed_by_id_plan). Both mark the same way.
#define MARK_PROCESSED                                                                        \
    "UPDATE eventbox.inbox i SET status = 'processed', attempts = i.attempts + 1, "           \
    "next_attempt_at = NULL, processed_at = now() "
    Oid sub_tids[2] = {TEXTOID, TIDARRAYOID};
    processed_plan = prepare(
        MARK_PROCESSED
        "WHERE i.ctid = ANY ($2::tid[]) AND i.subscription = $1 RETURNING i.message_id",
        2, sub_tids);
    Oid sub_ids[2] = {TEXTOID, TEXTARRAYOID};
    processed_by_id_plan = prepare(
        MARK_PROCESSED "FROM unnest($2::text[]) AS u(id) "
        EVENTBOX_INBOX_BY_ID("x.ctid AS t", "") "WHERE i.ctid = x.t",
        2, sub_ids);
#undef MARK_PROCESSED
    ignored_plan = prepare(
        "UPDATE eventbox.inbox i SET status = 'ignored', processed_at = now() "
        "FROM unnest($2::text[]) AS u(id) "
        EVENTBOX_INBOX_BY_ID("x.ctid AS t", "") "WHERE i.ctid = x.t",
        2, sub_ids);
    Oid failed_types[5] = {TEXTOID, TEXTARRAYOID, TEXTARRAYOID, INT8ARRAYOID, BOOLARRAYOID};
    failed_plan = prepare(
        "UPDATE eventbox.inbox i SET status = CASE WHEN u.dead THEN 'dead' ELSE 'retry' END, "
        "attempts = i.attempts + 1, last_error = u.err, "
        "next_attempt_at = CASE WHEN u.dead THEN NULL "
        "                  ELSE clock_timestamp() + u.delay * interval '1 millisecond' END "
        "FROM unnest($2::text[], $3::text[], $4::int8[], $5::bool[]) AS u(id, err, delay, dead) "
        EVENTBOX_INBOX_BY_ID("x.ctid AS t", "") "WHERE i.ctid = x.t",
        5, failed_types);
    inbox_type = get_rel_type_id(RangeVarGetRelid(
        makeRangeVar(const_cast<char*>("eventbox"), const_cast<char*>("inbox"), -1), NoLock,
        false));
}

void exec(SPIPlanPtr plan, Datum* values, bool read_only, int expected,
          worker::Access access = worker::Access::kIndex) {
    worker::exec_kept("eventbox handlers", plan, values, read_only, expected, access);
}

ItemPointer ItemPointerFromDatum(Datum d) { return reinterpret_cast<ItemPointer>(DatumGetPointer(d)); }

// A ctid packed as block << 16 | offset, as a palloc'd tid Datum.
Datum tid_datum(uint64 packed) {
    ItemPointer tid = static_cast<ItemPointer>(palloc(sizeof(ItemPointerData)));
    ItemPointerSet(tid, static_cast<BlockNumber>(packed >> 16),
                   static_cast<OffsetNumber>(packed & 0xFFFF));
    return PointerGetDatum(tid);
}

// The advisory lock of a lane, in a field4 of our own so it never meets users' advisory locks.
LOCKTAG lane_tag(const char* subscription, const char* topic, int32 partition) {
    LOCKTAG tag;
    uint32 key1 = hash_bytes(reinterpret_cast<const unsigned char*>(subscription),
                             static_cast<int>(strlen(subscription)));
    uint32 key2 = hash_bytes(reinterpret_cast<const unsigned char*>(topic),
                             static_cast<int>(strlen(topic))) ^
                  static_cast<uint32>(partition) * 2654435761u;
    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, key1, key2, 0x4542);
    return tag;
}

// Held session lane locks, to release after the pass (or after an error).
constexpr int kMaxHeld = 1024;
LOCKTAG held_locks[kMaxHeld];
int n_held = 0;

bool try_lock_lane(const char* subscription, const char* topic, int32 partition, bool session) {
    LOCKTAG tag = lane_tag(subscription, topic, partition);
    if (session && n_held >= kMaxHeld) return false;
    LockAcquireResult r = LockAcquire(&tag, ExclusiveLock, session, true);
    if (r == LOCKACQUIRE_NOT_AVAIL) return false;
    if (session) held_locks[n_held++] = tag;
    return true;
}

// A message whose attempt a crash cut short runs alone, and one such message at a time in the
// database: a crash it causes again then cuts short no other one's attempt (a parallel pass
// runs only messages that have not crashed).
bool try_lock_suspects(bool session) {
    if (session && n_held >= kMaxHeld) return false;
    LOCKTAG tag;
    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, 0, 0x4543);
    if (LockAcquire(&tag, ExclusiveLock, session, true) == LOCKACQUIRE_NOT_AVAIL) return false;
    if (session) held_locks[n_held++] = tag;
    return true;
}

// The kept plan calling `fn` with one eventbox.inbox argument.
const HandlerPlan& plan_for(Oid fn) {
    if (handler_plans == nullptr) {
        HASHCTL ctl;
        ctl.keysize = sizeof(Oid);
        ctl.entrysize = sizeof(HandlerPlan);
        handler_plans = hash_create("eventbox handler calls", 64, &ctl, HASH_ELEM | HASH_BLOBS);
    }
    if (handler_calls_stale) {
        HASH_SEQ_STATUS scan;
        hash_seq_init(&scan, handler_plans);
        while (HandlerPlan* e = static_cast<HandlerPlan*>(hash_seq_search(&scan)))
            if (e->finfo != nullptr) (void)hash_search(handler_plans, &e->fn, HASH_REMOVE, nullptr);
        if (handler_calls_context != nullptr) MemoryContextReset(handler_calls_context);
        handler_calls_stale = false;
    }
    if (auto* found = static_cast<HandlerPlan*>(hash_search(handler_plans, &fn, HASH_FIND, nullptr)))
        return *found;
    HeapTuple tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn));
    if (!HeapTupleIsValid(tuple))
        ereport(ERROR, (errcode(ERRCODE_UNDEFINED_FUNCTION),
                        errmsg("handler function %u no longer exists", fn),
                        errhint("Unregister the handler or register an existing function.")));
    bool retset = reinterpret_cast<Form_pg_proc>(GETSTRUCT(tuple))->proretset;
    ReleaseSysCache(tuple);
    HandlerPlan entry{fn, nullptr, nullptr};
    if (!retset) {
        if (handler_calls_context == nullptr)
            handler_calls_context = AllocSetContextCreate(TopMemoryContext,
                                                          "eventbox handler calls",
                                                          ALLOCSET_SMALL_SIZES);
        if (!handler_calls_callback) {
            CacheRegisterSyscacheCallback(PROCOID, forget_handler_calls, 0);
            handler_calls_callback = true;
        }
        entry.finfo = static_cast<FmgrInfo*>(
            MemoryContextAllocZero(handler_calls_context, sizeof(FmgrInfo)));
        fmgr_info_cxt(fn, entry.finfo, handler_calls_context);
    } else {
        char* sql = psprintf("SELECT %s($1)",
                             quote_qualified_identifier(get_namespace_name(get_func_namespace(fn)),
                                                        get_func_name(fn)));
        Oid types[1] = {inbox_type};
        entry.plan = prepare(sql, 1, types);
    }
    // Entered only now that the entry is complete (an ERROR above leaves no half entry).
    auto* added = static_cast<HandlerPlan*>(hash_search(handler_plans, &fn, HASH_ENTER, nullptr));
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

// A role's name, or a description when it was dropped.
const char* role_name(Oid role) {
    const char* name = GetUserNameFromId(role, true);
    return name ? name : psprintf("(dropped role %u)", role);
}

// Authority, checked again at every run (DESIGN.md section 6); raises ERROR 42501 when lost.
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
                        errmsg("handler %s would run as superuser %s",
                               format_procedure(h.fn), GetUserNameFromId(h.run_as, false)),
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

// The GUC nest level of the settings handlers start from, pinned by pin_handler_settings()
// around the handler calls of a run transaction's messages.
int settings_nest = 0;

// Pins search_path to PostgreSQL's default whatever the session had, the way a function's SET
// clause does it, in a nest level of its own: unpin_handler_settings() (or the transaction's
// abort) gives the session back its own. pg_temp comes last: left out, it would be searched
// first, and in process() the caller's temporary tables would shadow the handler's tables.
void pin_handler_settings() {
    settings_nest = NewGUCNestLevel();
    (void)set_config_option("search_path", "\"$user\", public, pg_temp", PGC_USERSET,
                            PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
}

void unpin_handler_settings() { AtEOXact_GUC(false, settings_nest); }

// The row whose handlers run now (see current_message()).
Datum running_message = (Datum)0;

// A dry run is in progress (see dry_run()): run_message() rolls every message back, send()
// only records what it would send.
bool dry_running = false;
StringInfo dry_run_sends = nullptr;  // the JSON array elements of the current message's sends

// Calls the handlers of one message (ERROR when one fails), each as its run_as role with the
// pinned settings; the caller's subtransaction takes back what they did when one fails.
void call_handlers(Datum row, HandlerRef* const* handlers, int n) {
    running_message = row;
    for (int i = 0; i < n; ++i) {
        HandlerRef& h = *handlers[i];
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
        SetUserIdAndSecContext(h.run_as, saved_context | SECURITY_LOCAL_USERID_CHANGE |
                                             SECURITY_RESTRICTED_OPERATION);
        int nest = NewGUCNestLevel();
        enable_handler_timeouts();
        call_handler(call, row);
        disable_handler_timeouts();
        // The timeout fired and the handler returned anyway (it caught the cancel, or it
        // returned as the timeout fired): the attempt failed. Its pending cancel must not
        // cancel what runs next; the error below rolls the handler's effects back.
        if (handler_timed_out) {
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
    running_message = (Datum)0;
}

// After an ERROR from call_handlers(): rolls the subtransaction back (which also restores the
// user id and the settings) and returns the error's text.
char* handlers_failed(const worker::Subtransaction& sub) {
    running_message = (Datum)0;
    disable_handler_timeouts();
    ErrorData* edata = worker::abort_subtransaction(sub);
    char* error;
    if (handler_timed_out && edata->sqlerrcode == ERRCODE_QUERY_CANCELED)
        error = psprintf("57014: handler cancelled after eventbox.handler_timeout (%d ms)",
                         guc::handler_timeout_ms);
    else
        error = psprintf("%s: %s%s%s", unpack_sql_state(edata->sqlerrcode), edata->message,
                         edata->detail ? " DETAIL: " : "", edata->detail ? edata->detail : "");
    handler_timed_out = false;
    FreeErrorData(edata);
    return error;
}

// Runs the handlers of one message in a subtransaction; NULL on success, else the error text.
char* run_message(Datum row, HandlerRef* const* handlers, int n) {
    char* volatile error = nullptr;
    worker::Subtransaction sub = worker::begin_subtransaction();
    PG_TRY();
    {
        call_handlers(row, handlers, n);
        worker::end_subtransaction(sub, !dry_running);
    }
    PG_CATCH();
    { error = handlers_failed(sub); }
    PG_END_TRY();
    return error;
}

char* nullable_text(HeapTuple tuple, TupleDesc desc, int column) {
    bool isnull;
    Datum d = SPI_getbinval(tuple, desc, column, &isnull);
    return isnull ? nullptr : TextDatumGetCString(d);
}

// Reads the subscription's options; returns false when it is gone or disabled.
bool read_options(Datum name, Options* options) {
    Datum args[1] = {name};
    exec(options_plan, args, true, SPI_OK_SELECT);
    if (SPI_processed == 0) return false;
    HeapTuple t = SPI_tuptable->vals[0];
    TupleDesc d = SPI_tuptable->tupdesc;
    bool isnull;
    options->ordering = ordering_from(nullable_text(t, d, 1));
    options->max_attempts = DatumGetInt32(SPI_getbinval(t, d, 2, &isnull));
    options->backoff_ms = DatumGetInt64(SPI_getbinval(t, d, 3, &isnull));
    options->backoff_max_ms = DatumGetInt64(SPI_getbinval(t, d, 4, &isnull));
    options->unhandled_keep = DatumGetBool(SPI_getbinval(t, d, 5, &isnull));
    options->replays = DatumGetBool(SPI_getbinval(t, d, 6, &isnull));
    return true;
}

// The lane (topic, partition) with work that follows `after` in index order, up to `upto`
// inclusive when upto_topic is not NULL; false when there is none. The topic is allocated in
// the current memory context.
bool next_lane(Datum name, const char* after_topic, int32 after_partition, const char* upto_topic,
               int32 upto_partition, char** topic, int32* partition) {
    MemoryContext keep = CurrentMemoryContext;
    Datum args[5] = {name, CStringGetTextDatum(after_topic), Int32GetDatum(after_partition),
                     upto_topic ? CStringGetTextDatum(upto_topic) : (Datum)0,
                     Int32GetDatum(upto_partition)};
    exec(upto_topic ? next_lane_upto_plan : next_lane_plan, args, true, SPI_OK_SELECT);
    MemoryContextSwitchTo(keep);
    if (SPI_processed == 0) return false;
    bool isnull;
    *topic = nullable_text(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
    *partition = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
    return true;
}

// ---- Low-water marks (a worker's; README, "Low-water marks")
//
// A lane range's mark is an offset below which it provably has no message to handle: the
// first row of a lane read that no filter narrowed (no key waiting or blocked, ordering not
// 'none', no kept messages without a handler). Only this worker handles the lane's messages
// while it holds the lane, and handling only removes rows from the todo index; what makes a
// row wait again below a mark (a requeue, a replay, a record stored again at a lower offset)
// bumps the shared inbox generation before and after its commit (shmem::inbox_generation()):
// the marks are dropped when the generation moved, at a pass's start, and after any read that
// used them (which is then read again without them). They are also dropped every
// kMarksMaxAgeMs, so that direct DML on eventbox.inbox is picked up late rather than never.
LaneMarks* marks = nullptr;
uint64 marks_generation = 0;
int64 marks_since_ms = 0;
bool marks_on = false;  // this pass reads from the marks and raises them
constexpr int64 kMarksMaxAgeMs = 10000;

// A worker pass's start, before its lane reads.
void begin_marks(int64 now) {
    if (marks == nullptr) marks = call_cpp([] { return new LaneMarks(); });
    // The periodic drop moves the generation: the marks the workers share go too.
    if (now - marks_since_ms >= kMarksMaxAgeMs) shmem::inbox_generation_bump();
    shmem::InboxGeneration g = shmem::inbox_generation();
    if (g.generation != marks_generation || now - marks_since_ms >= kMarksMaxAgeMs) {
        call_cpp([] { marks->drop_all(); });  // the lanes are loaded again
        marks_generation = g.generation;
        marks_since_ms = now;
    }
    // A change between its two bumps may become visible to this pass's reads unannounced.
    marks_on = g.in_flight == 0;
}

// After a read: whether no change that could make rows wait below the marks may have become
// visible since the pass read the generation. If one may have, the marks are dropped and not
// used for the rest of the pass.
bool marks_still_hold() {
    if (shmem::inbox_generation().generation == marks_generation) return true;
    call_cpp([] { marks->drop_marks(); });
    marks_on = false;
    return false;
}

// The mark of lane (topic, partition) of the subscription, or none.
LaneMark lane_mark(const char* subscription, const char* topic, int32 partition, long* position) {
    *position = -1;
    if (marks == nullptr) return LaneMark{};
    *position = call_cpp([&] { return marks->find(subscription, topic, partition); });
    if (!marks_on || *position < 0) return LaneMark{};
    LaneMark mark =
        call_cpp([&] { return marks->mark(subscription, static_cast<std::size_t>(*position)); });
    // Another worker may have taken the lane further.
    mark.live = Max(mark.live, shmem::shared_lane_mark(subscription, topic, partition,
                                                       marks_generation));
    return mark;
}

// Raises a lane's live mark here and in the marks the workers share.
void raise_live_mark(const char* subscription, std::size_t position, int64 mark) {
    const char* topic = nullptr;
    int32 partition = 0;
    call_cpp([&] {
        marks->raise(subscription, position, false, mark);
        topic = marks->topic(subscription, position).c_str();
        partition = marks->partition(subscription, position);
    });
    shmem::share_lane_mark(subscription, topic, partition, marks_generation, mark);
}

// Reads the lanes of the subscription a worker knows: those of eventbox.offsets, in the
// index's order (ORDER BY in SQL: the database collation's), learned unless they are loaded
// already, and at every pass the next offset the ingest stores at in each. Every lane the ingest
// worker stores into has a row there, written with its first rows, and its first batch in a lane
// drops the marks (StoredOffsets), which reloads the lanes.
//
// An idle subscription's lanes are then passed over without a probe each (nothing was stored in
// them since a probe found them empty: LaneMarks::drained()): one statement per pass instead of one per lane, which cost the
// workers' passes over every busy subscription's messages ~20 us per message with three idle
// subscriptions of 128 lanes each beside them.
void read_lanes(Datum name, const char* subscription) {
    bool loaded = call_cpp([&] { return marks->loaded(subscription); });
    // A busy subscription's lanes were not found empty: each is probed, and the read would be
    // work on the hot path for nothing.
    if (loaded && !call_cpp([&] { return marks->any_probed_empty(subscription); })) {
        call_cpp([&] { marks->begin_next(subscription); });
        return;
    }
    MemoryContext keep = CurrentMemoryContext;
    Datum args[1] = {name};
    // A snapshot of its own, taken after the pass read the inbox generation (begin_marks()):
    // a lane whose first batch committed in between is seen, and the next offsets are fresh.
    exec(lanes_plan, args, false, SPI_OK_SELECT);
    MemoryContextSwitchTo(keep);
    call_cpp([&] {
        if (loaded) marks->begin_next(subscription);
        else marks->begin_load(subscription);
    });
    long hint = 0;
    for (uint64 r = 0; r < SPI_processed; ++r) {
        HeapTuple row = SPI_tuptable->vals[r];
        TupleDesc desc = SPI_tuptable->tupdesc;
        char* topic = nullable_text(row, desc, 1);
        bool isnull;
        int32 partition = DatumGetInt32(SPI_getbinval(row, desc, 2, &isnull));
        Datum next_datum = SPI_getbinval(row, desc, 3, &isnull);
        int64 next = isnull ? kNoMark : DatumGetInt64(next_datum);
        call_cpp([&] {
            if (!loaded) marks->learn(subscription, static_cast<long>(r) - 1, topic, partition);
            long at = marks->set_next(subscription, hint, topic, partition, next);
            if (at >= 0) hint = at + 1;
        });
        pfree(topic);
    }
}

// next_lane() for a worker, over the lanes it knows (read_lanes()): the first one after `after`
// (up to `upto` inclusive) with work at or above its marks, one probe each (known_lane_plan)
// unless the pass read that the lane's live range is drained (and no replays wait).
// Returns false when there is none, and also when `after` or `upto` is not a known lane.
bool next_known_lane(Datum name, const char* subscription, const char* after_topic,
                     int32 after_partition, const char* upto_topic, int32 upto_partition,
                     bool replays, char** topic, int32* partition) {
    long after = -1, upto = -1;
    long n = 0;
    bool known = call_cpp([&] {
        n = static_cast<long>(marks->count(subscription));
        if (after_partition >= 0) after = marks->find(subscription, after_topic, after_partition);
        if (upto_topic != nullptr) upto = marks->find(subscription, upto_topic, upto_partition);
        return (after_partition < 0 || after >= 0) && (upto_topic == nullptr || upto >= 0);
    });
    if (!known) return false;
    MemoryContext keep = CurrentMemoryContext;
    for (long k = after + 1; k < n && (upto_topic == nullptr || k <= upto); ++k) {
        CHECK_FOR_INTERRUPTS();
        char* k_topic = pstrdup(call_cpp([&] {
            return marks->topic(subscription, static_cast<std::size_t>(k)).c_str();
        }));
        int32 k_partition = call_cpp([&] {
            return marks->partition(subscription, static_cast<std::size_t>(k));
        });
        long position;
        LaneMark mark = lane_mark(subscription, k_topic, k_partition, &position);
        if (!replays && marks_on && position >= 0 && call_cpp([&] {
                return marks->drained(subscription, static_cast<std::size_t>(position));
            })) {
            pfree(k_topic);
            continue;
        }
        Datum args[6] = {name,
                         CStringGetTextDatum(k_topic),
                         Int32GetDatum(k_partition),
                         Int64GetDatum(mark.live),
                         Int64GetDatum(mark.replay),
                         BoolGetDatum(replays)};
        // A snapshot of its own, taken after the pass read the inbox generation: a lane found
        // without work may have its mark raised (below).
        exec(known_lane_plan, args, false, SPI_OK_SELECT);
        MemoryContextSwitchTo(keep);
        bool isnull;
        HeapTuple row = SPI_tuptable->vals[0];
        if (DatumGetBool(SPI_getbinval(row, SPI_tuptable->tupdesc, 1, &isnull))) {
            *topic = k_topic;
            *partition = k_partition;
            return true;
        }
        // Nothing waits in the lane from its mark on: whatever waits later is stored at or above
        // the next offset (stored with the rows, in the same transaction), or made to wait
        // again by a change that moves the generation. Without this an idle worker would walk
        // the lane's handled entries at each probe once its marks were dropped.
        int64 next = DatumGetInt64(SPI_getbinval(row, SPI_tuptable->tupdesc, 2, &isnull));
        if (!isnull && marks_on && position >= 0 && marks_still_hold()) {
            if (next > mark.live) raise_live_mark(subscription, static_cast<std::size_t>(position), next);
            // Until the next offset moves, later passes need not probe the lane again.
            call_cpp([&] {
                marks->probed_empty(subscription, static_cast<std::size_t>(position), next);
            });
        }
    }
    return false;
}

void add_lane_rows(std::size_t l);

// Raises the lane's mark of a range to the offset of the first row a read returned (column 7 of
// SPI_tuptable), when no filter narrowed that read.
void raise_mark(const char* subscription, long position, bool replay, bool filtered) {
    if (!marks_on || position < 0 || filtered || SPI_processed == 0) return;
    bool isnull;
    int64 first = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 7,
                                              &isnull));
    if (replay)
        call_cpp([&] { marks->raise(subscription, static_cast<std::size_t>(position), true, first); });
    else
        raise_live_mark(subscription, static_cast<std::size_t>(position), first);
}

// What a worker's pass read in each of its lanes (by pass lane number), to raise the live
// range's mark once the pass committed: an unfiltered read returned every waiting row from the
// mark up to its last one, in offset order, so the mark can move past the leading ones that got
// their final outcome (processed, ignored or dead), and past the last one read when all did.
// Without it the next read and probe would walk the entries of the batch handled before.
struct LaneRead {
    bool counted;   // an unfiltered live read of a known lane, without replay rows
    long position;  // in marks
    int n_read;
    int64* offsets;  // of the rows read, in pass_context
    bool* final;
};
constexpr int kMaxLaneReads = 1024;
LaneRead lane_reads[kMaxLaneReads];
int n_lane_reads = 0;

void forget_lane_reads() { n_lane_reads = 0; }

// Notes the live read in SPI_tuptable (its offsets in column 7) of pass lane l.
void note_lane_read(std::size_t l, long position, bool counted) {
    if (l >= static_cast<std::size_t>(kMaxLaneReads)) return;
    while (n_lane_reads <= static_cast<int>(l)) lane_reads[n_lane_reads++] = LaneRead{};
    LaneRead r{counted, position, static_cast<int>(SPI_processed), nullptr, nullptr};
    if (counted && r.n_read > 0) {
        r.offsets = static_cast<int64*>(MemoryContextAlloc(pass_context, sizeof(int64) * r.n_read));
        r.final = static_cast<bool*>(MemoryContextAllocZero(pass_context, sizeof(bool) * r.n_read));
        bool isnull;
        for (int k = 0; k < r.n_read; ++k)
            r.offsets[k] = DatumGetInt64(
                SPI_getbinval(SPI_tuptable->vals[k], SPI_tuptable->tupdesc, 7, &isnull));
    }
    lane_reads[l] = r;
}

// A chosen message got its final outcome.
void count_final(const ChosenMessage& m) {
    if (m.lane >= static_cast<std::size_t>(n_lane_reads)) return;
    LaneRead& r = lane_reads[m.lane];
    if (r.final != nullptr && m.index < static_cast<std::size_t>(r.n_read)) r.final[m.index] = true;
}

// After a worker's pass committed its last outcomes.
void raise_marks_after_pass(const char* subscription) {
    if (!marks_on || n_lane_reads == 0 || !marks_still_hold()) return;
    for (int l = 0; l < n_lane_reads; ++l) {
        const LaneRead& r = lane_reads[l];
        if (!r.counted || r.final == nullptr) continue;
        int done = 0;
        while (done < r.n_read && r.final[done]) ++done;
        if (done == 0) continue;
        int64 mark = done == r.n_read ? r.offsets[r.n_read - 1] + 1 : r.offsets[done];
        raise_live_mark(subscription, static_cast<std::size_t>(r.position), mark);
    }
}

// Runs a lane read from `mark`; if the marks may no longer hold once it ran, again without it.
void exec_lane_read(SPIPlanPtr plan, Datum* args, int64 mark) {
    args[10] = Int64GetDatum(mark);
    exec(plan, args, false, SPI_OK_SELECT);
    if (marks_on && !marks_still_hold() && mark != kNoMark) {
        args[10] = Int64GetDatum(kNoMark);
        exec(plan, args, false, SPI_OK_SELECT);
    }
}

// Reads up to `per_lane` waiting messages of a lane whose lock this pass holds, with a snapshot
// taken after the lock: what another pass handled before releasing the lane is not read again.
void read_lane(Datum name, const char* subscription, std::size_t l, int per_lane,
               const Options& options, Datum any_type, Datum handled_types) {
    bool isnull;
    LaneId lane = call_cpp([&] { return state->lane_id(l); });
    Datum topic = CStringGetTextDatum(lane.topic);
    int n_waiting = 0;
    bool null_key_waits = false;
    Datum* waiting = nullptr;
    if (options.ordering == Ordering::kKey) {
        Datum wargs[3] = {name, topic, Int32GetDatum(lane.partition)};
        exec(waiting_keys_plan, wargs, false, SPI_OK_SELECT);
        waiting = static_cast<Datum*>(palloc(sizeof(Datum) * Max(SPI_processed, 1)));
        for (uint64 r = 0; r < SPI_processed; ++r) {
            Datum key = SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1, &isnull);
            if (isnull) null_key_waits = true;
            else waiting[n_waiting++] = key;
        }
    }
    if (options.dead.block_key)
        dead_letters::add_blocked_keys(name, topic, lane.partition, &waiting, &n_waiting);
    pg::ArrayColumn waiting_keys(n_waiting, BYTEAOID);
    for (int k = 0; k < n_waiting; ++k) waiting_keys.set(k, waiting[k]);
    // Whether a filter of the read may leave out a message that waits: then the rows it returns
    // are not the range's first waiting ones, and its marks stay where they are.
    bool filtered = n_waiting > 0 || null_key_waits || options.ordering == Ordering::kNone ||
                    (options.unhandled_keep && !DatumGetBool(any_type));
    long position = -1;
    LaneMark mark = lane_mark(subscription, lane.topic, lane.partition, &position);
    Datum args[11] = {name,
                      topic,
                      Int32GetDatum(lane.partition),
                      Int32GetDatum(per_lane),
                      BoolGetDatum(options.unhandled_keep),
                      waiting_keys.get(),
                      BoolGetDatum(null_key_waits),
                      BoolGetDatum(options.ordering == Ordering::kNone),
                      any_type,
                      handled_types,
                      Int64GetDatum(kNoMark)};
    exec_lane_read(lane_plan, args, mark.live);
    raise_mark(subscription, position, false, filtered);
    int n_read = static_cast<int>(SPI_processed);
    note_lane_read(l, position, marks_on && position >= 0 && !filtered);
    add_lane_rows(l);
    if (options.replays && n_read < per_lane) {
        args[3] = Int32GetDatum(per_lane - n_read);
        exec_lane_read(replay_lane_plan, args, marks_on ? mark.replay : kNoMark);
        raise_mark(subscription, position, true, filtered);
        // Replays mix in (the candidates' order is no longer the live rows' alone).
        if (SPI_processed > 0 && l < static_cast<std::size_t>(n_lane_reads))
            lane_reads[l].counted = false;
        add_lane_rows(l);
    }
    call_cpp([&] { state->seal_lane(l); });
}

// Adds the messages SPI_tuptable holds (a lane read) to lane l of the pass.
void add_lane_rows(std::size_t l) {
    bool isnull;
    for (uint64 r = 0; r < SPI_processed; ++r) {
        HeapTuple tuple = SPI_tuptable->vals[r];
        TupleDesc desc = SPI_tuptable->tupdesc;
        char* id = nullable_text(tuple, desc, 1);
        Datum key = SPI_getbinval(tuple, desc, 2, &isnull);
        bytea* key_bytes = isnull ? nullptr : DatumGetByteaPP(key);
        char* type = nullable_text(tuple, desc, 3);
        int32 attempts = DatumGetInt32(SPI_getbinval(tuple, desc, 4, &isnull));
        Datum next = SPI_getbinval(tuple, desc, 5, &isnull);
        int64 not_before = isnull ? 0 : DatumGetTimestampTz(next) / 1000;
        bool next_null = isnull;
        ItemPointer tid = ItemPointerFromDatum(SPI_getbinval(tuple, desc, 6, &isnull));
        uint64 packed = (static_cast<uint64>(ItemPointerGetBlockNumber(tid)) << 16) |
                        ItemPointerGetOffsetNumber(tid);
        MessageRow row{id,
                       key_bytes ? VARDATA_ANY(key_bytes) : nullptr,
                       key_bytes ? VARSIZE_ANY_EXHDR(key_bytes) : 0,
                       type,
                       attempts,
                       !next_null,
                       not_before,
                       packed};
        call_cpp([&] { state->add_message(l, row); });
    }
}

// The outcomes a run transaction records: each kind in arrays of its own, filled from the
// front (at most `n` messages). Trivially destructible.
struct Outcomes {
    pg::ArrayColumn processed, processed_tids, ignored, failed_ids, failed_errors, failed_delays,
        failed_dead;
    int n_processed = 0, n_ignored = 0, n_failed = 0;
    explicit Outcomes(int n)
        : processed(n, TEXTOID),
          processed_tids(n, TIDOID),
          ignored(n, TEXTOID),
          failed_ids(n, TEXTOID),
          failed_errors(n, TEXTOID),
          failed_delays(n, INT8OID),
          failed_dead(n, BOOLOID) {}
    void add_processed(Datum id, Datum tid) {
        processed.set(n_processed, id);
        processed_tids.set(n_processed++, tid);
    }
    void add_ignored(Datum id) { ignored.set(n_ignored++, id); }
    void add_failed(Datum id, Datum error, Datum delay_ms, Datum dead) {
        failed_ids.set(n_failed, id);
        failed_errors.set(n_failed, error);
        failed_delays.set(n_failed, delay_ms);
        failed_dead.set(n_failed++, dead);
    }
};

// Marks processed the rows of `o` that a TID scan did not find where their fetch read them
// (another transaction updated them since), by their ids. SPI_tuptable holds the ids it found.
void mark_moved_processed(Datum name, const Outcomes& o) {
    uint64 n_found = SPI_processed;
    char** found = static_cast<char**>(palloc(sizeof(char*) * Max(n_found, 1)));
    for (uint64 r = 0; r < n_found; ++r)
        found[r] = nullable_text(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1);
    pg::ArrayColumn moved(o.n_processed, TEXTOID);
    int n_moved = 0;
    for (int k = 0; k < o.n_processed; ++k) {
        char* id = TextDatumGetCString(o.processed.value(k));
        bool seen = false;
        for (uint64 r = 0; r < n_found && !seen; ++r) seen = strcmp(found[r], id) == 0;
        if (!seen) moved.set(n_moved++, o.processed.value(k));
    }
    if (n_moved == 0) return;
    Datum args[2] = {name, moved.get(n_moved)};
    exec(processed_by_id_plan, args, false, SPI_OK_UPDATE);
}

// The failed messages of `o` that went dead: their keys blocked and their dead letters sent
// (dead_letters::after_dead()) in the transaction that marks them.
void record_dead(Datum name, const Outcomes& o) {
    pg::ArrayColumn dead_ids(o.n_failed, TEXTOID);
    int n_dead = 0;
    for (int k = 0; k < o.n_failed; ++k)
        if (DatumGetBool(o.failed_dead.value(k))) dead_ids.set(n_dead++, o.failed_ids.value(k));
    if (n_dead > 0) dead_letters::after_dead(name, dead_ids.get(n_dead));
}

// Records the outcomes in the current transaction; they commit with the handlers' effects.
void record_outcomes(Datum name, const Outcomes& o) {
    if (o.n_processed > 0) {
        Datum args[2] = {name, o.processed_tids.get(o.n_processed)};
        exec(processed_plan, args, false, SPI_OK_UPDATE_RETURNING, worker::Access::kTid);
        if (SPI_processed < static_cast<uint64>(o.n_processed)) mark_moved_processed(name, o);
    }
    if (o.n_ignored > 0) {
        Datum args[2] = {name, o.ignored.get(o.n_ignored)};
        exec(ignored_plan, args, false, SPI_OK_UPDATE);
    }
    if (o.n_failed > 0) {
        Datum args[5] = {name, o.failed_ids.get(o.n_failed), o.failed_errors.get(o.n_failed),
                         o.failed_delays.get(o.n_failed), o.failed_dead.get(o.n_failed)};
        exec(failed_plan, args, false, SPI_OK_UPDATE);
        record_dead(name, o);
    }
}

// Commits a worker's run transaction. The outcome commits asynchronously: lost in a crash, it
// is redone from its attempt (durable, counted before the run) together with the effects it
// carried, and the relay flushes the WAL before it publishes what a handler sent. Only the
// attempt count must be on disk before a handler runs.
void commit_run_transaction() {
    PopActiveSnapshot();
    SPI_finish();
    (void)set_config_option("synchronous_commit", "off", PGC_SUSET, PGC_S_SESSION,
                            GUC_ACTION_LOCAL, true, 0, false);
    CommitTransactionCommand();
}

void start_run_transaction() {
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    pg::lock_schema_or_exit();
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "eventbox handlers: SPI_connect failed");
    MemoryContextSwitchTo(pass_context);
    PushActiveSnapshot(GetTransactionSnapshot());
}

// Settles what a crashed pass left in a lane this pass holds: the claimed messages that still
// wait have their attempt counted (dead when it was the last). Returns how many went dead.
int settle_claim(Datum name, std::size_t l, int32 max_attempts) {
    LaneId lane = call_cpp([&] { return state->lane_id(l); });
    Datum args[3] = {name, CStringGetTextDatum(lane.topic), Int32GetDatum(lane.partition)};
    exec(claim_read_plan, args, false, SPI_OK_SELECT);
    if (SPI_processed == 0) return 0;
    bool isnull;
    Datum ids = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
    Datum attempts = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);
    ArrayType* id_array = DatumGetArrayTypeP(ids);
    if (ArrayGetNItems(ARR_NDIM(id_array), ARR_DIMS(id_array)) == 0) return 0;
    call_cpp([&] { state->set_had_claim(l); });
    Datum crash_args[4] = {name, ids, Int32GetDatum(max_attempts), attempts};
    exec(crash_plan, crash_args, false, SPI_OK_UPDATE_RETURNING);
    pg::ArrayColumn dead_ids(static_cast<int>(Max(SPI_processed, 1)), TEXTOID);
    int dead = 0;
    for (uint64 r = 0; r < SPI_processed; ++r)
        if (DatumGetBool(SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1, &isnull)))
            dead_ids.set(dead++, SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 2,
                                               &isnull));
    if (dead > 0) dead_letters::after_dead(name, dead_ids.get(dead));
    return dead;
}

// Writes the claim of each lane this pass holds that runs messages (a worker's pass:
// `own_transactions`) or whose crashed claim it settled (then emptied, or replaced).
void write_claims(Datum name, const bool* to_run, bool own_transactions) {
    std::size_t n_lanes = call_cpp([] { return state->lane_count(); });
    int n_chosen = static_cast<int>(call_cpp([] { return state->chosen_count(); }));
    for (std::size_t l = 0; l < n_lanes; ++l) {
        if (!call_cpp([&] { return state->is_locked(l); })) continue;
        int n = 0;
        for (int c = 0; own_transactions && c < n_chosen; ++c)
            if (to_run[c] && call_cpp([&] { return state->lane_of_chosen(c) == l; })) ++n;
        if (n == 0 && !call_cpp([&] { return state->had_claim(l); })) continue;
        pg::ArrayColumn ids(n, TEXTOID), attempts(n, INT4OID);
        n = 0;
        for (int c = 0; own_transactions && c < n_chosen; ++c) {
            if (!to_run[c]) continue;
            ChosenMessage m = call_cpp([&] { return state->chosen(c); });
            if (m.lane != l) continue;
            ids.set(n, CStringGetTextDatum(m.id));
            attempts.set(n, Int32GetDatum(m.attempts));
            ++n;
        }
        LaneId lane = call_cpp([&] { return state->lane_id(l); });
        Datum args[5] = {name, CStringGetTextDatum(lane.topic), Int32GetDatum(lane.partition),
                         ids.get(), attempts.get()};
        exec(claim_write_plan, args, false, SPI_OK_INSERT);
    }
}

// Empties the claims of the lanes whose messages this pass ran (with the last outcomes).
void clear_claims(Datum name) {
    std::size_t n_lanes = call_cpp([] { return state->lane_count(); });
    pg::ArrayColumn topics(static_cast<int>(Max(n_lanes, 1)), TEXTOID),
        partitions(static_cast<int>(Max(n_lanes, 1)), INT4OID);
    for (std::size_t l = 0; l < n_lanes; ++l) {
        if (!call_cpp([&] { return state->lane_has_chosen(l); })) continue;
        LaneId lane = call_cpp([&] { return state->lane_id(l); });
        topics.set(static_cast<int>(l), CStringGetTextDatum(lane.topic));
        partitions.set(static_cast<int>(l), Int32GetDatum(lane.partition));
    }
    Datum args[3] = {name, topics.get(), partitions.get()};
    exec(claim_clear_plan, args, false, SPI_OK_UPDATE);
}

// The inbox columns fetch_rows() reads and changes, by attribute number (0-based), looked up
// in the relation's descriptor each time (it can change with the schema).
struct InboxColumns {
    int subscription = -1, message_id = -1, status = -1, attempts = -1, next_attempt_at = -1;
};

InboxColumns inbox_columns(TupleDesc desc) {
    InboxColumns c;
    for (int a = 0; a < desc->natts; ++a) {
        Form_pg_attribute att = TupleDescAttr(desc, a);
        if (att->attisdropped) continue;
        const char* name = NameStr(att->attname);
        if (strcmp(name, "subscription") == 0) c.subscription = a;
        else if (strcmp(name, "message_id") == 0) c.message_id = a;
        else if (strcmp(name, "status") == 0) c.status = a;
        else if (strcmp(name, "attempts") == 0) c.attempts = a;
        else if (strcmp(name, "next_attempt_at") == 0) c.next_attempt_at = a;
    }
    if (c.subscription < 0 || c.message_id < 0 || c.status < 0 || c.attempts < 0 ||
        c.next_attempt_at < 0)
        elog(ERROR, "eventbox handlers: eventbox.inbox lacks a column the handler pass needs");
    return c;
}

bool text_equals(Datum d, const char* s) {
    text* t = DatumGetTextPP(d);
    std::size_t n = VARSIZE_ANY_EXHDR(t);
    return strlen(s) == n && memcmp(VARDATA_ANY(t), s, n) == 0;
}

// Fetches the rows of chosen messages [from, to) marked in `to_run` into rows[] (left 0 for
// one not found: an operator changed it meanwhile), as the handlers see them: with the attempt
// that is running and no next_attempt_at. Each row is read where the lane read found it (its
// ctid) in the transaction's snapshot, like a TID scan, without a statement: nothing but the
// lane's holder updates these rows, and a row that was changed since (another version), or
// whose subscription, status or id differ (the table was rewritten), does not run. This cost a
// statement with a TID scan, a ROW() expression and two copies of every row before.
void fetch_rows(Datum name, const bool* to_run, int from, int to, Datum* rows) {
    RangeVar* rv = makeRangeVar(const_cast<char*>("eventbox"), const_cast<char*>("inbox"), -1);
    Relation rel = table_openrv(rv, AccessShareLock);
    TupleDesc desc = RelationGetDescr(rel);
    InboxColumns col = inbox_columns(desc);
    const char* subscription = TextDatumGetCString(name);
    Snapshot snapshot = GetActiveSnapshot();
    Datum* values = static_cast<Datum*>(palloc(sizeof(Datum) * desc->natts));
    bool* nulls = static_cast<bool*>(palloc(sizeof(bool) * desc->natts));
    for (int c = from; c < to; ++c) {
        if (!to_run[c]) continue;
        ChosenMessage m = call_cpp([&] { return state->chosen(c); });
        HeapTupleData tuple;
        ItemPointerSet(&tuple.t_self, static_cast<BlockNumber>(m.tid >> 16),
                       static_cast<OffsetNumber>(m.tid & 0xFFFF));
        Buffer buffer = InvalidBuffer;
        if (!heap_fetch(rel, snapshot, &tuple, &buffer, false)) {
            if (BufferIsValid(buffer)) ReleaseBuffer(buffer);
            continue;
        }
        heap_deform_tuple(&tuple, desc, values, nulls);
        bool runs = !nulls[col.subscription] && !nulls[col.message_id] && !nulls[col.status] &&
                    text_equals(values[col.subscription], subscription) &&
                    text_equals(values[col.message_id], m.id) &&
                    (text_equals(values[col.status], "received") ||
                     text_equals(values[col.status], "retry"));
        if (runs) {
            values[col.attempts] = Int32GetDatum(DatumGetInt32(values[col.attempts]) + 1);
            nulls[col.next_attempt_at] = true;
            HeapTuple shown = heap_form_tuple(desc, values, nulls);
            rows[c] = heap_copy_tuple_as_datum(shown, desc);
            heap_freetuple(shown);
        }
        ReleaseBuffer(buffer);
    }
    table_close(rel, NoLock);  // held to the end of the transaction, as a SELECT holds it
}

bool type_matches(const HandlerRef& h, const char* event_type) {
    return handler_takes(h.event_type, event_type);
}

}  // namespace

Datum current_message() { return running_message; }

const char* current_mode() {
    if (running_message == (Datum)0) return nullptr;
    if (dry_running) return "replay";
    bool isnull;
    Datum mode = GetAttributeByName(DatumGetHeapTupleHeader(running_message), "mode", &isnull);
    return isnull ? "live" : TextDatumGetCString(mode);
}

bool dry_run_capture(text* topic, text* key, bytea* payload, bool json, Jsonb* headers) {
    if (!dry_running || dry_run_sends == nullptr) return false;
    MemoryContext keep = MemoryContextSwitchTo(GetMemoryChunkContext(dry_run_sends->data));
    StringInfo out = dry_run_sends;
    if (out->len > 0) appendStringInfoString(out, ", ");
    appendStringInfoString(out, "{\"topic\": ");
    escape_json(out, text_to_cstring(topic));
    appendStringInfoString(out, ", \"key\": ");
    if (key == nullptr) appendStringInfoString(out, "null");
    else escape_json(out, text_to_cstring(key));
    appendStringInfoString(out, ", \"payload\": ");
    if (payload == nullptr) {
        appendStringInfoString(out, "null");
    } else if (json) {
        appendBinaryStringInfo(out, VARDATA_ANY(payload), VARSIZE_ANY_EXHDR(payload));
    } else {
        // Raw bytes: as bytea's text form.
        escape_json(out, DatumGetCString(DirectFunctionCall1(byteaout, PointerGetDatum(payload))));
    }
    appendStringInfoString(out, ", \"headers\": ");
    if (headers == nullptr) appendStringInfoString(out, "{}");
    else appendStringInfoString(out, JsonbToCString(nullptr, &headers->root, VARSIZE(headers)));
    appendStringInfoChar(out, '}');
    MemoryContextSwitchTo(keep);
    return true;
}

void release_lane_locks() {
    for (int i = 0; i < n_held; ++i) LockRelease(&held_locks[i], ExclusiveLock, true);
    n_held = 0;
}

namespace {

bool in_pass = false;

// What a pass knows of its subscription. Trivially destructible (its parts are palloc'd).
struct PassSetup {
    Datum name;
    HandlerRef* handlers;
    int n_handlers;
    Options options;
    bool found;  // the subscription exists, is enabled, and may have something to run
    // For reading lanes: some handler takes every type; the types handlers take.
    bool any_type;
    Datum handled_types;
    const char** handler_types;  // each handler's type (NULL: every type), for mark_handled()
};

// Starts a pass: the state it works in, its memory context (reset), its first transaction (a
// worker's) and SPI connection, with a snapshot; leaves pass_context current.
void open_pass(bool own_transactions) {
    if (state == nullptr) state = call_cpp([] { return new PassState(); });
    if (handler_timeout_id == MAX_TIMEOUTS) {
        handler_timeout_id = RegisterTimeout(USER_TIMEOUT, on_handler_timeout);
        handler_recancel_id = RegisterTimeout(USER_TIMEOUT, on_handler_timeout);
        handler_escalate_id = RegisterTimeout(USER_TIMEOUT, on_handler_escalate);
    }
    if (pass_context == nullptr)
        pass_context = AllocSetContextCreate(TopMemoryContext, "eventbox handler pass",
                                             ALLOCSET_DEFAULT_SIZES);
    MemoryContextReset(pass_context);
    if (own_transactions) {
        SetCurrentStatementStartTimestamp();
        StartTransactionCommand();
        pg::lock_schema_or_exit();
    }
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "eventbox handlers: SPI_connect failed");
    PushActiveSnapshot(GetTransactionSnapshot());
    prepare_plans();
    // SPI calls (prepare_plans too) return in SPI's context, which the commit between the two
    // transactions frees: what the pass keeps is allocated after switching to pass_context.
    MemoryContextSwitchTo(pass_context);
}

// The subscription's handlers, in registration order (in pass_context); *n gets how many.
HandlerRef* load_handlers(Datum name, int* n) {
    Datum args[1] = {name};
    exec(handlers_plan, args, true, SPI_OK_SELECT);
    // SPI calls return in SPI's own context, which the commit between the two transactions
    // frees: everything the pass keeps is allocated in pass_context explicitly.
    MemoryContextSwitchTo(pass_context);
    int n_handlers = static_cast<int>(SPI_processed);
    HandlerRef* handlers = static_cast<HandlerRef*>(palloc0(sizeof(HandlerRef) * Max(n_handlers, 1)));
    for (int i = 0; i < n_handlers; ++i) {
        HeapTuple t = SPI_tuptable->vals[i];
        TupleDesc d = SPI_tuptable->tupdesc;
        bool isnull;
        handlers[i].event_type = nullable_text(t, d, 1);
        handlers[i].fn = DatumGetObjectId(SPI_getbinval(t, d, 2, &isnull));
        handlers[i].run_as = DatumGetObjectId(SPI_getbinval(t, d, 3, &isnull));
        handlers[i].registered_by = DatumGetObjectId(SPI_getbinval(t, d, 4, &isnull));
        handlers[i].signature = nullable_text(t, d, 5);
    }
    *n = n_handlers;
    return handlers;
}

// Reads the subscription's handlers and options, and the lane read's parameters derived from
// them. The handlers are kept in pass_context; the rest belongs to the first transaction.
void load_setup(Datum name, PassSetup* setup) {
    setup->name = name;
    setup->handlers = load_handlers(name, &setup->n_handlers);
    setup->options = Options{Ordering::kPartition, 1, 1000, 1000, false};
    setup->found = read_options(name, &setup->options);
    dead_letters::load(name, pass_context, &setup->options.dead);
    // A subscription without any handler registered yet: its messages wait for one, whatever
    // `unhandled` says (that option is about event types no registered handler takes). Marking
    // them ignored threw away everything that arrived between create_subscription() and
    // register_handler(), as the README's own example does it.
    if (setup->found && setup->n_handlers == 0) setup->found = false;
    // The event types some handler takes, for reading lanes.
    setup->any_type = false;
    pg::ArrayColumn handled_types(setup->n_handlers, TEXTOID);
    setup->handler_types =
        static_cast<const char**>(palloc(sizeof(const char*) * Max(setup->n_handlers, 1)));
    for (int h = 0; h < setup->n_handlers; ++h) {
        const char* type = setup->handlers[h].event_type;
        setup->handler_types[h] = type;
        if (type == nullptr) setup->any_type = true;
        else handled_types.set(h, CStringGetTextDatum(type));
    }
    setup->handled_types = handled_types.get();
}

// Chooses messages of lane l (read, its messages' handlers marked) while fewer than `max` are
// chosen. Returns false when the pass looks at no further lane.
bool choose_in_lane(std::size_t l, const Options& options, int max, bool own_transactions,
                    int64 now, int64* next_due_ms) {
    long suspect = call_cpp([&] {
        return state->plan(l, options.ordering, options.unhandled_keep, now,
                           static_cast<std::size_t>(max), next_due_ms);
    });
    if (suspect < 0) {
        call_cpp([&] { state->choose_picks(l); });
        return true;
    }
    // A message whose last attempt never finished runs alone, in a pass of its own.
    bool first = call_cpp([] { return state->chosen_count() == 0; });
    if (first && try_lock_suspects(own_transactions)) {
        call_cpp([&] { state->choose_alone(l, static_cast<std::size_t>(suspect)); });
        return false;
    }
    call_cpp([&] { state->choose_picks(l, static_cast<std::size_t>(suspect)); });
    // Not first: a later pass takes it. First but another pass runs a suspect: the lane
    // waits behind it, the other lanes go on.
    return first;
}

// Lanes a worker's pass found no work in among the lanes it knows are looked for with the plain
// probe at most this often (and after each reload of the lanes): rows in a lane without an
// eventbox.offsets row (written by direct DML) are found this way, at the plain probe's cost
// (it walks the index entries of messages handled before). Once such a walk took messages the
// known lanes did not have, each pass walks so again until one takes none (LaneMarks::
// unknown_work()): those lanes are served at the pace of the others, not one pass a second.
constexpr int64 kDiscoveryIntervalMs = 1000;
int64 last_discovery_ms = 0;

// One walk of choose_messages() over the lanes, known ones (a worker) or found by the plain
// probe. Returns whether it found a lane with work (taken or not).
bool walk_lanes(const char* subscription, const PassSetup& setup, int max,
                bool own_transactions, bool known, LaneWalk walk, int64 now,
                int64* next_due_ms, int* crash_dead) {
    int per_lane = max;
    bool found_any = false;
    while (setup.found) {
        if (call_cpp([] { return state->chosen_count(); }) >= static_cast<std::size_t>(max)) break;
        char* topic;
        int32 partition;
        bool more = known ? next_known_lane(setup.name, subscription, walk.after_topic,
                                            walk.after_partition, walk.upto_topic(),
                                            walk.upto_partition(), setup.options.replays,
                                            &topic, &partition)
                          : next_lane(setup.name, walk.after_topic, walk.after_partition,
                                      walk.upto_topic(), walk.upto_partition(), &topic,
                                      &partition);
        if (!more) {
            if (!walk.wrap()) break;
            continue;
        }
        found_any = true;
        walk.found(topic, partition);
        // A worker's plain walk looks for lanes it does not know: the known walk serves the
        // others (and took its lanes already). A known lane the known walk found empty may have
        // been given rows since by an ingest batch that committed in between; taking them here
        // would count as work in unknown lanes and turn the plain walk on at every pass, which
        // walks the handled entries of every lane and leaves the marks behind.
        if (!known && own_transactions &&
            call_cpp([&] {
                return state->has_lane(topic, partition) ||
                       marks->find(subscription, topic, partition) >= 0;
            }))
            continue;
        std::size_t l = call_cpp([&] { return state->add_lane(topic, partition); });
        if (!try_lock_lane(subscription, topic, partition, own_transactions)) continue;
        call_cpp([&] { state->set_locked(l); });
        *crash_dead += settle_claim(setup.name, l, setup.options.max_attempts);
        read_lane(setup.name, subscription, l, per_lane, setup.options,
                  BoolGetDatum(setup.any_type), setup.handled_types);
        MemoryContextSwitchTo(pass_context);
        call_cpp([&] {
            state->mark_handled(l, setup.handler_types, static_cast<std::size_t>(setup.n_handlers));
        });
        if (!choose_in_lane(l, setup.options, max, own_transactions, now, next_due_ms)) break;
    }
    // The cursor names a lane a worker knows (a plain walk's lane may not be one).
    if (walk.on_lane() && (known || !own_transactions))
        call_cpp([&] { state->set_cursor(subscription, walk.after_topic, walk.after_partition); });
    return found_any;
}

// Whether the last pass found a lane with work (see last_pass_found_work()).
bool pass_found_work = false;

// Chooses up to `max` messages lane by lane, from the lane after the one this worker served
// last in the subscription (a round robin), wrapping around at most once. Each lane it reads is
// locked first, and a crashed pass's claim there settled. A worker walks the lanes it knows
// (read_lanes()), with their low-water marks; eventbox.process() and a worker's occasional
// discovery walk use the plain probe. Returns how many messages the settlements made dead.
int choose_messages(const char* subscription, const PassSetup& setup, int max,
                    bool own_transactions, int64 now, int64* next_due_ms) {
    call_cpp([] { state->begin_pass(); });
    forget_lane_reads();
    // eventbox.process() runs in its caller's transaction, which may have requeued rows
    // itself: only workers keep marks.
    bool reloaded = false;
    if (own_transactions) {
        begin_marks(now);
        reloaded = !call_cpp([&] { return marks->loaded(subscription); });
        if (setup.found) read_lanes(setup.name, subscription);
        MemoryContextSwitchTo(pass_context);
    } else {
        marks_on = false;
    }
    const char* cursor_topic = nullptr;
    int32 cursor_partition = 0;
    bool has_cursor = call_cpp(
        [&] { return state->find_cursor(subscription, &cursor_topic, &cursor_partition); });
    // A worker walks the lanes it knows, from its cursor's place among them.
    if (own_transactions && has_cursor &&
        call_cpp([&] { return marks->find(subscription, cursor_topic, cursor_partition); }) < 0)
        has_cursor = false;
    int crash_dead = 0;  // messages whose last attempt a crash cut short
    bool found = walk_lanes(subscription, setup, max, own_transactions, own_transactions,
                            LaneWalk::from(has_cursor ? pstrdup(cursor_topic) : nullptr,
                                           cursor_partition),
                            now, next_due_ms, &crash_dead);
    bool unknown_work = own_transactions &&
                        call_cpp([&] { return marks->unknown_work(subscription); });
    std::size_t chosen = call_cpp([] { return state->chosen_count(); });
    if (own_transactions && (!found || reloaded || unknown_work) &&
        (unknown_work || now - last_discovery_ms >= kDiscoveryIntervalMs) &&
        chosen < static_cast<std::size_t>(max)) {
        last_discovery_ms = now;
        walk_lanes(subscription, setup, max, own_transactions, false, LaneWalk::from(nullptr, 0),
                   now, next_due_ms, &crash_dead);
        // It skips the lanes the known walk took: what it chose waits in lanes no worker knows.
        bool took = call_cpp([] { return state->chosen_count(); }) > chosen;
        call_cpp([&] { marks->set_unknown_work(subscription, took); });
        found = found || took;
    }
    pass_found_work = found || chosen > 0 || crash_dead > 0;
    return crash_dead;
}

// Releases the session locks of the lanes a worker's pass read but does not use: no message
// chosen in them and no claim settled (which stays locked until it commits).
void release_unused_lanes(const char* subscription) {
    std::size_t n_lanes = call_cpp([] { return state->lane_count(); });
    for (std::size_t l = 0; l < n_lanes; ++l) {
        if (!call_cpp([&] { return state->is_locked(l) && !state->lane_in_use(l); })) continue;
        LaneId lane = call_cpp([&] { return state->lane_id(l); });
        LOCKTAG tag = lane_tag(subscription, lane.topic, lane.partition);
        LockRelease(&tag, ExclusiveLock, true);
        for (int i = 0; i < n_held; ++i)
            if (memcmp(&held_locks[i], &tag, sizeof tag) == 0) {
                held_locks[i] = held_locks[--n_held];
                break;
            }
    }
}

// Marks ignored, without an attempt, the chosen messages no handler takes, and marks the others
// in to_run[] (*n_to_run gets how many). Returns how many it ignored.
int ignore_unhandled(Datum name, int n_chosen, bool* to_run, int* n_to_run) {
    pg::ArrayColumn unhandled_ids(Max(n_chosen, 1), TEXTOID);
    int n_unhandled = 0;
    *n_to_run = 0;
    for (int c = 0; c < n_chosen; ++c) {
        ChosenMessage m = call_cpp([&] { return state->chosen(c); });
        if (!m.handled) {
            unhandled_ids.set(n_unhandled++, CStringGetTextDatum(m.id));
            count_final(m);
        } else {
            to_run[c] = true;
            ++*n_to_run;
        }
    }
    if (n_unhandled > 0) {
        Datum ignore_args[2] = {name, unhandled_ids.get()};
        exec(ignored_plan, ignore_args, false, SPI_OK_UPDATE);
        MemoryContextSwitchTo(pass_context);
    }
    return n_unhandled;
}

// The handlers of chosen message `c` that take its event type, in `matching` (room for every
// handler); -1 when a failure earlier in the pass holds the message back.
int matching_handlers(const PassSetup& setup, int c, HandlerRef** matching) {
    if (call_cpp([&] { return state->is_held_back(c, setup.options.ordering); })) return -1;
    const char* event_type = call_cpp([&] { return state->chosen(c).event_type; });
    int n_matching = 0;
    for (int h = 0; h < setup.n_handlers; ++h)
        if (type_matches(setup.handlers[h], event_type))
            matching[n_matching++] = &setup.handlers[h];
    return n_matching;
}

// How a message's handlers ran in run_together(): `ran` false when they did not run there (or
// their run was rolled back with a later message's failure); error NULL when they succeeded.
struct RanTogether {
    bool ran;
    char* error;
    int64 duration_us;
};

// Runs chosen message `c`, whose row was fetched, unless a failure earlier in the pass holds it
// back; adds its outcome to `out`. `matching` has room for every handler. With `ran`, its
// handlers ran already (run_together()) and that outcome is recorded. Returns whether it was
// handled (processed, ignored or failed).
bool run_chosen(const PassSetup& setup, int c, Datum row, HandlerRef** matching, Outcomes* out,
                int64 now, int64* next_due_ms, const RanTogether* ran) {
    ChosenMessage m = call_cpp([&] { return state->chosen(c); });
    Datum id = CStringGetTextDatum(m.id);
    int n_matching = matching_handlers(setup, c, matching);
    if (n_matching < 0) return false;  // stays as it was, to follow the retry
    if (n_matching == 0) {
        out->add_ignored(id);
        count_final(m);
        metrics::handler_ignored(1);
        return true;
    }
    char* error;
    int64 duration_us;
    if (ran != nullptr) {
        error = ran->error;
        duration_us = ran->duration_us;
    } else {
        TimestampTz started = GetCurrentTimestamp();
        error = run_message(row, matching, n_matching);
        duration_us = GetCurrentTimestamp() - started;
    }
    pfree(DatumGetPointer(row));
    if (error == nullptr) {
        out->add_processed(id, tid_datum(m.tid));
        count_final(m);
        metrics::handler_processed(duration_us);
        return true;
    }
    int32 attempts = m.attempts + 1;
    bool refused = dead_letters::refuses(setup.options.dead, error);
    bool dead = attempts >= setup.options.max_attempts || refused;
    if (refused) error = psprintf("%s (not retried: non_retryable)", error);
    metrics::handler_failed(duration_us, dead);
    double unit = call_cpp([] { return state->next_jitter(); });
    int64 delay =
        retry_delay_ms(attempts, setup.options.backoff_ms, setup.options.backoff_max_ms, unit);
    out->add_failed(id, CStringGetTextDatum(error), Int64GetDatum(delay), BoolGetDatum(dead));
    if (dead) count_final(m);
    call_cpp([&] { state->mark_failed(static_cast<std::size_t>(c)); });
    if (!dead && now + delay < *next_due_ms) *next_due_ms = now + delay;
    return true;
}

// Runs the handlers of the fetched messages from `from` up to `to` in one subtransaction, rather
// than one each: a subtransaction per message (an xid with its lock and pg_subtrans entry, the
// settings' and resource owners' bookkeeping at its end) cost 5-19% of the handler workers' CPU
// per message with a trivial handler (paired runs). Messages held back or without a handler are
// left to run_chosen(). Each message run is recorded in ran[]; when every one succeeded, the
// subtransaction is released. When one fails, the subtransaction is rolled back with what the
// messages before it did: those are marked as not run (run_chosen() runs them again, each in a
// subtransaction of its own, as it runs the ones after it), and the failed one keeps its error.
// It is not run twice: its attempt saw what they did, as it would have after them, and failed.
void run_together(const PassSetup& setup, int from, int to, const Datum* rows,
                  HandlerRef** matching, RanTogether* ran) {
    volatile int at = from;
    volatile TimestampTz started = 0;
    worker::Subtransaction sub = worker::begin_subtransaction();
    PG_TRY();
    {
        for (int c = from; c < to; at = ++c) {
            if (rows[c] == (Datum)0) continue;
            int n_matching = matching_handlers(setup, c, matching);
            if (n_matching <= 0) continue;
            started = GetCurrentTimestamp();
            call_handlers(rows[c], matching, n_matching);
            ran[c] = RanTogether{true, nullptr, GetCurrentTimestamp() - started};
        }
        worker::end_subtransaction(sub, true);
    }
    PG_CATCH();
    {
        char* error = handlers_failed(sub);
        // Past the last message: releasing the subtransaction failed, not a handler.
        if (at == to) elog(ERROR, "eventbox handlers: %s", error);
        for (int c = from; c < at; ++c) ran[c].ran = false;
        ran[at] = RanTogether{true, error, GetCurrentTimestamp() - started};
    }
    PG_END_TRY();
}

// Runs the chosen messages marked in to_run[], in lane order, fetching each transaction's rows
// first; a failure holds back the rest of its lane (or key) in this pass. A transaction's
// messages run together (run_together()) until one fails; a dry run runs each on its own (each
// is rolled back). A worker records the outcomes of each transaction's messages and commits it;
// process() records all of its own in the caller's transaction. Returns how many messages it
// handled.
int run_messages(const PassSetup& setup, int n_chosen, const bool* to_run, bool own_transactions,
                 int64 now, int64* next_due_ms) {
    int outcome_room = own_transactions ? Min(n_chosen, kMessagesPerTransaction) : n_chosen;
    Outcomes out(outcome_room);
    Datum* rows = static_cast<Datum*>(palloc0(sizeof(Datum) * n_chosen));
    HandlerRef** matching =
        static_cast<HandlerRef**>(palloc(sizeof(HandlerRef*) * Max(setup.n_handlers, 1)));
    RanTogether* ran = static_cast<RanTogether*>(palloc0(sizeof(RanTogether) * n_chosen));
    int handled = 0;
    // The handlers' settings are pinned around their calls only (from each batch's fetch to its
    // end): eventbox's own statements run with the worker's (or _process()'s) search_path,
    // pg_catalog first.
    for (int c = 0; c < n_chosen; ++c) {
        if (c % kMessagesPerTransaction == 0) {
            if (c > 0) unpin_handler_settings();
            if (c > 0 && own_transactions) {
                record_outcomes(setup.name, out);
                commit_run_transaction();
                start_run_transaction();
                out = Outcomes(outcome_room);
            }
            int to = Min(n_chosen, c + kMessagesPerTransaction);
            fetch_rows(setup.name, to_run, c, to, rows);
            pin_handler_settings();
            if (!dry_running) run_together(setup, c, to, rows, matching, ran);
        }
        if (rows[c] == (Datum)0) continue;  // handled meanwhile
        const RanTogether* outcome = ran[c].ran ? &ran[c] : nullptr;
        if (run_chosen(setup, c, rows[c], matching, &out, now, next_due_ms, outcome)) ++handled;
    }
    unpin_handler_settings();  // n_chosen > 0 here: the loop pinned them
    record_outcomes(setup.name, out);
    return handled;
}

// run_pass(), inside its guard against nesting.
int run_pass_body(const char* subscription, int max, bool own_transactions, int64* next_due_ms) {
    *next_due_ms = INT64_MAX;
    pass_found_work = true;  // until choose_messages() says otherwise
    open_pass(own_transactions);
    PassSetup setup;
    load_setup(CStringGetTextDatum(subscription), &setup);
    int64 now = worker::now_ms();
    int crash_dead = choose_messages(subscription, setup, max, own_transactions, now, next_due_ms);
    MemoryContextSwitchTo(pass_context);
    int n_chosen = static_cast<int>(call_cpp([] { return state->chosen_count(); }));
    if (own_transactions) release_unused_lanes(subscription);
    // What runs, and what is ignored (no handler) without an attempt.
    bool* to_run = static_cast<bool*>(palloc0(sizeof(bool) * Max(n_chosen, 1)));
    int n_to_run;
    int n_ignored = ignore_unhandled(setup.name, n_chosen, to_run, &n_to_run);
    int handled = n_ignored + crash_dead;
    metrics::handler_discard();  // what an interrupted pass tallied never committed
    metrics::handler_ignored(static_cast<uint64>(n_ignored));
    metrics::handler_dead(static_cast<uint64>(crash_dead));
    // Each lane's claim: a worker's commits before any of its messages runs, so a handler that
    // kills the backend cannot run forever; a settled claim is emptied with its settlement.
    write_claims(setup.name, to_run, own_transactions);
    PopActiveSnapshot();
    if (n_to_run == 0) {
        SPI_finish();
        if (own_transactions) {
            CommitTransactionCommand();
            raise_marks_after_pass(subscription);
        }
        release_lane_locks();
        shmem::count_messages(static_cast<uint64>(handled));
        metrics::handler_flush(subscription);
        return handled;
    }
    if (own_transactions) {
        SPI_finish();
        CommitTransactionCommand();
        start_run_transaction();
    } else {
        PushActiveSnapshot(GetTransactionSnapshot());
    }
    handled += run_messages(setup, n_chosen, to_run, own_transactions, now, next_due_ms);
    if (own_transactions) {
        clear_claims(setup.name);
        commit_run_transaction();
        raise_marks_after_pass(subscription);
        release_lane_locks();
    } else {
        PopActiveSnapshot();
        SPI_finish();
    }
    shmem::count_messages(static_cast<uint64>(handled));
    metrics::handler_flush(subscription);
    return handled;
}

}  // namespace

bool last_pass_found_work() { return pass_found_work; }

int run_pass(const char* subscription, int max, bool own_transactions, int64* next_due_ms) {
    // A handler calling eventbox.process() would run a pass inside a pass, over the same state.
    if (in_pass)
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("eventbox.process() cannot be called from a handler"),
                        errhint("Handlers run inside a handler pass already.")));
    in_pass = true;
    int handled = 0;
    PG_TRY();
    { handled = run_pass_body(subscription, max, own_transactions, next_due_ms); }
    PG_FINALLY();
    { in_pass = false; }
    PG_END_TRY();
    return handled;
}


namespace {

// The counters of pg_stat_xact_all_tables with changes in this transaction, by table.
struct TableCounts {
    int n = 0;
    Oid* relids = nullptr;
    char** names = nullptr;
    int64* counts = nullptr;  // inserted, updated, deleted: 3 per table
};

SPIPlanPtr counts_plan = nullptr, dry_rows_plan = nullptr;

void read_counts(TableCounts* c) {
    if (counts_plan == nullptr)
        counts_plan = prepare(
            "SELECT relid, relid::regclass::text, n_tup_ins, n_tup_upd, n_tup_del"
            "  FROM pg_catalog.pg_stat_xact_all_tables"
            " WHERE n_tup_ins + n_tup_upd + n_tup_del > 0",
            0, nullptr);
    MemoryContext keep = CurrentMemoryContext;
    exec(counts_plan, nullptr, true, SPI_OK_SELECT);
    MemoryContextSwitchTo(keep);
    c->n = static_cast<int>(SPI_processed);
    c->relids = static_cast<Oid*>(palloc(sizeof(Oid) * Max(c->n, 1)));
    c->names = static_cast<char**>(palloc(sizeof(char*) * Max(c->n, 1)));
    c->counts = static_cast<int64*>(palloc(sizeof(int64) * 3 * Max(c->n, 1)));
    for (int r = 0; r < c->n; ++r) {
        HeapTuple t = SPI_tuptable->vals[r];
        TupleDesc d = SPI_tuptable->tupdesc;
        bool isnull;
        c->relids[r] = DatumGetObjectId(SPI_getbinval(t, d, 1, &isnull));
        c->names[r] = nullable_text(t, d, 2);
        for (int k = 0; k < 3; ++k)
            c->counts[3 * r + k] = DatumGetInt64(SPI_getbinval(t, d, 3 + k, &isnull));
    }
}

// {"schema.table": {"inserted": n, "updated": n, "deleted": n}, ...}: what changed from `before`.
Datum counts_json(const TableCounts& before, const TableCounts& after) {
    StringInfoData out;
    initStringInfo(&out);
    appendStringInfoChar(&out, '{');
    bool first = true;
    for (int r = 0; r < after.n; ++r) {
        int64 d[3] = {after.counts[3 * r], after.counts[3 * r + 1], after.counts[3 * r + 2]};
        for (int b = 0; b < before.n; ++b)
            if (before.relids[b] == after.relids[r])
                for (int k = 0; k < 3; ++k) d[k] -= before.counts[3 * b + k];
        if (d[0] == 0 && d[1] == 0 && d[2] == 0) continue;
        if (!first) appendStringInfoString(&out, ", ");
        first = false;
        escape_json(&out, after.names[r]);
        appendStringInfo(&out, ": {\"inserted\": " INT64_FORMAT ", \"updated\": " INT64_FORMAT
                               ", \"deleted\": " INT64_FORMAT "}",
                         d[0], d[1], d[2]);
    }
    appendStringInfoChar(&out, '}');
    return DirectFunctionCall1(jsonb_in, CStringGetDatum(out.data));
}

// Owner of schema eventbox: the dry run reads eventbox's tables as it, like the API functions.
Oid eventbox_owner() {
    Oid schema = get_namespace_oid("eventbox", false);
    HeapTuple tuple = SearchSysCache1(NAMESPACEOID, ObjectIdGetDatum(schema));
    if (!HeapTupleIsValid(tuple)) elog(ERROR, "cache lookup failed for schema eventbox");
    Oid owner = reinterpret_cast<Form_pg_namespace>(GETSTRUCT(tuple))->nspowner;
    ReleaseSysCache(tuple);
    return owner;
}

void dry_run_body(const char* subscription, Datum message_ids, bool has_since, TimestampTz since,
                  int max, Tuplestorestate* store, TupleDesc result_desc) {
    Oid caller = GetUserId();
    Oid saved_user;
    int saved_context;
    GetUserIdAndSecContext(&saved_user, &saved_context);
    // eventbox's own statements: as the extension owner, with search_path pinned (the caller's
    // schemas must not resolve anything in them).
    SetUserIdAndSecContext(eventbox_owner(), saved_context | SECURITY_LOCAL_USERID_CHANGE);
    int nest = NewGUCNestLevel();
    (void)set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION,
                            GUC_ACTION_SAVE, true, 0, false);
    open_pass(false);
    Datum name = CStringGetTextDatum(subscription);
    {
        Oid types[2] = {OIDOID, TEXTOID};
        Datum values[2] = {ObjectIdGetDatum(caller), name};
        if (SPI_execute_with_args("SELECT eventbox._managed_subscription($1, $2)", 2, types,
                                  values, nullptr, false, 1) != SPI_OK_SELECT)
            elog(ERROR, "eventbox.dry_run: checking the subscription failed");
        MemoryContextSwitchTo(pass_context);
    }
    PassSetup setup;
    load_setup(name, &setup);
    MemoryContextSwitchTo(pass_context);
    // Only a caller who could run code as each run_as role (SET ROLE) may see a handler run.
    for (int h = 0; h < setup.n_handlers; ++h)
        if (!is_member_of_role(caller, setup.handlers[h].run_as))
            ereport(ERROR,
                    (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                     errmsg("permission denied to dry-run handler %s as role %s",
                            setup.handlers[h].signature, role_name(setup.handlers[h].run_as)),
                     errhint("A dry run runs each handler as its run_as role: only members of "
                             "those roles may dry-run the subscription.")));
    if (dry_rows_plan == nullptr) {
        Oid types[4] = {TEXTOID, TEXTARRAYOID, TIMESTAMPTZOID, INT4OID};
        dry_rows_plan = prepare(
            "SELECT i.message_id, i.event_type, i FROM eventbox.inbox i"
            " WHERE i.subscription = $1 AND ($2::text[] IS NULL OR i.message_id = ANY ($2))"
            "   AND ($3::timestamptz IS NULL OR i.received_at >= $3)"
            " ORDER BY i.topic, i.\"partition\", i.\"offset\" LIMIT $4",
            4, types);
    }
    Datum args[4] = {name, message_ids, TimestampTzGetDatum(since), Int32GetDatum(max)};
    char nulls[4] = {' ', message_ids == (Datum)0 ? 'n' : ' ', has_since ? ' ' : 'n', ' '};
    int rc = SPI_execute_plan(dry_rows_plan, args, nulls, true, 0);
    if (rc != SPI_OK_SELECT) elog(ERROR, "eventbox.dry_run: reading the inbox failed");
    MemoryContextSwitchTo(pass_context);
    int n_rows = static_cast<int>(SPI_processed);
    char** ids = static_cast<char**>(palloc(sizeof(char*) * Max(n_rows, 1)));
    char** types = static_cast<char**>(palloc(sizeof(char*) * Max(n_rows, 1)));
    Datum* rows = static_cast<Datum*>(palloc(sizeof(Datum) * Max(n_rows, 1)));
    for (int r = 0; r < n_rows; ++r) {
        bool isnull;
        ids[r] = nullable_text(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1);
        types[r] = nullable_text(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 2);
        rows[r] = datumCopy(SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 3, &isnull),
                            false, -1);
    }
    HandlerRef** matching =
        static_cast<HandlerRef**>(palloc(sizeof(HandlerRef*) * Max(setup.n_handlers, 1)));
    for (int r = 0; r < n_rows; ++r) {
        CHECK_FOR_INTERRUPTS();
        TableCounts before, after;
        read_counts(&before);
        int n_matching = 0;
        for (int h = 0; h < setup.n_handlers; ++h)
            if (type_matches(setup.handlers[h], types[r])) matching[n_matching++] = &setup.handlers[h];
        StringInfo sends = makeStringInfo();
        char* error = nullptr;
        if (n_matching > 0) {
            dry_run_sends = sends;
            dry_running = true;
            pin_handler_settings();
            error = run_message(rows[r], matching, n_matching);
            unpin_handler_settings();
            dry_running = false;
            dry_run_sends = nullptr;
        }
        read_counts(&after);
        Datum values[6];
        bool isnull[6] = {false, false, true, true, false, false};
        values[0] = CStringGetTextDatum(ids[r]);
        values[1] = CStringGetTextDatum(error == nullptr ? "ok" : "error");
        if (error != nullptr) {
            // run_message() reports "SQLSTATE: message".
            values[2] = PointerGetDatum(cstring_to_text_with_len(error, Min(5, (int)strlen(error))));
            values[3] = CStringGetTextDatum(strlen(error) > 7 ? error + 7 : error);
            isnull[2] = isnull[3] = false;
        }
        values[4] = counts_json(before, after);
        values[5] = DirectFunctionCall1(jsonb_in, CStringGetDatum(psprintf("[%s]", sends->data)));
        tuplestore_putvalues(store, result_desc, values, isnull);
    }
    PopActiveSnapshot();
    SPI_finish();
    AtEOXact_GUC(false, nest);
    SetUserIdAndSecContext(saved_user, saved_context);
}

}  // namespace

void dry_run(const char* subscription, Datum message_ids, bool has_since, TimestampTz since,
             int max, Tuplestorestate* store, TupleDesc desc) {
    if (in_pass)
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("eventbox.dry_run() cannot be called from a handler"),
                        errhint("Handlers run inside a handler pass already.")));
    in_pass = true;
    PG_TRY();
    { dry_run_body(subscription, message_ids, has_since, since, max, store, desc); }
    PG_FINALLY();
    {
        in_pass = false;
        dry_running = false;
        dry_run_sends = nullptr;
    }
    PG_END_TRY();
}

}  // namespace eventbox::handlers
