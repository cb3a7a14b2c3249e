// The supervisor's metrics endpoint and counter sweep (see metrics/endpoint.hpp).
//
// PostgreSQL-side code: the server and the pending estimate live on the heap and are reached
// through pg::call_cpp(), except for their noexcept accessors.
#include "metrics/endpoint.hpp"

extern "C" {
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
}

#include <cstddef>
#include <exception>
#include <string>
#include <string_view>

#include "metrics/collect.hpp"
#include "metrics/counters.hpp"
#include "metrics/http_server.hpp"
#include "metrics/pending_estimate.hpp"
#include "pg/boundary.hpp"
#include "pg/guc.hpp"
#include "workers/common.hpp"
#include "workers/supervisor.hpp"

using eventbox::pg::call_cpp;

namespace eventbox::metrics::endpoint {

namespace {

// The metric counters of dropped subscriptions are freed (metrics::sweep_subscriptions()): their
// series leave eventbox.metrics within two sweeps, and their entries serve new subscriptions.
constexpr long kCounterSweepMs = 10000;
TimestampTz next_counter_sweep = 0;
worker::LogRate sweep_log = {1, 60000};

void sweep_counters(void*) {
    if (SPI_execute("SELECT name FROM eventbox.subscriptions", true, 0) != SPI_OK_SELECT)
        elog(ERROR, "could not read the subscriptions");
    int n = static_cast<int>(SPI_processed);
    char** names = static_cast<char**>(palloc(sizeof(char*) * Max(n, 1)));
    for (int i = 0; i < n; ++i)
        names[i] = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
    sweep_subscriptions(names, n);
}

// The metrics endpoint (eventbox.metrics_address). Gauges are queried at most once a second;
// every scrape gets the counters as they are and the gauges of that query.
HttpServer* http = nullptr;
// The supervisor's latch, postmaster death and the endpoint's epoll set (HttpServer::event_fd()),
// made once: the connections come and go in the server's own set.
WaitEventSet* wait_set = nullptr;
TimestampTz next_listen_attempt = 0;
MemoryContext gauge_context = nullptr;
Gauges gauges;
TimestampTz gauges_at = 0;
worker::LogRate gauge_log = {1, 60000};

// The endpoint's descriptors are counted with PostgreSQL's own (storage/fd.h), so that neither
// runs the supervisor out of them: the listening socket, the epoll set and a few connections
// always; more connections, up to HttpLimits' default, while PostgreSQL has room for them and
// for a few more descriptors of its own (a wait set, a file).
constexpr int kFewConnections = 4;
constexpr int kHeadroom = 8;
int reserved_fds = 0;

std::size_t reserve_descriptors() {
    for (int i = 0; i < 2 + kFewConnections; ++i) ReserveExternalFD();
    int more = 0;
    int wanted = static_cast<int>(HttpLimits{}.max_connections) - kFewConnections;
    while (more < wanted + kHeadroom && AcquireExternalFD()) ++more;
    for (int i = 0; i < kHeadroom && more > 0; ++i, --more) ReleaseExternalFD();
    more = Min(more, wanted);
    reserved_fds = 2 + kFewConnections + more;
    return static_cast<std::size_t>(kFewConnections + more);
}

void release_descriptors() {
    for (; reserved_fds > 0; --reserved_fds) ReleaseExternalFD();
}

void close_http(int, Datum) {
    if (wait_set != nullptr) FreeWaitEventSet(wait_set);
    wait_set = nullptr;
    delete http;
    http = nullptr;
    release_descriptors();
}

// This supervisor's place in eventbox.database (see start()).
int port_offset = 0;
const char* label = nullptr;
char listen_address[300];

// eventbox.metrics_address with its port moved by port_offset (checked by its GUC hook).
const char* address_to_listen() {
    strlcpy(listen_address, guc::metrics_address, sizeof listen_address);
    char* colon = strrchr(listen_address, ':');
    if (port_offset > 0 && colon != nullptr) {
        int port = atoi(colon + 1) + port_offset;
        snprintf(colon + 1, sizeof listen_address - (colon + 1 - listen_address), "%d",
                 Min(port, 65535));
    }
    return listen_address;
}

// Pending counts between exact counts (metrics/pending_estimate.hpp).
PendingEstimate* pending_estimate = nullptr;

int64 outbox_balance(const Counters& c) {
    return static_cast<int64>(c.outbox_added - c.outbox_settled);
}

int64 inbox_balance(const Counters& c, const char* subscription) {
    for (int i = 0; i < c.n_subscriptions; ++i)
        if (!c.subscriptions[i].overflow &&
            strncmp(c.subscriptions[i].name, subscription, NAMEDATALEN) == 0)
            return inbox_pending_balance(c.subscriptions[i]);
    return 0;  // no batch counted yet
}

// An exact count; the balances `c` are read before it, so a batch committed meanwhile is
// counted by both (until the next count) rather than by neither.
void count_gauges(const Counters& c) {
    int64 started = worker::now_ms();
    MemoryContextReset(gauge_context);
    query_gauges(&gauges, gauge_context, GaugeCost::kCounted);
    int64 took = worker::now_ms() - started;
    call_cpp([&] {
        pending_estimate->start_count(started);
        pending_estimate->set_outbox(gauges.outbox_pending, outbox_balance(c));
        for (int i = 0; i < gauges.n_inbox; ++i)
            pending_estimate->set_inbox(gauges.inbox[i].subscription, gauges.inbox[i].pending,
                                        inbox_balance(c, gauges.inbox[i].subscription));
        pending_estimate->end_count(took);
    });
}

void refresh_pending(void*) {
    if (pending_estimate == nullptr)
        pending_estimate = call_cpp([] { return new PendingEstimate(); });
    Counters c;
    snapshot(&c);
    if (call_cpp([&] {
            int64 waiting = pending_estimate->total(
                outbox_balance(c),
                [&](const std::string& name) { return inbox_balance(c, name.c_str()); });
            return pending_estimate->count_due(worker::now_ms(), waiting);
        })) {
        count_gauges(c);
        return;
    }
    MemoryContextReset(gauge_context);
    query_gauges(&gauges, gauge_context, GaugeCost::kHeads);
    gauges.outbox_pending = pending_estimate->outbox(outbox_balance(c));
    bool missing = call_cpp([&] {
        for (int i = 0; i < gauges.n_inbox; ++i) {
            InboxGauge& g = gauges.inbox[i];
            if (!pending_estimate->inbox(g.subscription, inbox_balance(c, g.subscription),
                                         &g.pending))
                return true;
        }
        return false;
    });
    if (missing) count_gauges(c);  // a subscription created since the last count
}

void refresh_gauges(void* arg) {
    refresh_pending(arg);
    gauges.counts = pending_estimate->counts();
    gauges.count_seconds = static_cast<double>(pending_estimate->took_ms()) / 1000.0;
}

}  // namespace

void start(int group, const char* database_label) {
    port_offset = group;
    label = database_label;
    before_shmem_exit(close_http, 0);
    gauge_context =
        AllocSetContextCreate(TopMemoryContext, "eventbox metrics gauges", ALLOCSET_SMALL_SIZES);
}

void open_listener() {
    if (http != nullptr || guc::metrics_address == nullptr || guc::metrics_address[0] == '\0')
        return;
    TimestampTz now = GetCurrentTimestamp();
    if (now < next_listen_attempt) return;
    if (wait_set == nullptr) {
        wait_set = CreateWaitEventSet(TopMemoryContext, 3);
        AddWaitEventToSet(wait_set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, nullptr);
        AddWaitEventToSet(wait_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, nullptr, nullptr);
    }
    char error[256] = "";
    HttpLimits limits;
    limits.max_connections = reserve_descriptors();
    const char* address = address_to_listen();
    http = call_cpp([&]() -> HttpServer* {
        try {
            return new HttpServer(address, limits);
        } catch (const std::exception& e) {
            snprintf(error, sizeof error, "%s", e.what());
            return nullptr;
        }
    });
    if (http == nullptr) {
        release_descriptors();
        ereport(WARNING,
                (errmsg("eventbox supervisor: %s", error), errdetail("Trying again in 60 s.")));
        next_listen_attempt = TimestampTzPlusMilliseconds(now, 60000);
    } else {
        AddWaitEventToSet(wait_set, WL_SOCKET_READABLE, http->event_fd(), nullptr, nullptr);
        ereport(LOG, (errmsg("eventbox supervisor serving metrics on http://%s/metrics", address)));
    }
}

void serve_scrapes(bool schema_ok) {
    if (http == nullptr || http->pending() == 0) return;
    TimestampTz now = GetCurrentTimestamp();
    if (!schema_ok) {
        gauges.valid = false;
    } else if (!gauges.valid || TimestampDifferenceExceeds(gauges_at, now, 1000)) {
        gauges.valid = false;
        if (supervisor::run_in_transaction(refresh_gauges, nullptr, "metrics gauges", &gauge_log))
            gauges_at = now;
        else
            gauges.valid = false;
    }
    Counters counters;
    snapshot(&counters);
    size_t len;
    char* text = render(counters, &gauges, &len, label);
    int64 at = worker::now_ms();
    call_cpp([&] { http->respond(std::string_view(text, len), at); });
}

void wait_for_events(long timeout_ms) {
    if (http == nullptr || wait_set == nullptr) {
        (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
                        Max(timeout_ms, 0L), PG_WAIT_EXTENSION);
        ResetLatch(MyLatch);
        return;
    }
    // Traffic on the endpoint's sockets alone (a slow client's byte, a connection closed) is
    // served here and does not end the wait: the supervisor's turn comes when it is due, when
    // the latch is set, or as soon as a scrape waits for its body.
    int64 until = worker::now_ms() + Max(timeout_ms, 0L);
    for (;;) {
        int64 now = worker::now_ms();
        int64 wait = Max(Min(until, http->next_deadline_ms()) - now, 0L);
        WaitEvent events[3];
        int n = WaitEventSetWait(wait_set, wait, events, lengthof(events), PG_WAIT_EXTENSION);
        bool latch = false;
        for (int i = 0; i < n; ++i) latch = latch || (events[i].events & WL_LATCH_SET) != 0;
        if (latch) ResetLatch(MyLatch);
        now = worker::now_ms();
        call_cpp([&] { http->step(now); });
        if (latch || http->pending() > 0 || now >= until) return;
    }
}

long sweep_step() {
    TimestampTz now = GetCurrentTimestamp();
    if (now < next_counter_sweep) return TimestampDifferenceMilliseconds(now, next_counter_sweep);
    (void)supervisor::run_in_transaction(sweep_counters, nullptr, "metrics counter sweep",
                                         &sweep_log);
    next_counter_sweep = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), kCounterSweepMs);
    return kCounterSweepMs;
}

}  // namespace eventbox::metrics::endpoint
