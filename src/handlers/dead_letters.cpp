// The failure workflow of a subscription (see handlers/dead_letters.hpp). Each statement is
// prepared the first time it runs (worker::KeptStatement).
extern "C" {
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/memutils.h"
}

#include <string_view>

#include "handlers/dead_letters.hpp"
#include "handlers/dead_policy.hpp"
#include "metrics/counters.hpp"
#include "pg/shmem.hpp"
#include "workers/common.hpp"

namespace eventbox::handlers::dead_letters {

namespace {

using worker::KeptStatement;

const char* const kWho = "eventbox dead letters";
Policy current{false, false, ""};

// The record a dead-letter topic receives for inbox row `d`: its key, its value bytes (the
// producer's, in raw_payload: a subscription with a dead-letter topic keeps them for every
// record, inbox::keeps_raw(); the stored JSON's text only for a row stored before it had one),
// its headers (those of raw_headers, exactly as they came, carried in the one header the relay
// expands, inbox::kRawHeadersHeader; else the string values of the jsonb headers; the
// message_id header is the outbox row's own either way), and the headers saying where it came
// from and why it failed, named after Kafka Connect's dead-letter headers where one fits.
#define DLT_COLUMNS                                                                              \
    "gen_random_uuid(), d.key, "                                                                 \
    "coalesce(d.raw_payload, convert_to(d.payload::text, 'UTF8')), "                             \
    "CASE WHEN d.raw_headers IS NULL "                                                           \
    "THEN coalesce((SELECT jsonb_object_agg(h.key, h.value) FROM jsonb_each(d.headers) h "       \
    "          WHERE jsonb_typeof(h.value) = 'string' AND h.key <> 'message_id'), '{}'::jsonb) " \
    "ELSE jsonb_build_object('__eventbox.raw_headers', "                                         \
    "                        translate(encode(d.raw_headers, 'base64'), E'\\n', '')) END "       \
    "|| jsonb_strip_nulls(jsonb_build_object("                                                   \
    "  '__connect.errors.topic', d.topic, "                                                      \
    "  '__connect.errors.partition', d.\"partition\"::text, "                                    \
    "  '__connect.errors.offset', d.\"offset\"::text, "                                          \
    "  '__connect.errors.connector.name', d.subscription, "                                      \
    "  '__connect.errors.exception.class.name', "                                                \
    "    CASE WHEN d.last_error ~ '^[0-9A-Z]{5}: ' THEN left(d.last_error, 5) END, "             \
    "  '__connect.errors.exception.message', "                                                   \
    "    CASE WHEN d.last_error ~ '^[0-9A-Z]{5}: ' THEN substr(d.last_error, 8) "                \
    "         ELSE d.last_error END, "                                                           \
    "  '__eventbox.errors.message_id', d.message_id, "                                           \
    "  '__eventbox.errors.attempts', d.attempts::text, "                                         \
    "  '__eventbox.errors.status', d.status, "                                                   \
    "  '__eventbox.errors.subscriptions', concat_ws(',', "                                       \
    "    coalesce(d.headers ->> '__eventbox.errors.subscriptions', "                             \
    "             d.headers ->> '__connect.errors.connector.name'), d.subscription)))"

// Whether inbox row `x` came from this subscription's own dead letters: a dead-letter topic
// loop through other subscriptions (one through the subscription's own topics is refused when
// it is set up) closes here. A dead letter names the subscription that wrote it
// (__connect.errors.connector.name) and, since the next dead letter replaces that header, every
// subscription that dead-lettered the record, in order (__eventbox.errors.subscriptions). A
// subscription never dead-letters a record that names it: a loop ends at its first return, and
// a trail holds each subscription once.
#define DLT_CAME_BACK                                                            \
    "coalesce(x.headers ->> '__connect.errors.connector.name' = x.subscription " \
    "         OR x.subscription = ANY (string_to_array("                         \
    "              x.headers ->> '__eventbox.errors.subscriptions', ',')), false)"

// What last_error adds for a message that got no dead letter for that reason.
#define DLT_CAME_BACK_NOTE "'(no dead letter: it came from this subscription''s dead letters)'"

// The rows these statements read are found by primary key (a lane's blocks, an id list), one
// probe per row: a subquery with LIMIT for each block, EVENTBOX_INBOX_BY_ID for each id (a join
// or EXISTS could be planned as one walk of the subscription's rows in key order). Their
// status is tested as coalesce(status, '') so that no partial index of the inbox whose
// predicate the test would imply can join the primary key probes in a BitmapAnd, which would
// walk that index whole (none is partial on status since 0.6.0; the rule stays).

// The subscription's failure options, by its primary key.
KeptStatement policy_statement{
    "SELECT on_dead = 'block_key', dead_letter_topic IS NOT NULL, "
    "array_to_string(non_retryable, ',') FROM eventbox.subscriptions WHERE name = $1",
    1,
    {TEXTOID},
    nullptr};

// Blocks whose message is no longer dead or waiting (processed, skipped, deleted) are
// dropped; the others hold their key back unless their message is due to run now.
KeptStatement blocked_statement{
    "WITH released AS ("
    "  DELETE FROM eventbox.key_blocks b"
    "   WHERE b.subscription = $1 AND b.topic = $2 AND b.\"partition\" = $3"
    "     AND (SELECT 1 FROM eventbox.inbox i"
    "           WHERE i.subscription = $1 AND i.message_id = b.message_id"
    "             AND coalesce(i.status, '') IN ('dead', 'received', 'retry') LIMIT 1)"
    "         IS NULL)"
    "SELECT b.key FROM eventbox.key_blocks b"
    " WHERE b.subscription = $1 AND b.topic = $2 AND b.\"partition\" = $3"
    "   AND (SELECT coalesce(i.status, '') = 'dead'"
    "            OR (coalesce(i.status, '') IN ('received', 'retry')"
    "                AND i.next_attempt_at > clock_timestamp())"
    "          FROM eventbox.inbox i"
    "         WHERE i.subscription = $1 AND i.message_id = b.message_id LIMIT 1)",
    3,
    {TEXTOID, TEXTOID, INT4OID},
    nullptr};

// Messages that came back from this subscription's own dead letters (DLT_CAME_BACK) get no
// dead letter; their last_error says why (by ctid: a TID scan).
KeptStatement dead_statement{
    "WITH d AS (SELECT x.* FROM unnest($2::text[]) AS u(id)"
    EVENTBOX_INBOX_BY_ID("*, x.ctid AS t, " DLT_CAME_BACK " AS came_back",
                         "AND coalesce(x.status, '') = 'dead'") "),"
    " s AS (SELECT on_dead, dead_letter_topic FROM eventbox.subscriptions WHERE name = $1),"
    " blocks AS ("
    "  INSERT INTO eventbox.key_blocks (subscription, topic, \"partition\", key, message_id,"
    "                                   \"offset\")"
    "  SELECT d.subscription, d.topic, d.\"partition\", d.key, d.message_id, d.\"offset\""
    "    FROM d, s WHERE s.on_dead = 'block_key' AND d.key IS NOT NULL"
    "   ORDER BY d.\"offset\""
    "  ON CONFLICT DO NOTHING),"
    " came_back AS ("
    "  UPDATE eventbox.inbox i SET last_error = concat_ws(' ', i.last_error, "
    DLT_CAME_BACK_NOTE ")"
    "    FROM d, s WHERE s.dead_letter_topic IS NOT NULL AND d.came_back AND i.ctid = d.t) "
    "INSERT INTO eventbox.outbox (message_id, key, payload, headers, topic) "
    "SELECT " DLT_COLUMNS ", s.dead_letter_topic FROM d, s"
    " WHERE s.dead_letter_topic IS NOT NULL AND NOT d.came_back"
    " ORDER BY d.topic, d.\"partition\", d.\"offset\"",
    2, {TEXTOID, TEXTARRAYOID}, nullptr};

// Only rows the batch's insert wrote ($3, their xmin): a record stored again (a replay)
// finds its row there already and is not sent twice. One that came back from this
// subscription's own dead letters gets none, as in dead_statement.
KeptStatement unparsable_statement{
    "WITH s AS (SELECT dead_letter_topic FROM eventbox.subscriptions"
    "            WHERE name = $1 AND dead_letter_topic IS NOT NULL),"
    " d AS (SELECT x.* FROM s, unnest($2::text[]) AS u(id)"
    EVENTBOX_INBOX_BY_ID("*, x.ctid AS t, " DLT_CAME_BACK " AS came_back, xmin AS inserted_by",
                         "AND coalesce(x.status, '') = 'unparsable'")
    "        WHERE x.inserted_by = $3),"
    " came_back AS ("
    "  UPDATE eventbox.inbox i SET last_error = concat_ws(' ', i.last_error, "
    DLT_CAME_BACK_NOTE ")"
    "    FROM d WHERE d.came_back AND i.ctid = d.t) "
    "INSERT INTO eventbox.outbox (message_id, key, payload, headers, topic) "
    "SELECT " DLT_COLUMNS ", s.dead_letter_topic FROM s, d WHERE NOT d.came_back"
    " ORDER BY d.topic, d.\"partition\", d.\"offset\"",
    3, {TEXTOID, TEXTARRAYOID, XIDOID}, nullptr};

}  // namespace

void load(Datum subscription, MemoryContext keep, Policy* policy) {
    Datum args[1] = {subscription};
    exec_kept(kWho, policy_statement, args, true, SPI_OK_SELECT);
    MemoryContext old = MemoryContextSwitchTo(keep);
    *policy = Policy{false, false, ""};
    if (SPI_processed == 1) {
        HeapTuple t = SPI_tuptable->vals[0];
        TupleDesc d = SPI_tuptable->tupdesc;
        bool isnull;
        policy->block_key = DatumGetBool(SPI_getbinval(t, d, 1, &isnull));
        policy->has_topic = DatumGetBool(SPI_getbinval(t, d, 2, &isnull));
        Datum codes = SPI_getbinval(t, d, 3, &isnull);
        policy->codes = isnull ? "" : TextDatumGetCString(codes);
    }
    MemoryContextSwitchTo(old);
    current = *policy;
}

bool refuses(const Policy& policy, const char* error) {
    return error != nullptr && not_retryable(error, policy.codes);
}

void add_blocked_keys(Datum subscription, Datum topic, int32 partition, Datum** keys, int* n) {
    MemoryContext caller = CurrentMemoryContext;
    Datum args[3] = {subscription, topic, Int32GetDatum(partition)};
    exec_kept(kWho, blocked_statement, args, false, SPI_OK_SELECT);
    MemoryContextSwitchTo(caller);
    if (SPI_processed == 0) return;
    Datum* all = static_cast<Datum*>(palloc(sizeof(Datum) * (*n + SPI_processed)));
    for (int k = 0; k < *n; ++k) all[k] = (*keys)[k];
    for (uint64 r = 0; r < SPI_processed; ++r) {
        bool isnull;
        Datum key = SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1, &isnull);
        if (!isnull) all[(*n)++] = datumCopy(key, false, -1);
    }
    *keys = all;
}

void after_dead(Datum subscription, Datum ids) {
    if (!current.block_key && !current.has_topic) return;
    MemoryContext caller = CurrentMemoryContext;
    Datum args[2] = {subscription, ids};
    exec_kept(kWho, dead_statement, args, false, SPI_OK_INSERT);
    MemoryContextSwitchTo(caller);
    if (SPI_processed > 0) {
        shmem::wake_relay_at_commit();
        metrics::outbox_added_at_commit(SPI_processed);
    }
}

void after_unparsable(Datum subscription, Datum ids, TransactionId writer) {
    MemoryContext caller = CurrentMemoryContext;
    Datum args[3] = {subscription, ids, TransactionIdGetDatum(writer)};
    exec_kept(kWho, unparsable_statement, args, false, SPI_OK_INSERT);
    MemoryContextSwitchTo(caller);
    if (SPI_processed > 0) {
        shmem::wake_relay_at_commit();
        metrics::outbox_added_at_commit(SPI_processed);
    }
}

}  // namespace eventbox::handlers::dead_letters
