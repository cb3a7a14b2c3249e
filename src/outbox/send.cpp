// eventbox.send(): validate a message at call time, store it in the outbox in the caller's
// transaction, and wake the relay when that transaction commits (see outbox/send.hpp; its SQL
// entry points are in outbox/sql_api.cpp).
#include "outbox/send.hpp"

extern "C" {
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "port.h"
#include "storage/ipc.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"
}

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "handlers/runner.hpp"
#include "messages/message_rules.hpp"
#include "metrics/counters.hpp"
#include "outbox/http_relay.hpp"
#include "outbox/lineage.hpp"
#include "outbox/outbox_insert.hpp"
#include "outbox/send_formats.hpp"
#include "pg/boundary.hpp"
#include "pg/guc.hpp"
#include "pg/shmem.hpp"

namespace eventbox {

using pg::pg_guard;

namespace {

SPIPlanPtr insert_plan = nullptr;
SPIPlanPtr insert_cause_plan = nullptr;  // with cause_subscription and cause_received_at

// A time-ordered UUID (version 7): keeps the outbox's message_id index append-mostly.
pg_uuid_t* new_message_id() {
    auto* uuid = static_cast<pg_uuid_t*>(palloc(sizeof(pg_uuid_t)));
    uint64 ms =
        static_cast<uint64>(GetCurrentTimestamp() / 1000 +
                            int64{POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE} * SECS_PER_DAY * 1000);
    for (int i = 0; i < 6; ++i) uuid->data[i] = static_cast<unsigned char>(ms >> (40 - 8 * i));
    if (!pg_strong_random(uuid->data + 6, UUID_LEN - 6))
        ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR),
                        errmsg("could not generate a random message id")));
    uuid->data[6] = static_cast<unsigned char>(0x70 | (uuid->data[6] & 0x0f));
    uuid->data[8] = static_cast<unsigned char>(0x80 | (uuid->data[8] & 0x3f));
    return uuid;
}

// Checks every header and returns the bytes they add to the record on the wire (with their
// length varints).
size_t validate_headers(Jsonb* headers) {
    if (!JB_ROOT_IS_OBJECT(headers) || JB_ROOT_IS_SCALAR(headers))
        throw Error(
            sqlstate::kInvalidParameterValue, "headers must be a JSON object", {},
            "Pass headers as a flat object of strings, e.g. '{\"event_type\":\"OrderCreated\"}'.");
    size_t bytes = 0, count = 0;
    JsonbIterator* it = pg_guard([&] { return JsonbIteratorInit(&headers->root); });
    JsonbValue key, value;
    for (;;) {
        JsonbIteratorToken token = pg_guard([&] { return JsonbIteratorNext(&it, &key, true); });
        if (token == WJB_DONE) break;
        if (token != WJB_KEY) continue;
        pg_guard([&] { JsonbIteratorNext(&it, &value, true); });
        std::string_view name(key.val.string.val, key.val.string.len);
        if (value.type != jbvString)
            throw Error(sqlstate::kInvalidParameterValue,
                        "value of header \"" + printable(name) + "\" is not a string", {},
                        "Headers must be a flat JSON object of string values.");
        std::string_view text(value.val.string.val, value.val.string.len);
        validate_header(name, text);
        validate_header_count(++count);
        bytes += header_wire_bytes(name.size(), text.size());
    }
    return bytes;
}

// The string value of key `name` in a headers object, if it has one.
std::optional<std::string_view> header_value(Jsonb* headers, std::string_view name) {
    if (headers == nullptr) return std::nullopt;
    JsonbValue value;
    JsonbValue* found = pg_guard([&] {
        return getKeyJsonValueFromContainer(&headers->root, name.data(),
                                            static_cast<int>(name.size()), &value);
    });
    if (found == nullptr || found->type != jbvString) return std::nullopt;
    return std::string_view(found->val.string.val, found->val.string.len);
}

