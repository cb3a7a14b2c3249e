// The SQL API's plumbing: eventbox_api_call runs eventbox._<name>(calling role, args...) as the
// extension owner, so the config tables are writable only through the API while every function
// still knows who called it (the pattern pg_cron uses for cron.job). Also eventbox.workers() and
// the internal helpers _check_topic(), _notify_ingest(), _inbox_requeued() and _quote().
extern "C" {
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
}

#include <string_view>

#include "messages/message_rules.hpp"
#include "pg/boundary.hpp"
#include "pg/extension.hpp"
#include "pg/shmem.hpp"
#include "pg/sql_function.hpp"

// eventbox._quote(value): 'value' with control characters and malformed bytes as \xHH.
EVENTBOX_SQL_FUNCTION(eventbox_quote) {
    text* value = PG_GETARG_TEXT_PP(0);
    std::string_view view(VARDATA_ANY(value), VARSIZE_ANY_EXHDR(value));
    char* quoted = eventbox::pg::call_cpp([&] {
        std::string s = "'" + eventbox::printable(view, 200) + "'";
        return eventbox::pg::pg_guard([&] { return pstrdup(s.c_str()); });
    });
    PG_RETURN_TEXT_P(cstring_to_text(quoted));
}

EVENTBOX_SQL_FUNCTION(eventbox_api_call) {
    Oid caller = GetUserId();
    HeapTuple proc = SearchSysCache1(PROCOID, ObjectIdGetDatum(fcinfo->flinfo->fn_oid));
    if (!HeapTupleIsValid(proc))
        elog(ERROR, "cache lookup failed for function %u", fcinfo->flinfo->fn_oid);
    Form_pg_proc form = reinterpret_cast<Form_pg_proc>(GETSTRUCT(proc));
    int nargs = form->pronargs;
    Oid result_type = form->prorettype;
    StringInfoData sql;
    initStringInfo(&sql);
    appendStringInfo(&sql, "SELECT eventbox.%s($1",
                     quote_identifier(psprintf("_%s", NameStr(form->proname))));
    Oid* types = static_cast<Oid*>(palloc(sizeof(Oid) * (nargs + 1)));
    Datum* values = static_cast<Datum*>(palloc(sizeof(Datum) * (nargs + 1)));
    char* nulls = static_cast<char*>(palloc(nargs + 1));
    types[0] = OIDOID;
    values[0] = ObjectIdGetDatum(caller);
    nulls[0] = ' ';
    for (int i = 0; i < nargs; ++i) {
        types[i + 1] = form->proargtypes.values[i];
        values[i + 1] = fcinfo->args[i].value;
        nulls[i + 1] = fcinfo->args[i].isnull ? 'n' : ' ';
        appendStringInfo(&sql, ", $%d", i + 2);
    }
    appendStringInfoChar(&sql, ')');
    ReleaseSysCache(proc);

    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    Oid saved_user;
    int saved_context;
    GetUserIdAndSecContext(&saved_user, &saved_context);
    // An error in between aborts the (sub)transaction, which restores the user id.
    SetUserIdAndSecContext(eventbox::pg::schema_owner(),
                           saved_context | SECURITY_LOCAL_USERID_CHANGE);
    int rc = SPI_execute_with_args(sql.data, nargs + 1, types, values, nulls, false, 1);
    SetUserIdAndSecContext(saved_user, saved_context);
    if (rc != SPI_OK_SELECT)
        elog(ERROR, "eventbox API call failed: %s", SPI_result_code_string(rc));
    Datum result = (Datum)0;
    bool isnull = true;
    if (result_type != VOIDOID && SPI_processed == 1) {
        result = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
        if (!isnull) {
            int16 typlen;
            bool typbyval;
            get_typlenbyval(result_type, &typlen, &typbyval);
            result = SPI_datumTransfer(result, typbyval, typlen);
        }
    }
    SPI_finish();
    if (result_type == VOIDOID || isnull) {
        if (result_type != VOIDOID) PG_RETURN_NULL();
        PG_RETURN_VOID();
    }
    return result;
}

// eventbox._check_topic(topic): the same rule send() applies.
EVENTBOX_SQL_FUNCTION(eventbox_check_topic) {
    text* topic = PG_GETARG_TEXT_PP(0);
    std::string_view view(VARDATA_ANY(topic), VARSIZE_ANY_EXHDR(topic));
    eventbox::pg::call_cpp([&] { eventbox::validate_topic(view); });
    PG_RETURN_VOID();
}

// eventbox._notify_ingest(): wake the ingest worker when this transaction commits.
EVENTBOX_SQL_FUNCTION(eventbox_notify_ingest) {
    (void)fcinfo;
    eventbox::shmem::subscriptions_changed_at_commit();
    PG_RETURN_VOID();
}

// eventbox._inbox_requeued(): tell the handler workers, at commit, that inbox rows may wait below
// offsets they passed (their marks in memory go; docs/design/handlers.md).
EVENTBOX_SQL_FUNCTION(eventbox_inbox_requeued) {
    (void)fcinfo;
    eventbox::shmem::inbox_requeued_at_commit();
    PG_RETURN_VOID();
}

// eventbox.workers(): one row per running worker.
EVENTBOX_SQL_FUNCTION(eventbox_workers) {
    using namespace eventbox::shmem;
    ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    InitMaterializedSRF(fcinfo, 0);
    for (int i = 0; i < worker_slots(); ++i) {
        WorkerInfo w;
        if (!read_worker(i, &w)) continue;
        Datum values[10];
        bool nulls[10] = {false, false, false, false, false, false, false, w.last_error[0] == 0,
                          false, false};
        values[0] = Int32GetDatum(w.pid);
        values[1] = CStringGetTextDatum(w.role);
        values[2] = CStringGetTextDatum(w.state);
        values[3] = TimestampTzGetDatum(w.last_activity);
        values[4] = TimestampTzGetDatum(w.started_at);
        values[5] = Int64GetDatum(static_cast<int64>(w.messages));
        values[6] = Int64GetDatum(static_cast<int64>(w.errors));
        values[7] = w.last_error[0] ? CStringGetTextDatum(w.last_error) : (Datum)0;
        values[8] = Int64GetDatum(static_cast<int64>(w.duplicates));
        values[9] = Int64GetDatum(static_cast<int64>(w.transport_ids));
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    }
    return (Datum)0;
}
