// eventbox.dry_run() (see handlers/runner.hpp): the subscription's handlers run on chosen inbox
// rows in the caller's transaction, each message in a subtransaction rolled back, and what each
// did is reported: its outcome, the rows it changed by table, and what it would have sent.
// PostgreSQL side (see handlers/pass_internal.hpp).
extern "C" {
#include "postgres.h"

#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/json.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
}

#include <cstring>

#include "handlers/pass_internal.hpp"
#include "handlers/runner.hpp"
#include "pg/extension.hpp"

namespace eventbox::handlers {

namespace {

// The JSON array elements of the current message's sends during a dry run, or nullptr.
struct DryRunSends {
    StringInfo current = nullptr;
};
DryRunSends sends;

// The counters of pg_stat_xact_all_tables with changes in this transaction, by table.
struct TableCounts {
    int n = 0;
    Oid* relids = nullptr;
    char** names = nullptr;
    int64* counts = nullptr;  // inserted, updated, deleted: 3 per table
};

// A view over the backend's own counters: no table, no index.
KeptStatement counts_statement{
    "SELECT relid, relid::regclass::text, n_tup_ins, n_tup_upd, n_tup_del"
    "  FROM pg_catalog.pg_stat_xact_all_tables"
    " WHERE n_tup_ins + n_tup_upd + n_tup_del > 0",
    0,
    {},
    nullptr};

void read_counts(TableCounts* c) {
    MemoryContext keep = CurrentMemoryContext;
    exec(counts_statement, nullptr, true, SPI_OK_SELECT);
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
        appendStringInfo(&out,
                         ": {\"inserted\": " INT64_FORMAT ", \"updated\": " INT64_FORMAT
                         ", \"deleted\": " INT64_FORMAT "}",
                         d[0], d[1], d[2]);
    }
    appendStringInfoChar(&out, '}');
    return DirectFunctionCall1(jsonb_in, CStringGetDatum(out.data));
}

// Who ran before the dry run took the extension owner's role, and its settings' nest level.
struct Caller {
    Oid user;
    int security_context;
    int nest;
};

// eventbox's own statements: as the extension owner, with search_path pinned (the caller's
// schemas must not resolve anything in them).
Caller become_owner() {
    Caller caller;
    GetUserIdAndSecContext(&caller.user, &caller.security_context);
    SetUserIdAndSecContext(pg::schema_owner(),
                           caller.security_context | SECURITY_LOCAL_USERID_CHANGE);
    caller.nest = NewGUCNestLevel();
    (void)set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION,
                            GUC_ACTION_SAVE, true, 0, false);
    return caller;
}

void become_caller(const Caller& caller) {
    AtEOXact_GUC(false, caller.nest);
    SetUserIdAndSecContext(caller.user, caller.security_context);
}

// Raises the error of eventbox._managed_subscription() unless the caller may manage the
// subscription.
void check_managed(Oid caller, Datum name, MemoryContext memory) {
    Oid types[2] = {OIDOID, TEXTOID};
    Datum values[2] = {ObjectIdGetDatum(caller), name};
    if (SPI_execute_with_args("SELECT eventbox._managed_subscription($1, $2)", 2, types, values,
                              nullptr, false, 1) != SPI_OK_SELECT)
        elog(ERROR, "eventbox.dry_run: checking the subscription failed");
    MemoryContextSwitchTo(memory);
}

// Only a caller who could run code as each run_as role (SET ROLE) may see a handler run.
void check_run_as_roles(Oid caller, const PassSetup& setup) {
    for (int h = 0; h < setup.n_handlers; ++h)
        if (!is_member_of_role(caller, setup.handlers[h].run_as))
            ereport(ERROR,
                    (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                     errmsg("permission denied to dry-run handler %s as role %s",
                            setup.handlers[h].signature, role_name(setup.handlers[h].run_as)),
                     errhint("A dry run runs each handler as its run_as role: only members of "
                             "those roles may dry-run the subscription.")));
}

// The inbox rows a dry run runs, in `memory`.
struct DryRows {
    int n;
    char** ids;
    char** types;
    Datum* rows;
};

// The subscription's rows, or those of the ids given, received at or after `since`, in lane
// order. It runs with the session's planner settings, not exec_kept()'s: a call made by hand,
// not a worker's hot path.
KeptStatement dry_rows_statement{
    "SELECT i.message_id, i.event_type, i FROM eventbox.inbox i"
    " WHERE i.subscription = $1 AND ($2::text[] IS NULL OR i.message_id = ANY ($2))"
    "   AND ($3::timestamptz IS NULL OR i.received_at >= $3)"
    " ORDER BY i.topic, i.\"partition\", i.\"offset\" LIMIT $4",
    4,
    {TEXTOID, TEXTARRAYOID, TIMESTAMPTZOID, INT4OID},
    nullptr};

