// HTTP destinations, PostgreSQL side (see outbox/http_relay.hpp).
extern "C" {
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
}

#include <algorithm>
#include <string>
#include <vector>

#include "metrics/counters.hpp"
#include "outbox/amqp_relay.hpp"
#include "outbox/http_relay.hpp"
#include "pg/boundary.hpp"
#include "pg/shmem.hpp"
#include "workers/common.hpp"

namespace eventbox::http_relay {

namespace {

constexpr int kSlots = 64;  // destinations with counters of their own; the rest share slot 0
constexpr int kTopicMax = 256;

struct DestinationCounters {
    char topic[kTopicMax];
    pg_atomic_uint64 requests;
    pg_atomic_uint64 responses[5];  // 2xx, 3xx, 4xx, 5xx, no response
    pg_atomic_uint64 retries;
    pg_atomic_uint64 latency[metrics::kBounds + 1];
    pg_atomic_uint64 latency_sum_us;
    pg_atomic_uint64 messages[3];  // delivered, retried, rejected (per message of any request)
    pg_atomic_uint64 delivery[metrics::kBounds + 1];  // created_at -> 2xx, per message
    pg_atomic_uint64 delivery_sum_ms;
    pg_atomic_uint32 breaker;                 // 0: none, else 1 + http::Breaker::State
    pg_atomic_uint64 breaker_since;           // TimestampTz of its last transition (0: none yet)
    pg_atomic_uint64 breaker_transitions[3];  // into closed, open, half-open
};

struct Shared {
    pg_atomic_uint64 generation;
    pg_atomic_uint32 committing;  // changes between their two moves of the generation
    slock_t mutex;
    int used;  // slots taken (slot 0 is the overflow entry, topic "")
    DestinationCounters slots[kSlots + 1];
};

constexpr const char* kClasses[5] = {"2xx", "3xx", "4xx", "5xx", "error"};

Shared* shared = nullptr;
shmem_request_hook_type prev_request_hook = nullptr;
shmem_startup_hook_type prev_startup_hook = nullptr;

void request_hook() {
    if (prev_request_hook) prev_request_hook();
    RequestAddinShmemSpace(sizeof(Shared));
}

void startup_hook() {
    if (prev_startup_hook) prev_startup_hook();
    LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
    bool found = false;
    shared = static_cast<Shared*>(ShmemInitStruct("pg_eventbox http", sizeof(Shared), &found));
    if (!found) {
        memset(shared, 0, sizeof(Shared));
        pg_atomic_init_u64(&shared->generation, 1);
        pg_atomic_init_u32(&shared->committing, 0);
        SpinLockInit(&shared->mutex);
        shared->used = 1;
        for (DestinationCounters& c : shared->slots) {
            pg_atomic_init_u64(&c.requests, 0);
            for (auto& r : c.responses) pg_atomic_init_u64(&r, 0);
            pg_atomic_init_u64(&c.retries, 0);
            for (auto& l : c.latency) pg_atomic_init_u64(&l, 0);
            pg_atomic_init_u64(&c.latency_sum_us, 0);
            for (auto& m : c.messages) pg_atomic_init_u64(&m, 0);
            for (auto& d : c.delivery) pg_atomic_init_u64(&d, 0);
            pg_atomic_init_u64(&c.delivery_sum_ms, 0);
            pg_atomic_init_u32(&c.breaker, 0);
            pg_atomic_init_u64(&c.breaker_since, 0);
            for (auto& t : c.breaker_transitions) pg_atomic_init_u64(&t, 0);
        }
    }
    LWLockRelease(AddinShmemInitLock);
}

// The counters slot of `topic`, taken on first use (0, the overflow entry, when all are taken).
int slot_of(const char* topic) {
    if (shared == nullptr) return -1;
    SpinLockAcquire(&shared->mutex);
    int slot = 0;
    for (int i = 1; i < shared->used; ++i)
        if (strncmp(shared->slots[i].topic, topic, kTopicMax) == 0) slot = i;
    if (slot == 0 && shared->used <= kSlots) {
        slot = shared->used++;
        strlcpy(shared->slots[slot].topic, topic, kTopicMax);
    }
    SpinLockRelease(&shared->mutex);
    return slot;
}

bool bump_registered = false;
bool bump_pending = false;     // this transaction changed destinations
bool between_moves = false;    // ... and its first move is done, the second one not yet
uint64 own_changes_count = 0;  // own_changes()

// The two moves of a change (outbox/relay_routes.hpp): the first before the commit becomes
// visible (committing, then generation), the second after it (generation, then committing).
// A relay that reads the generation after its snapshot thus sees the first move of every
// change its snapshot shows; one that reads the stamp before its snapshot, with nothing
// committing, has a snapshot that shows every change the generation counts.
void first_move() {
    if (shared == nullptr || between_moves) return;
    pg_atomic_fetch_add_u32(&shared->committing, 1);
    pg_atomic_fetch_add_u64(&shared->generation, 1);
    between_moves = true;
}

void second_move() {
    if (shared == nullptr || !between_moves) return;
    pg_atomic_fetch_add_u64(&shared->generation, 1);
    pg_atomic_fetch_sub_u32(&shared->committing, 1);
    between_moves = false;
}

void on_xact_event(XactEvent event, void*) {
    switch (event) {
        case XACT_EVENT_PRE_COMMIT:
        case XACT_EVENT_PARALLEL_PRE_COMMIT:
            if (bump_pending) first_move();
            break;
        case XACT_EVENT_COMMIT:
        case XACT_EVENT_PARALLEL_COMMIT:
            second_move();  // after ProcArrayEndTransaction(): the change is visible
            if (bump_pending) {
                shmem::wake_relay();
                ++own_changes_count;
            }
            bump_pending = false;
            break;
        case XACT_EVENT_ABORT:
        case XACT_EVENT_PARALLEL_ABORT:
        case XACT_EVENT_PREPARE:
            second_move();  // an abort after PRE_COMMIT ends the bracket too
            if (bump_pending) ++own_changes_count;
            bump_pending = false;
            break;
        default:
            break;
    }
}

// A rollback to a savepoint may undo a change this transaction made.
void on_subxact_event(SubXactEvent event, SubTransactionId, SubTransactionId, void*) {
    if (event == SUBXACT_EVENT_ABORT_SUB && bump_pending) ++own_changes_count;
}

// One row of eventbox.http_destination_config as plain data.
struct LoadedRow {
    char* topic;
    char* url;
    char* method;
    char** header_names;
    char** header_values;
    int n_headers;
    int64 timeout_ms;
    int max_in_flight;
    int batch_size;
    int64 batch_wait_ms;
    char* batch_format;
    char** signing_secrets;
    int n_secrets;
    double rate_limit;
    int rate_burst;
    double max_messages_per_second;
    int breaker_failures;
    int64 breaker_cooldown_ms;
};

}  // namespace

void install_hooks() {
    prev_request_hook = shmem_request_hook;
    shmem_request_hook = request_hook;
    prev_startup_hook = shmem_startup_hook;
    shmem_startup_hook = startup_hook;
}

relay::RouteStamp stamp() {
    if (shared == nullptr) return relay::RouteStamp{0, 1};
    // Generation first, then committing (the reverse of the first move's order): a change
    // that moved after the generation was read shows as a later generation, one between its
    // moves before it shows in committing. fetch_add(0) is a full barrier.
    relay::RouteStamp stamp;
    stamp.generation = pg_atomic_fetch_add_u64(&shared->generation, 0);
    stamp.committing = pg_atomic_fetch_add_u32(&shared->committing, 0);
    return stamp;
}

uint64 generation() {
    return shared ? pg_atomic_fetch_add_u64(&shared->generation, 0) : 0;
}

namespace {

// Whether the destinations' table exists: not before the extension's 0.2.0 (the relay of an
// older schema has no destinations).
bool destinations_exist() {
    int rc =
        SPI_execute("SELECT to_regclass('eventbox.http_destination_config') IS NOT NULL", true, 1);
    bool isnull;
    if (rc != SPI_OK_SELECT) elog(ERROR, "eventbox relay: SPI_execute failed");
    return DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

// Whether the destinations have the options of 0.4.0 (bulk requests, signing secrets): not
// before the extension is updated to 0.4.0.
bool destinations_have_batches() {
    int rc = SPI_execute(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_attribute WHERE attrelid = "
        "'eventbox.http_destination_config'::regclass AND attname = 'batch_size' "
        "AND NOT attisdropped)",
        true, 1);
    bool isnull;
    if (rc != SPI_OK_SELECT) elog(ERROR, "eventbox relay: SPI_execute failed");
    return DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

// Runs the statement reading the destinations (none before the extension's 0.2.0).
void query_destinations() {
    if (!destinations_exist()) {
        SPI_processed = 0;
        return;
    }
    const char* sql =
        destinations_have_batches()
            ? "SELECT topic, url, method, headers, "
              "(extract(epoch FROM timeout) * 1000)::int8, max_in_flight, batch_size, "
              "(extract(epoch FROM batch_wait) * 1000)::int8, batch_format, signing_secrets, "
              "rate_limit, rate_burst, max_messages_per_second, breaker_failures, "
              "(extract(epoch FROM breaker_cooldown) * 1000)::int8 "
              "FROM eventbox.http_destination_config ORDER BY topic"
            : "SELECT topic, url, method, headers, "
              "(extract(epoch FROM timeout) * 1000)::int8, max_in_flight, 1, 100::int8, "
              "'json_array'::text, '{}'::text[], 0::float8, 1, 0::float8, 0, 30000::int8 "
              "FROM eventbox.http_destination_config ORDER BY topic";
    int rc = SPI_execute(sql, true, 0);
    if (rc != SPI_OK_SELECT)
        elog(ERROR, "eventbox relay: reading HTTP destinations failed: %s",
             SPI_result_code_string(rc));
}

// Copies row `i` of the last SPI result into `r` (in the current memory context).
void copy_destination(int i, LoadedRow& r) {
    HeapTuple tuple = SPI_tuptable->vals[i];
    TupleDesc desc = SPI_tuptable->tupdesc;
    bool isnull;
    r.topic = TextDatumGetCString(SPI_getbinval(tuple, desc, 1, &isnull));
    r.url = TextDatumGetCString(SPI_getbinval(tuple, desc, 2, &isnull));
    r.method = TextDatumGetCString(SPI_getbinval(tuple, desc, 3, &isnull));
    Jsonb* headers = DatumGetJsonbP(SPI_getbinval(tuple, desc, 4, &isnull));
    int count = JB_ROOT_IS_OBJECT(headers) ? JB_ROOT_COUNT(headers) : 0;
    r.header_names = static_cast<char**>(palloc0(sizeof(char*) * Max(count, 1)));
    r.header_values = static_cast<char**>(palloc0(sizeof(char*) * Max(count, 1)));
    if (count > 0) {
        JsonbIterator* it = JsonbIteratorInit(&headers->root);
        JsonbValue key, value;
        JsonbIteratorToken token;
        while ((token = JsonbIteratorNext(&it, &key, true)) != WJB_DONE) {
            if (token != WJB_KEY) continue;
            JsonbIteratorNext(&it, &value, true);
            if (value.type != jbvString || r.n_headers >= count) continue;
            r.header_names[r.n_headers] = pnstrdup(key.val.string.val, key.val.string.len);
            r.header_values[r.n_headers] = pnstrdup(value.val.string.val, value.val.string.len);
            ++r.n_headers;
        }
    }
    r.timeout_ms = DatumGetInt64(SPI_getbinval(tuple, desc, 5, &isnull));
    r.max_in_flight = DatumGetInt32(SPI_getbinval(tuple, desc, 6, &isnull));
    r.batch_size = DatumGetInt32(SPI_getbinval(tuple, desc, 7, &isnull));
    r.batch_wait_ms = DatumGetInt64(SPI_getbinval(tuple, desc, 8, &isnull));
    r.batch_format = TextDatumGetCString(SPI_getbinval(tuple, desc, 9, &isnull));
    Datum* secrets;
    bool* nulls;
    deconstruct_array(DatumGetArrayTypeP(SPI_getbinval(tuple, desc, 10, &isnull)), TEXTOID, -1,
                      false, TYPALIGN_INT, &secrets, &nulls, &r.n_secrets);
    r.signing_secrets = static_cast<char**>(palloc0(sizeof(char*) * Max(r.n_secrets, 1)));
    for (int k = 0; k < r.n_secrets; ++k)
        r.signing_secrets[k] = nulls[k] ? pstrdup("") : TextDatumGetCString(secrets[k]);
    r.rate_limit = DatumGetFloat8(SPI_getbinval(tuple, desc, 11, &isnull));
    r.rate_burst = DatumGetInt32(SPI_getbinval(tuple, desc, 12, &isnull));
    r.max_messages_per_second = DatumGetFloat8(SPI_getbinval(tuple, desc, 13, &isnull));
    r.breaker_failures = DatumGetInt32(SPI_getbinval(tuple, desc, 14, &isnull));
    r.breaker_cooldown_ms = DatumGetInt64(SPI_getbinval(tuple, desc, 15, &isnull));
}

// A client for the `n` destinations `rows`.
http::Client* build_client(const LoadedRow* rows, int n, std::size_t queue_limit) {
    int* slots = static_cast<int*>(palloc(sizeof(int) * n));
    for (int i = 0; i < n; ++i) slots[i] = slot_of(rows[i].topic);
    return pg::call_cpp([&] {
        std::vector<http::Destination> destinations;
        for (int i = 0; i < n; ++i) {
            http::Destination d;
            d.topic = rows[i].topic;
            d.url = rows[i].url;
            d.method = rows[i].method;
            for (int h = 0; h < rows[i].n_headers; ++h)
                d.headers.emplace_back(rows[i].header_names[h], rows[i].header_values[h]);
            d.timeout_ms = rows[i].timeout_ms;
            d.max_in_flight = static_cast<std::size_t>(rows[i].max_in_flight);
            d.metrics_slot = slots[i];
            d.batch_size = static_cast<std::size_t>(Max(rows[i].batch_size, 1));
            d.batch_wait_ms = rows[i].batch_wait_ms;
            if (!http::parse_batch_format(rows[i].batch_format, &d.batch_format))
                d.batch_format = http::BatchFormat::kJsonArray;  // the table's CHECK forbids it
            for (int k = 0; k < rows[i].n_secrets; ++k) {
                std::string key;
                // Malformed secrets are refused by the API; one that is not is never sent.
                if (http::decode_webhook_secret(rows[i].signing_secrets[k], &key))
                    d.signing_keys.push_back(std::move(key));
            }
            d.rate_limit = rows[i].rate_limit;
            d.rate_burst = rows[i].rate_burst;
            d.max_messages_per_second = rows[i].max_messages_per_second;
            d.breaker_failures = rows[i].breaker_failures;
            d.breaker_cooldown_ms = rows[i].breaker_cooldown_ms;
            destinations.push_back(std::move(d));
        }
        return new http::Client(std::move(destinations), queue_limit);
    });
}

}  // namespace

char* fingerprint() {
    // The AMQP destinations share the generation: a change of either kind shows here; and the
    // topic formats (outbox/relay_formats.hpp), which route rows through the registry encoding.
    char* destinations = psprintf("amqp:%s", amqp_relay::fingerprint());
    bool isnull;
    int rc;
    if (destinations_exist()) {
        // Every column, as text: any change of a destination changes it.
        rc = SPI_execute(
            "SELECT string_agg(c::text, E'\\n' ORDER BY c.topic) "
            "FROM eventbox.http_destination_config c",
            true, 1);
        if (rc != SPI_OK_SELECT || SPI_processed != 1)
            elog(ERROR, "eventbox relay: reading HTTP destinations failed: %s",
                 SPI_result_code_string(rc));
        Datum value = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
        if (!isnull) destinations = psprintf("%s\n%s", TextDatumGetCString(value), destinations);
    }
    rc = SPI_execute("SELECT to_regclass('eventbox.topic_formats') IS NOT NULL", true, 1);
    if (rc != SPI_OK_SELECT) elog(ERROR, "eventbox relay: SPI_execute failed");
    if (!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)))
        return destinations;
    rc = SPI_execute(
        "SELECT string_agg(f::text, E'\\n' ORDER BY f.topic) FROM eventbox.topic_formats f", true,
        1);
    if (rc != SPI_OK_SELECT || SPI_processed != 1)
        elog(ERROR, "eventbox relay: reading topic formats failed: %s", SPI_result_code_string(rc));
    Datum value = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
    return isnull ? destinations
                  : psprintf("%s\n--formats\n%s", destinations, TextDatumGetCString(value));
}

http::Client* load_client(std::size_t queue_limit, relay::RouteStamp* loaded, char** print) {
    // Read before the snapshot of begin_work() is taken (outbox/relay_routes.hpp).
    *loaded = stamp();
    // The rows outlive SPI_finish(); this context goes at the end of the load.
    MemoryContext load_context =
        AllocSetContextCreate(TopMemoryContext, "eventbox http destinations", ALLOCSET_SMALL_SIZES);
    worker::begin_work("eventbox relay");
    query_destinations();
    int n = static_cast<int>(SPI_processed);
    MemoryContext spi_context = MemoryContextSwitchTo(load_context);
    LoadedRow* rows = static_cast<LoadedRow*>(palloc0(sizeof(LoadedRow) * Max(n, 1)));
    for (int i = 0; i < n; ++i) copy_destination(i, rows[i]);
    MemoryContextSwitchTo(spi_context);
    *print = MemoryContextStrdup(TopMemoryContext, fingerprint());
    worker::end_work();
    MemoryContext after = MemoryContextSwitchTo(load_context);
    if (n == 0) {
        MemoryContextSwitchTo(after);
        MemoryContextDelete(load_context);
        return nullptr;
    }
    http::Client* client = build_client(rows, n, queue_limit);
    MemoryContextSwitchTo(after);
    MemoryContextDelete(load_context);
    ereport(LOG, (errmsg("eventbox relay: delivering %d topic(s) to HTTP destinations", n)));
    return client;
}

namespace {

int bucket_of(double seconds) {
    for (int b = 0; b < metrics::kBounds; ++b)
        if (seconds <= metrics::kBoundsSeconds[b]) return b;
    return metrics::kBounds;
}

// The breakers' states and transitions into shared memory.
void publish_breakers(http::Client& client) {
    if (shared == nullptr) return;
    for (std::size_t i = 0; i < client.destinations().size(); ++i) {
        const http::Destination& d = client.destinations()[i];
        if (d.metrics_slot < 0) continue;
        DestinationCounters& c = shared->slots[d.metrics_slot];
        http::Breaker& b = client.breaker(i);
        uint64_t moved[3];
        b.take_transitions(moved);
        bool any = false;
        for (int k = 0; k < 3; ++k) {
            if (moved[k] == 0) continue;
            pg_atomic_fetch_add_u64(&c.breaker_transitions[k], moved[k]);
            any = true;
        }
        if (any) pg_atomic_write_u64(&c.breaker_since, static_cast<uint64>(GetCurrentTimestamp()));
        uint32 state = d.breaker_failures > 0 ? 1 + static_cast<uint32>(b.state()) : 0;
        pg_atomic_write_u32(&c.breaker, state);
    }
}

}  // namespace

void take_outcomes(http::Client& client, relay::Dispatcher& dispatcher) {
    pg::call_cpp([&] {
        int64_t now = worker::now_ms();
        client.poll(now);
        for (const http::Outcome& o : client.outcomes()) {
            dispatcher.on_delivery(o.id, o.delivered ? 0 : 1, o.permanent, o.counts, -1, -1,
                                   o.error, now, o.retry_after_ms);
            int slot = client.destinations()[o.destination].metrics_slot;
            if (shared == nullptr || slot < 0 || !o.counts) continue;
            DestinationCounters& c = shared->slots[slot];
            pg_atomic_fetch_add_u64(&c.messages[o.delivered ? 0 : o.permanent ? 2 : 1], 1);
            if (o.delivered && o.created_ms > 0) {
                // The SLO's latency: the row's created_at to its 2xx (epoch clocks both).
                int64_t ms = std::max<int64_t>(now - o.created_ms, 0);
                pg_atomic_fetch_add_u64(&c.delivery[bucket_of(static_cast<double>(ms) / 1e3)], 1);
                pg_atomic_fetch_add_u64(&c.delivery_sum_ms, static_cast<uint64>(ms));
            }
            if (!o.request) continue;  // the request is counted with its first message
            pg_atomic_fetch_add_u64(&c.requests, 1);
            int cls = o.status >= 200 && o.status < 600 ? o.status / 100 - 2 : 4;
            if (o.status >= 100 && o.status < 200) cls = 4;
            pg_atomic_fetch_add_u64(&c.responses[cls], 1);
            bool answered_2xx = o.status >= 200 && o.status < 300;
            if (!answered_2xx && !o.permanent) pg_atomic_fetch_add_u64(&c.retries, 1);
            pg_atomic_fetch_add_u64(&c.latency[bucket_of(static_cast<double>(o.latency_us) / 1e6)],
                                    1);
            pg_atomic_fetch_add_u64(&c.latency_sum_us, static_cast<uint64>(o.latency_us));
        }
        client.outcomes().clear();
        publish_breakers(client);
    });
}

int read_breakers(BreakerRow* rows, int max) {
    if (shared == nullptr) return 0;
    SpinLockAcquire(&shared->mutex);
    int used = shared->used;
    SpinLockRelease(&shared->mutex);
    int n = 0;
    for (int i = 1; i < used && n < max; ++i) {
        DestinationCounters& c = shared->slots[i];
        uint32 state = pg_atomic_read_u32(&c.breaker);
        if (state == 0) continue;
        BreakerRow& r = rows[n++];
        strlcpy(r.topic, c.topic, sizeof(r.topic));
        r.state = static_cast<int>(state) - 1;
        r.since = static_cast<TimestampTz>(pg_atomic_read_u64(&c.breaker_since));
        for (int k = 0; k < 3; ++k)
            r.transitions[k] = static_cast<int64>(pg_atomic_read_u64(&c.breaker_transitions[k]));
    }
    return n;
}

void add_families(metrics::Exposition& e) {
    using metrics::Family;
    using metrics::Labels;
    using T = metrics::Type;
    Family& requests = e.family("eventbox_http_requests_total",
                                "HTTP requests the relay completed (any outcome), per destination "
                                "topic.",
                                T::kCounter);
    Family& responses = e.family("eventbox_http_responses_total",
                                 "HTTP requests by outcome: status class, or error (no response: "
                                 "connection failed, timed out, closed mid-response).",
                                 T::kCounter);
    Family& retries = e.family("eventbox_http_retries_total",
                               "HTTP requests that failed transiently (408, 429, 5xx, no "
                               "response) and were scheduled again.",
                               T::kCounter);
    Family& latency = e.family("eventbox_http_request_duration_seconds",
                               "Time from starting an HTTP request to its end.", T::kHistogram);
    Family& delivery = e.family("eventbox_http_delivery_seconds",
                                "Time from a message's created_at (its send() in the committing "
                                "transaction) to the 2xx that delivered it, per destination "
                                "topic.",
                                T::kHistogram);
    Family& breaker = e.family("eventbox_http_breaker_state",
                               "Circuit breaker of a destination with breaker_failures: 0 "
                               "closed, 1 open, 2 half-open.",
                               T::kGauge);
    Family& moves = e.family("eventbox_http_breaker_transitions_total",
                             "Circuit breaker transitions, by the state moved into.", T::kCounter);
    Family& messages = e.family("eventbox_http_messages_total",
                                "Messages the relay's HTTP requests settled, per destination "
                                "topic: delivered, retried (transient failure) or rejected "
                                "(permanent failure); a bulk request settles each of its "
                                "messages on its own.",
                                T::kCounter);
    if (shared == nullptr) return;
    SpinLockAcquire(&shared->mutex);
    int used = shared->used;
    SpinLockRelease(&shared->mutex);
    std::vector<double> bounds(metrics::kBoundsSeconds, metrics::kBoundsSeconds + metrics::kBounds);
    for (int i = 0; i < used; ++i) {
        DestinationCounters& c = shared->slots[i];
        uint64 n = pg_atomic_read_u64(&c.requests);
        if (i == 0 && n == 0) continue;  // the overflow entry, unused
        Labels label{{"destination", std::string(c.topic)}};
        e.add(requests, label, static_cast<double>(n));
        for (int k = 0; k < 5; ++k) {
            Labels l = label;
            l.emplace_back("class", kClasses[k]);
            e.add(responses, l, static_cast<double>(pg_atomic_read_u64(&c.responses[k])));
        }
        e.add(retries, label, static_cast<double>(pg_atomic_read_u64(&c.retries)));
        static constexpr const char* kResults[3] = {"delivered", "retried", "rejected"};
        for (int k = 0; k < 3; ++k) {
            Labels l = label;
            l.emplace_back("result", kResults[k]);
            e.add(messages, l, static_cast<double>(pg_atomic_read_u64(&c.messages[k])));
        }
        std::vector<uint64_t> counts;
        for (auto& l : c.latency) counts.push_back(pg_atomic_read_u64(&l));
        e.add_histogram(latency, label, bounds, counts,
                        static_cast<double>(pg_atomic_read_u64(&c.latency_sum_us)) / 1e6);
        counts.clear();
        for (auto& d : c.delivery) counts.push_back(pg_atomic_read_u64(&d));
        e.add_histogram(delivery, label, bounds, counts,
                        static_cast<double>(pg_atomic_read_u64(&c.delivery_sum_ms)) / 1e3);
        uint32 state = pg_atomic_read_u32(&c.breaker);
        if (state == 0) continue;
        e.add(breaker, label, static_cast<double>(state - 1));
        static constexpr const char* kStates[3] = {"closed", "open", "half_open"};
        for (int k = 0; k < 3; ++k) {
            Labels l = label;
            l.emplace_back("to", kStates[k]);
            e.add(moves, l, static_cast<double>(pg_atomic_read_u64(&c.breaker_transitions[k])));
        }
    }
}

void destinations_changed_at_commit() {
    if (!bump_registered) {
        RegisterXactCallback(on_xact_event, nullptr);
        RegisterSubXactCallback(on_subxact_event, nullptr);
        bump_registered = true;
    }
    bump_pending = true;
    ++own_changes_count;
}

uint64 own_changes() {
    return own_changes_count;
}

}  // namespace eventbox::http_relay
