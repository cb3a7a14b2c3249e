// The SQL entry points of the handlers subsystem (docs/reference/functions.md): thin wrappers
// that check their arguments and call handlers/runner.hpp.
extern "C" {
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
}

#include "handlers/runner.hpp"
#include "pg/extension.hpp"
#include "pg/sql_function.hpp"

// eventbox._process(caller, subscription, max_messages), run as the extension owner by the API
// trampoline: checks that the caller may manage the subscription, then runs passes in the
// caller's transaction until max_messages were handled or nothing is due.
EVENTBOX_SQL_FUNCTION(eventbox_process) {
    using namespace eventbox;
    pg::require_current_schema("eventbox.process()");
    Oid caller = PG_GETARG_OID(0);
    char* subscription = pg::required_name_arg(fcinfo, 1, "subscription");
    int max = pg::positive_int_arg(fcinfo, 2, 100, "max_messages",
                                   "It bounds how many messages this call handles.");
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
        int n = handlers::run_pass(
            subscription, Min(max - handled, handlers::kMessagesPerTransaction), false, &due);
        if (n == 0) break;
        handled += n;
    }
    PG_RETURN_INT32(handled);
}

// eventbox.current_mode(): 'live', 'replay' or 'backfill' inside a handler, NULL outside.
EVENTBOX_SQL_FUNCTION(eventbox_current_mode) {
    (void)fcinfo;
    const char* mode = eventbox::handlers::current_mode();
    if (mode == nullptr) PG_RETURN_NULL();
    PG_RETURN_TEXT_P(cstring_to_text(mode));
}

// eventbox.dry_run(subscription, message_ids, since, max_messages): see handlers::dry_run().
// Called directly (not through the API trampoline): it checks who calls it itself, and runs the
// handlers in the caller's session.
EVENTBOX_SQL_FUNCTION(eventbox_dry_run) {
    using namespace eventbox;
    pg::require_current_schema("eventbox.dry_run()");
    char* subscription = pg::required_name_arg(fcinfo, 0, "subscription");
    int max = pg::positive_int_arg(fcinfo, 3, 100, "max_messages",
                                   "It bounds how many messages the dry run runs.");
    Datum ids = PG_ARGISNULL(1) ? (Datum)0 : PG_GETARG_DATUM(1);
    bool has_since = !PG_ARGISNULL(2);
    TimestampTz since = has_since ? PG_GETARG_TIMESTAMPTZ(2) : 0;
    InitMaterializedSRF(fcinfo, 0);
    auto* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    handlers::dry_run(subscription, ids, has_since, since, max, rsinfo->setResult, rsinfo->setDesc);
    return (Datum)0;
}