// `headers` with the lineage headers of a message sent while the handlers of inbox row `row`
// run (see outbox/lineage.hpp); the caller's own values are kept. Headers that are not an
// object are returned as they are, for validate_headers() to refuse.
Jsonb* with_lineage(Jsonb* headers, Datum row) {
    if (headers != nullptr && (!JB_ROOT_IS_OBJECT(headers) || JB_ROOT_IS_SCALAR(headers)))
        return headers;
    text* id = nullptr;
    Jsonb* incoming = nullptr;
    pg_guard([&] {
        HeapTupleHeader tuple = DatumGetHeapTupleHeader(row);
        bool isnull;
        Datum d = GetAttributeByName(tuple, "message_id", &isnull);
        if (!isnull) id = DatumGetTextPP(d);
        d = GetAttributeByName(tuple, "headers", &isnull);
        if (!isnull) incoming = DatumGetJsonbP(d);
    });
    if (id == nullptr) return headers;
    outbox::Incoming in{std::string_view(VARDATA_ANY(id), VARSIZE_ANY_EXHDR(id)),
                        header_value(incoming, outbox::kCorrelationHeader),
                        header_value(incoming, outbox::kTraceparentHeader)};
    // A key the caller set, to any value, is the caller's (validate_headers() refuses non-strings).
    auto caller_set = [&](std::string_view name) {
        JsonbValue v;
        return headers != nullptr &&
               pg_guard([&] {
                   return getKeyJsonValueFromContainer(&headers->root, name.data(),
                                                       static_cast<int>(name.size()), &v);
               }) != nullptr;
    };
    bool caller_has[3] = {caller_set(outbox::kCausationHeader),
                          caller_set(outbox::kCorrelationHeader),
                          caller_set(outbox::kTraceparentHeader)};
    unsigned char span[8] = {};
    if (in.traceparent && !caller_has[2] && !pg_strong_random(span, sizeof span))
        throw Error(sqlstate::kInternalError, "could not generate a trace span id");
    auto added = outbox::lineage_headers(in, span, caller_has);
    if (added.empty()) return headers;
    return pg_guard([&] {
        JsonbParseState* state = nullptr;
        pushJsonbValue(&state, WJB_BEGIN_OBJECT, nullptr);
        for (const auto& [name, value] : added) {
            JsonbValue k, v;
            k.type = jbvString;
            k.val.string.val = const_cast<char*>(name.data());
            k.val.string.len = static_cast<int>(name.size());
            v.type = jbvString;
            v.val.string.val = const_cast<char*>(value.data());
            v.val.string.len = static_cast<int>(value.size());
            pushJsonbValue(&state, WJB_KEY, &k);
            pushJsonbValue(&state, WJB_VALUE, &v);
        }
        Jsonb* lineage = JsonbValueToJsonb(pushJsonbValue(&state, WJB_END_OBJECT, nullptr));
        if (headers == nullptr) return lineage;
        return DatumGetJsonbP(
            DirectFunctionCall2(jsonb_concat, JsonbPGetDatum(headers), JsonbPGetDatum(lineage)));
    });
}

// What send() records of inbox row `row` whose handler (mode 'live') sends: its subscription
// and received_at (for eventbox_e2e_seconds). False when the row lacks either.
bool cause_of(Datum row, outbox::Cause* cause) {
    HeapTupleHeader tuple = DatumGetHeapTupleHeader(row);
    bool sub_null, at_null;
    Datum subscription = GetAttributeByName(tuple, "subscription", &sub_null);
    Datum received_at = GetAttributeByName(tuple, "received_at", &at_null);
    if (sub_null || at_null) return false;
    cause->subscription = DatumGetTextPP(subscription);
    cause->received_at = DatumGetTimestampTz(received_at);
    return true;
}

// What the SQL insert paths below run in: the table owner's identity with search_path pinned
// to pg_catalog (what send() had as SECURITY DEFINER). An error on the way out is cleaned up
// by the (sub)transaction's abort, like fmgr's own security-definer calls. Trivially
// destructible: it lives on frames an ERROR can leave.
struct OwnerContext {
    Oid saved_user;
    int saved_context;
    int nest;
};

OwnerContext enter_owner_context(Oid owner) {
    OwnerContext c;
    GetUserIdAndSecContext(&c.saved_user, &c.saved_context);
    SetUserIdAndSecContext(owner, c.saved_context | SECURITY_LOCAL_USERID_CHANGE);
    c.nest = NewGUCNestLevel();
    (void)set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION,
                            GUC_ACTION_SAVE, true, 0, false);
    return c;
}

