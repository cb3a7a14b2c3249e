// HTTP destinations, PostgreSQL side (see outbox/http_relay.hpp).
extern "C" {
#include "postgres.h"

#include "access/xact.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
}

#include <string>
#include <vector>

#include "metrics/counters.hpp"
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
bool bump_pending = false;   // this transaction changed destinations
bool between_moves = false;  // ... and its first move is done, the second one not yet

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
            if (bump_pending) shmem::wake_relay();
            bump_pending = false;
            break;
        case XACT_EVENT_ABORT:
        case XACT_EVENT_PARALLEL_ABORT:
        case XACT_EVENT_PREPARE:
            second_move();  // an abort after PRE_COMMIT ends the bracket too
            bump_pending = false;
            break;
        default:
            break;
    }
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

// Runs the statement reading the destinations (none before the extension's 0.2.0).
void query_destinations() {
    if (!destinations_exist()) {
        SPI_processed = 0;
        return;
    }
    int rc = SPI_execute(
        "SELECT topic, url, method, headers, "
        "(extract(epoch FROM timeout) * 1000)::int8, max_in_flight "
        "FROM eventbox.http_destination_config ORDER BY topic",
        true, 0);
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
            destinations.push_back(std::move(d));
        }
        return new http::Client(std::move(destinations), queue_limit);
    });
}

}  // namespace

char* fingerprint() {
    if (!destinations_exist()) return pstrdup("");
    // Every column, as text: any change of a destination changes it; and the topic formats
    // (outbox/relay_formats.hpp), which route rows through the registry encoding (from 0.4.0).
    int rc = SPI_execute(
        "SELECT string_agg(c::text, E'\\n' ORDER BY c.topic) "
        "FROM eventbox.http_destination_config c",
        true, 1);
    if (rc != SPI_OK_SELECT || SPI_processed != 1)
        elog(ERROR, "eventbox relay: reading HTTP destinations failed: %s",
             SPI_result_code_string(rc));
    bool isnull;
    Datum value = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
    char* destinations = isnull ? pstrdup("") : TextDatumGetCString(value);
    rc = SPI_execute("SELECT to_regclass('eventbox.topic_formats') IS NOT NULL", true, 1);
    if (rc != SPI_OK_SELECT) elog(ERROR, "eventbox relay: SPI_execute failed");
    if (!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)))
        return destinations;
    rc = SPI_execute(
        "SELECT string_agg(f::text, E'\\n' ORDER BY f.topic) FROM eventbox.topic_formats f", true,
        1);
    if (rc != SPI_OK_SELECT || SPI_processed != 1)
        elog(ERROR, "eventbox relay: reading topic formats failed: %s", SPI_result_code_string(rc));
    value = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
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
            pg_atomic_fetch_add_u64(&c.requests, 1);
            int cls = o.status >= 200 && o.status < 600 ? o.status / 100 - 2 : 4;
            if (o.status >= 100 && o.status < 200) cls = 4;
            pg_atomic_fetch_add_u64(&c.responses[cls], 1);
            if (!o.delivered && !o.permanent) pg_atomic_fetch_add_u64(&c.retries, 1);
            int bucket = metrics::kBounds;
            for (int b = 0; b < metrics::kBounds; ++b)
                if (o.latency_us <= metrics::kBoundsSeconds[b] * 1e6) {
                    bucket = b;
                    break;
                }
            pg_atomic_fetch_add_u64(&c.latency[bucket], 1);
            pg_atomic_fetch_add_u64(&c.latency_sum_us, static_cast<uint64>(o.latency_us));
        }
        client.outcomes().clear();
    });
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
        std::vector<uint64_t> counts;
        for (auto& l : c.latency) counts.push_back(pg_atomic_read_u64(&l));
        e.add_histogram(latency, label, bounds, counts,
                        static_cast<double>(pg_atomic_read_u64(&c.latency_sum_us)) / 1e6);
    }
}

void destinations_changed_at_commit() {
    if (!bump_registered) {
        RegisterXactCallback(on_xact_event, nullptr);
        bump_registered = true;
    }
    bump_pending = true;
}

}  // namespace eventbox::http_relay