DryRows read_dry_rows(Datum name, Datum message_ids, bool has_since, TimestampTz since, int max,
                      MemoryContext memory) {
    Datum args[4] = {name, message_ids, TimestampTzGetDatum(since), Int32GetDatum(max)};
    char nulls[4] = {' ', message_ids == (Datum)0 ? 'n' : ' ', has_since ? ' ' : 'n', ' '};
    int rc = SPI_execute_plan(prepared(dry_rows_statement, kWho), args, nulls, true, 0);
    if (rc != SPI_OK_SELECT) elog(ERROR, "eventbox.dry_run: reading the inbox failed");
    MemoryContextSwitchTo(memory);
    DryRows d;
    d.n = static_cast<int>(SPI_processed);
    d.ids = static_cast<char**>(palloc(sizeof(char*) * Max(d.n, 1)));
    d.types = static_cast<char**>(palloc(sizeof(char*) * Max(d.n, 1)));
    d.rows = static_cast<Datum*>(palloc(sizeof(Datum) * Max(d.n, 1)));
    for (int r = 0; r < d.n; ++r) {
        bool isnull;
        d.ids[r] = nullable_text(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1);
        d.types[r] = nullable_text(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 2);
        d.rows[r] = datumCopy(
            SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 3, &isnull), false, -1);
    }
    return d;
}

// Runs the handlers of dry-run row r (those in `matching`, which has room for every handler)
// and appends its report to `store`.
void dry_run_row(const PassSetup& setup, const DryRows& d, int r, HandlerRef** matching,
                 Tuplestorestate* store, TupleDesc result_desc) {
    TableCounts before, after;
    read_counts(&before);
    int n_matching = handlers_taking(setup, d.types[r], matching);
    StringInfo message_sends = makeStringInfo();
    char* error = nullptr;
    if (n_matching > 0) {
        sends.current = message_sends;
        set_dry_run(true);
        pin_handler_settings();
        error = run_message(d.rows[r], matching, n_matching);
        unpin_handler_settings();
        set_dry_run(false);
        sends.current = nullptr;
    }
    read_counts(&after);
    Datum values[6];
    bool isnull[6] = {false, false, true, true, false, false};
    values[0] = CStringGetTextDatum(d.ids[r]);
    values[1] = CStringGetTextDatum(error == nullptr ? "ok" : "error");
    if (error != nullptr) {
        // run_message() reports "SQLSTATE: message".
        values[2] = PointerGetDatum(cstring_to_text_with_len(error, Min(5, (int)strlen(error))));
        values[3] = CStringGetTextDatum(strlen(error) > 7 ? error + 7 : error);
        isnull[2] = isnull[3] = false;
    }
    values[4] = counts_json(before, after);
    values[5] =
        DirectFunctionCall1(jsonb_in, CStringGetDatum(psprintf("[%s]", message_sends->data)));
    tuplestore_putvalues(store, result_desc, values, isnull);
}

void dry_run_body(const char* subscription, Datum message_ids, bool has_since, TimestampTz since,
                  int max, Tuplestorestate* store, TupleDesc result_desc) {
    Oid caller = GetUserId();
    Caller saved = become_owner();
    MemoryContext memory;
    (void)open_pass(false, &memory);
    Datum name = CStringGetTextDatum(subscription);
    check_managed(caller, name, memory);
    PassSetup setup;
    load_setup(name, memory, &setup);
    MemoryContextSwitchTo(memory);
    check_run_as_roles(caller, setup);
    DryRows d = read_dry_rows(name, message_ids, has_since, since, max, memory);
    HandlerRef** matching =
        static_cast<HandlerRef**>(palloc(sizeof(HandlerRef*) * Max(setup.n_handlers, 1)));
    for (int r = 0; r < d.n; ++r) {
        CHECK_FOR_INTERRUPTS();
        dry_run_row(setup, d, r, matching, store, result_desc);
    }
    PopActiveSnapshot();
    SPI_finish();
    become_caller(saved);
}

}  // namespace

bool dry_run_capture(text* topic, text* key, bytea* payload, bool json, Jsonb* headers) {
    if (!dry_running() || sends.current == nullptr) return false;
    MemoryContext keep = MemoryContextSwitchTo(GetMemoryChunkContext(sends.current->data));
    StringInfo out = sends.current;
    if (out->len > 0) appendStringInfoString(out, ", ");
    appendStringInfoString(out, "{\"topic\": ");
    escape_json(out, text_to_cstring(topic));
    appendStringInfoString(out, ", \"key\": ");
    if (key == nullptr)
        appendStringInfoString(out, "null");
    else
        escape_json(out, text_to_cstring(key));
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
    if (headers == nullptr)
        appendStringInfoString(out, "{}");
    else
        appendStringInfoString(out, JsonbToCString(nullptr, &headers->root, VARSIZE(headers)));
    appendStringInfoChar(out, '}');
    MemoryContextSwitchTo(keep);
    return true;
}

void dry_run(const char* subscription, Datum message_ids, bool has_since, TimestampTz since,
             int max, Tuplestorestate* store, TupleDesc desc) {
    enter_pass("eventbox.dry_run()");
    PG_TRY();
    { dry_run_body(subscription, message_ids, has_since, since, max, store, desc); }
    PG_FINALLY();
    {
        leave_pass();
        set_dry_run(false);
        sends.current = nullptr;
    }
    PG_END_TRY();
}

}  // namespace eventbox::handlers