void leave_owner_context(const OwnerContext& c) {
    AtEOXact_GUC(true, c.nest);
    SetUserIdAndSecContext(c.saved_user, c.saved_context);
}

// The outbox row through SQL: what the direct path (outbox_insert.cpp) falls back to. send()
// is SECURITY INVOKER (a definer's SET search_path cost every call a GUC nest level and two
// search path recomputations): the INSERT, and the triggers someone gave the table, run in the
// owner's context above.
void insert_with_spi(Oid owner, pg_uuid_t* message_id, text* topic, text* key, bytea* payload,
                     Jsonb* headers, const outbox::Cause* cause) {
    OwnerContext as_owner = enter_owner_context(owner);
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    if (cause != nullptr && insert_cause_plan == nullptr) {
        Oid types[7] = {UUIDOID, TEXTOID, BYTEAOID, BYTEAOID, JSONBOID, TEXTOID, TIMESTAMPTZOID};
        SPIPlanPtr plan = SPI_prepare(
            "INSERT INTO eventbox.outbox (message_id, topic, key, payload, headers, "
            "cause_subscription, cause_received_at) "
            "VALUES ($1, $2, $3, $4, coalesce($5, '{}'::jsonb), $6, $7)",
            7, types);
        if (plan == nullptr)
            elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
        if (SPI_keepplan(plan) != 0) elog(ERROR, "SPI_keepplan failed");
        insert_cause_plan = plan;
    }
    if (cause == nullptr && insert_plan == nullptr) {
        Oid types[5] = {UUIDOID, TEXTOID, BYTEAOID, BYTEAOID, JSONBOID};
        SPIPlanPtr plan = SPI_prepare(
            "INSERT INTO eventbox.outbox (message_id, topic, key, payload, headers) "
            "VALUES ($1, $2, $3, $4, coalesce($5, '{}'::jsonb))",
            5, types);
        if (plan == nullptr)
            elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
        if (SPI_keepplan(plan) != 0) elog(ERROR, "SPI_keepplan failed");
        insert_plan = plan;
    }
    Datum values[7] = {UUIDPGetDatum(message_id),
                       PointerGetDatum(topic),
                       PointerGetDatum(key),
                       PointerGetDatum(payload),
                       PointerGetDatum(headers),
                       cause ? PointerGetDatum(cause->subscription) : (Datum)0,
                       cause ? TimestampTzGetDatum(cause->received_at) : (Datum)0};
    char nulls[7] = {' ', ' ', key ? ' ' : 'n', payload ? ' ' : 'n', headers ? ' ' : 'n', ' ', ' '};
    int rc = SPI_execute_plan(cause ? insert_cause_plan : insert_plan, values, nulls, false, 0);
    if (rc != SPI_OK_INSERT) elog(ERROR, "outbox insert failed: %s", SPI_result_code_string(rc));
    SPI_finish();
    leave_owner_context(as_owner);
}

// What send() keeps instead of publishing, in a handler running in mode 'replay' or 'backfill':
// a row of eventbox.suppressed_sends, stored as the table's owner with search_path pinned (as
// insert_with_spi() does for the outbox).
SPIPlanPtr suppressed_plan = nullptr;

