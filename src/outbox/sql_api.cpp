// The outbox's SQL entry points: eventbox.send() (four overloads), eventbox.next_outbox_id() and
// the HTTP destination API's internal helpers _http_error() and _http_destinations_changed().
// Each is a thin wrapper: its work is in outbox/send.cpp, outbox/outbox_insert.cpp and
// outbox/http_relay.cpp.
extern "C" {
#include "postgres.h"

#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
}

#include "outbox/http_relay.hpp"
#include "outbox/outbox_insert.hpp"
#include "outbox/send.hpp"
#include "pg/boundary.hpp"
#include "pg/sql_function.hpp"

namespace {

using eventbox::outbox::send_message;
using eventbox::pg::call_cpp;

// The payload argument of send(topic, payload jsonb, ...) as the bytes stored: its JSON text.
bytea* json_payload(FunctionCallInfo fcinfo) {
    if (PG_ARGISNULL(1)) return nullptr;
    return eventbox::pg::pg_guard([&] {
        Jsonb* json = PG_GETARG_JSONB_P(1);
        char* text = JsonbToCString(nullptr, &json->root, VARSIZE(json));
        return reinterpret_cast<bytea*>(cstring_to_text(text));
    });
}

// The payload argument of send(topic, payload bytea, ...): raw bytes, published as they are.
bytea* raw_payload(FunctionCallInfo fcinfo) {
    if (PG_ARGISNULL(1)) return nullptr;
    return eventbox::pg::pg_guard([&] { return PG_GETARG_BYTEA_PP(1); });
}

}  // namespace

// send(topic, payload, key, headers, message_id), jsonb and bytea.
EVENTBOX_SQL_FUNCTION(eventbox_send_jsonb) {
    return call_cpp([&] { return send_message(fcinfo, json_payload(fcinfo), true, false); });
}

EVENTBOX_SQL_FUNCTION(eventbox_send_bytea) {
    return call_cpp([&] { return send_message(fcinfo, raw_payload(fcinfo), false, false); });
}

// send(topic, payload, key, headers, message_id, publish_in_replay), jsonb and bytea.
EVENTBOX_SQL_FUNCTION(eventbox_send_jsonb_in_replay) {
    return call_cpp([&] { return send_message(fcinfo, json_payload(fcinfo), true, true); });
}

EVENTBOX_SQL_FUNCTION(eventbox_send_bytea_in_replay) {
    return call_cpp([&] { return send_message(fcinfo, raw_payload(fcinfo), false, true); });
}

// Default of eventbox.outbox.id: assigns the transaction's xid and publishes it as an outbox
// writer before drawing the id, so the relay can tell when a gap below its cursor is settled.
EVENTBOX_SQL_FUNCTION(eventbox_next_outbox_id) {
    (void)fcinfo;
    eventbox::pg::call_cpp([] { eventbox::outbox::require_writable("eventbox.next_outbox_id()"); });
    PG_RETURN_INT64(eventbox::outbox::next_id(true));
}

// eventbox._outbox_open_table(): the open rotated table's number, for the view's INSERT trigger
// (after next_outbox_id(), which assigned the xid).
EVENTBOX_SQL_FUNCTION(eventbox_outbox_open_table) {
    (void)fcinfo;
    PG_RETURN_INT16(static_cast<int16>(eventbox::outbox::open_table()));
}

// eventbox._outbox_unique_message_id(message_id, open_n): the view's INSERT trigger, after it
// wrote the row into rotated table open_n (outbox::check_message_id_elsewhere()).
EVENTBOX_SQL_FUNCTION(eventbox_outbox_unique_message_id) {
    eventbox::outbox::check_message_id_elsewhere(PG_GETARG_UUID_P(0), PG_GETARG_INT16(1));
    PG_RETURN_VOID();
}

// eventbox._http_error(code, message, hint): the HTTP destination API's errors, raised without
// the "STATEMENT:" line PostgreSQL would log (the statement may carry header values).
EVENTBOX_SQL_FUNCTION(eventbox_http_error) {
    char* code = text_to_cstring(PG_GETARG_TEXT_PP(0));
    char* message = text_to_cstring(PG_GETARG_TEXT_PP(1));
    char* hint = text_to_cstring(PG_GETARG_TEXT_PP(2));
    if (strlen(code) != 5) code = pstrdup("XX000");
    ereport(ERROR, (errcode(MAKE_SQLSTATE(code[0], code[1], code[2], code[3], code[4])),
                    errmsg_internal("%s", message), errhint("%s", hint), errhidestmt(true)));
    PG_RETURN_VOID();
}

// eventbox._http_destinations_changed(): the relay reloads its destinations once this
// transaction commits.
EVENTBOX_SQL_FUNCTION(eventbox_http_destinations_changed) {
    (void)fcinfo;
    eventbox::http_relay::destinations_changed_at_commit();
    PG_RETURN_VOID();
}

// eventbox.http_breakers(): the circuit breaker of each HTTP destination that has one, as the
// relay last published it.
EVENTBOX_SQL_FUNCTION(eventbox_http_breakers) {
    using eventbox::http_relay::BreakerRow;
    ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    InitMaterializedSRF(fcinfo, 0);
    constexpr int kMax = 65;
    BreakerRow* rows = static_cast<BreakerRow*>(palloc(sizeof(BreakerRow) * kMax));
    int n = eventbox::http_relay::read_breakers(rows, kMax);
    static const char* const kStates[3] = {"closed", "open", "half_open"};
    for (int i = 0; i < n; ++i) {
        Datum values[6];
        bool nulls[6] = {false, false, rows[i].since == 0, false, false, false};
        values[0] = CStringGetTextDatum(rows[i].topic);
        values[1] = CStringGetTextDatum(kStates[rows[i].state]);
        values[2] = TimestampTzGetDatum(rows[i].since);
        values[3] = Int64GetDatum(rows[i].transitions[1]);
        values[4] = Int64GetDatum(rows[i].transitions[2]);
        values[5] = Int64GetDatum(rows[i].transitions[0]);
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    }
    return (Datum)0;
}