void insert_suppressed(Datum handled, const char* mode, pg_uuid_t* message_id, text* topic,
                       text* key, bytea* payload, Jsonb* headers) {
    HeapTupleHeader row = DatumGetHeapTupleHeader(handled);
    bool sub_null, id_null;
    Datum subscription = GetAttributeByName(row, "subscription", &sub_null);
    Datum caused_by = GetAttributeByName(row, "message_id", &id_null);
    Oid relid = RangeVarGetRelid(
        makeRangeVar(const_cast<char*>("eventbox"), const_cast<char*>("suppressed_sends"), -1),
        NoLock, false);
    HeapTuple rel = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
    if (!HeapTupleIsValid(rel)) elog(ERROR, "cache lookup failed for relation %u", relid);
    Oid owner = reinterpret_cast<Form_pg_class>(GETSTRUCT(rel))->relowner;
    ReleaseSysCache(rel);
    OwnerContext as_owner = enter_owner_context(owner);
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    if (suppressed_plan == nullptr) {
        Oid types[8] = {UUIDOID, TEXTOID, BYTEAOID, BYTEAOID, JSONBOID, TEXTOID, TEXTOID, TEXTOID};
        SPIPlanPtr plan = SPI_prepare(
            "INSERT INTO eventbox.suppressed_sends (message_id, topic, key, payload, headers, "
            "mode, subscription, caused_by) "
            "VALUES ($1, $2, $3, $4, coalesce($5, '{}'::jsonb), $6, $7, $8)",
            8, types);
        if (plan == nullptr)
            elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
        if (SPI_keepplan(plan) != 0) elog(ERROR, "SPI_keepplan failed");
        suppressed_plan = plan;
    }
    Datum values[8] = {UUIDPGetDatum(message_id),
                       PointerGetDatum(topic),
                       PointerGetDatum(key),
                       PointerGetDatum(payload),
                       PointerGetDatum(headers),
                       CStringGetTextDatum(mode),
                       subscription,
                       caused_by};
    char nulls[8] = {' ',
                     ' ',
                     key ? ' ' : 'n',
                     payload ? ' ' : 'n',
                     headers ? ' ' : 'n',
                     ' ',
                     sub_null ? 'n' : ' ',
                     id_null ? 'n' : ' '};
    int rc = SPI_execute_plan(suppressed_plan, values, nulls, false, 0);
    if (rc != SPI_OK_INSERT)
        elog(ERROR, "suppressed_sends insert failed: %s", SPI_result_code_string(rc));
    SPI_finish();
    leave_owner_context(as_owner);
}

// ---- registry formats: send()'s check (outbox/send_formats.hpp) ----------------------------

// This backend's check and what it was loaded from: eventbox.topic_formats as of the HTTP
// relay's route generation (which the table's trigger moves at commit, as it does for
// destinations) and of this backend's own changes (which the generation does not show before
// their commit: a send() after set_topic_format() in the same transaction checks the new
// format), and the registry settings. Deleted when the backend exits.
outbox::FormatCheck* format_check = nullptr;
uint64 formats_generation = 0;
uint64 formats_own_changes = 0;
bool formats_loaded = false;

void free_format_check(int, Datum) {
    delete format_check;
    format_check = nullptr;
}

// The rows of eventbox.topic_formats, read as the table's owner (the caller may not read it),
// as plain data; n is 0 when the table does not exist (an extension not updated yet).
struct FormatRows {
    int n = 0;
    char** topic = nullptr;
    char** value_subject = nullptr;  // "": none
    int* value_version = nullptr;
    char** key_subject = nullptr;
    int* key_version = nullptr;
};

// `s` copied into the memory context that was current at SPI_connect().
char* upper_copy(const char* s) {
    std::size_t n = strlen(s) + 1;
    auto* copy = static_cast<char*>(SPI_palloc(n));
    memcpy(copy, s, n);
    return copy;
}

void read_format_rows(FormatRows* rows) {
    Oid relid = RangeVarGetRelid(
        makeRangeVar(const_cast<char*>("eventbox"), const_cast<char*>("topic_formats"), -1), NoLock,
        true);
    if (!OidIsValid(relid)) return;
    HeapTuple rel = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
    if (!HeapTupleIsValid(rel)) return;
    Oid owner = reinterpret_cast<Form_pg_class>(GETSTRUCT(rel))->relowner;
    ReleaseSysCache(rel);
    OwnerContext as_owner = enter_owner_context(owner);
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "SPI_connect failed");
    int rc = SPI_execute(
        "SELECT topic, coalesce(value_subject, ''), coalesce(value_version, 0), "
        "coalesce(key_subject, ''), coalesce(key_version, 0) FROM eventbox.topic_formats",
        true, 0);
    if (rc != SPI_OK_SELECT) elog(ERROR, "reading eventbox.topic_formats failed");
    int n = static_cast<int>(SPI_processed);
    rows->topic = static_cast<char**>(SPI_palloc(sizeof(char*) * Max(n, 1)));
    rows->value_subject = static_cast<char**>(SPI_palloc(sizeof(char*) * Max(n, 1)));
    rows->key_subject = static_cast<char**>(SPI_palloc(sizeof(char*) * Max(n, 1)));
    rows->value_version = static_cast<int*>(SPI_palloc(sizeof(int) * Max(n, 1)));
    rows->key_version = static_cast<int*>(SPI_palloc(sizeof(int) * Max(n, 1)));
    for (int i = 0; i < n; ++i) {
        HeapTuple tuple = SPI_tuptable->vals[i];
        TupleDesc desc = SPI_tuptable->tupdesc;
        bool isnull;
        rows->topic[i] = upper_copy(SPI_getvalue(tuple, desc, 1));
        rows->value_subject[i] = upper_copy(SPI_getvalue(tuple, desc, 2));
        rows->value_version[i] = DatumGetInt32(SPI_getbinval(tuple, desc, 3, &isnull));
        rows->key_subject[i] = upper_copy(SPI_getvalue(tuple, desc, 4));
        rows->key_version[i] = DatumGetInt32(SPI_getbinval(tuple, desc, 5, &isnull));
    }
    rows->n = n;
    SPI_finish();
    leave_owner_context(as_owner);
}

// The check, reloaded when the topic formats or the registry settings changed since.
outbox::FormatCheck& current_format_check() {
    if (format_check == nullptr) {
        format_check = new outbox::FormatCheck();
        pg_guard([] { on_proc_exit(free_format_check, 0); });
    }
    uint64 generation = pg_guard([] { return http_relay::generation(); });
    uint64 own_changes = http_relay::own_changes();
    const char* url = guc::schema_registry_url ? guc::schema_registry_url : "";
    const char* options = guc::schema_registry_options ? guc::schema_registry_options : "";
    // Every send() asks: no allocation unless something changed.
    if (formats_loaded && generation == formats_generation && own_changes == formats_own_changes &&
        (format_check->empty() || format_check->same_settings(url, options)))
        return *format_check;
    std::string settings = std::string(url) + "|" + options;
    {
        FormatRows rows;
        pg_guard([&] { read_format_rows(&rows); });
        std::vector<relay::TopicFormat> formats;
        for (int i = 0; i < rows.n; ++i)
            formats.push_back(relay::TopicFormat{rows.topic[i], rows.value_subject[i],
                                                 rows.value_version[i], rows.key_subject[i],
                                                 rows.key_version[i]});
        format_check->configure(std::move(formats), settings, registry::make_config(url, options));
        formats_generation = generation;
        formats_own_changes = own_changes;
        formats_loaded = true;
    }
    return *format_check;
}

// Refuses (22023) a payload or key the schema of `topic`'s registry format cannot encode, when
// this backend has that schema (outbox/send_formats.hpp); nothing for the other topics.
void check_topic_format(text* topic, bytea* payload, text* key) {
    outbox::FormatCheck& check = current_format_check();
    if (check.empty()) return;
    std::string_view name(VARDATA_ANY(topic), VARSIZE_ANY_EXHDR(topic));
    const relay::TopicFormat* format = check.format(name);
    if (format == nullptr) return;
    int64_t now_ms = pg_guard([] {
        return static_cast<int64_t>(GetCurrentTimestamp() / 1000 +
                                    int64{POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE} * SECS_PER_DAY *
                                        1000);
    });
    outbox::FormatVerdict verdict = check.check(
        *format, payload ? VARDATA_ANY(payload) : nullptr, payload ? VARSIZE_ANY_EXHDR(payload) : 0,
        key ? VARDATA_ANY(key) : nullptr, key ? VARSIZE_ANY_EXHDR(key) : 0, now_ms);
    if (!verdict.refused) return;
    throw Error(sqlstate::kInvalidParameterValue,
                std::string(verdict.key ? "key" : "payload") +
                    " does not fit the schema of topic \"" + printable(name) + "\"",
                verdict.reason,
                verdict.key
                    ? "With key_format 'registry' the key is JSON text its subject's schema "
                      "accepts (a string key is '\"c-1\"'); see eventbox.topic_formats."
                    : "Send a payload its subject's schema accepts, or change the topic's "
                      "format with eventbox.set_topic_format() or eventbox.reset_topic_format().");
}

}  // namespace

void outbox::require_writable(const char* function) {
    // What a plain INSERT raises in a read-only transaction, and so on a hot standby, where
    // drawing the outbox id's transaction id would fail with an internal error instead: drivers
    // and poolers look for 25006 to reconnect to the new primary after a failover.
    if (!XactReadOnly) return;
    throw Error("25006", std::string("cannot execute ") + function + " in a read-only transaction",
                {},
                RecoveryInProgress() ? "This server is a standby: send from the primary."
                                     : "Send from a read-write transaction.");
}

Datum outbox::send_message(FunctionCallInfo fcinfo, bytea* payload, bool json, bool sixth) {
    require_writable("eventbox.send()");
    bool publish_in_replay = sixth && !PG_ARGISNULL(5) && PG_GETARG_BOOL(5);
    if (PG_ARGISNULL(0))
        throw Error("22004", "topic must not be NULL", {}, "Pass the Kafka topic to publish to.");
    text* topic = pg_guard([&] { return PG_GETARG_TEXT_PP(0); });
    validate_topic(std::string_view(VARDATA_ANY(topic), VARSIZE_ANY_EXHDR(topic)));

    text* key = PG_ARGISNULL(2) ? nullptr : pg_guard([&] { return PG_GETARG_TEXT_PP(2); });
    Jsonb* headers = PG_ARGISNULL(3) ? nullptr : pg_guard([&] { return PG_GETARG_JSONB_P(3); });
    // Sent while a handler runs (a worker's or eventbox.process()'s): with lineage headers, on
    // both insert paths below.
    Datum handled = handlers::current_message();
    if (handled != (Datum)0) headers = with_lineage(headers, handled);
    size_t header_bytes = headers ? validate_headers(headers) : 0;
    pg_uuid_t* message_id =
        PG_ARGISNULL(4) ? pg_guard(new_message_id) : pg_guard([&] { return PG_GETARG_UUID_P(4); });

    // What the relay's producer counts against its limit: key, value and headers, each
    // header with its framing (the message_id header too: 36 characters), plus the record's
    // own fields.
    size_t bytes = (payload ? VARSIZE_ANY_EXHDR(payload) : 0) + (key ? VARSIZE_ANY_EXHDR(key) : 0) +
                   header_bytes + header_wire_bytes(kMessageIdHeader.size(), 36) +
                   kRecordOverheadBytes;
    validate_message_size(bytes, static_cast<size_t>(guc::max_message_bytes));
    check_topic_format(topic, payload, key);

    // In a handler: a dry run only reports the send; a replay or backfill run keeps it in
    // eventbox.suppressed_sends unless the handler insists (publish_in_replay). A live run's
    // send carries its cause, for the end-to-end latency (a replayed message's received_at is
    // not when its event happened).
    outbox::Cause cause_data;
    outbox::Cause* cause = nullptr;
    if (handled != (Datum)0) {
        if (pg_guard([&] { return handlers::dry_run_capture(topic, key, payload, json, headers); }))
            PG_RETURN_UUID_P(message_id);
        const char* mode = pg_guard([] { return handlers::current_mode(); });
        if (!publish_in_replay && mode != nullptr && strcmp(mode, "live") != 0) {
            pg_guard([&] {
                insert_suppressed(handled, mode, message_id, topic, key, payload, headers);
            });
            PG_RETURN_UUID_P(message_id);
        }
        if ((mode == nullptr || strcmp(mode, "live") == 0) &&
            pg_guard([&] { return cause_of(handled, &cause_data); }))
            cause = &cause_data;
    }

    pg_guard([&] {
        Oid owner;
        bool cause_columns = false;
        if (!outbox::insert_row(message_id, !PG_ARGISNULL(4), topic, key, payload, headers, cause,
                                &owner, &cause_columns))
            insert_with_spi(owner, message_id, topic, key, payload, headers,
                            cause_columns ? cause : nullptr);
        shmem::wake_relay_at_commit();
        metrics::outbox_added_at_commit(1);
    });
    PG_RETURN_UUID_P(message_id);
}

}  // namespace eventbox
