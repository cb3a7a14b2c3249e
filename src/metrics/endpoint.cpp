// The supervisor's metrics endpoint and counter sweep (see metrics/endpoint.hpp).
//
// PostgreSQL-side code: the server and the pending estimate live on the heap and are reached
// through pg::call_cpp(), except for their noexcept accessors.
#include "metrics/endpoint.hpp"

extern "C" {
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
}

#include <algorithm>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

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
TimestampTz next_listen_attempt = 0;
MemoryContext gauge_context = nullptr;
Gauges gauges;
TimestampTz gauges_at = 0;
worker::LogRate gauge_log = {1, 60000};

void close_http(int, Datum) {
    delete http;
    http = nullptr;
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

// The sockets the endpoint waits on besides the listening one, palloc'd; *n gets their count.
HttpServer::Watch* endpoint_watches(int* n) {
    HttpServer::Watch* watch = nullptr;
    call_cpp([&] {
        std::vector<HttpServer::Watch> w = http->watches();
        *n = static_cast<int>(w.size());
        watch = static_cast<HttpServer::Watch*>(
            pg::pg_guard([&] { return palloc(sizeof(HttpServer::Watch) * (w.size() + 1)); }));
        std::copy(w.begin(), w.end(), watch);
    });
    return watch;
}

}  // namespace

void start() {
    before_shmem_exit(close_http, 0);
    gauge_context =
        AllocSetContextCreate(TopMemoryContext, "eventbox metrics gauges", ALLOCSET_SMALL_SIZES);
}

void open_listener() {
    if (http != nullptr || guc::metrics_address == nullptr || guc::metrics_address[0] == '\0')
        return;
    TimestampTz now = GetCurrentTimestamp();
    if (now < next_listen_attempt) return;
    char error[256] = "";
    http = call_cpp([&]() -> HttpServer* {
        try {
            return new HttpServer(guc::metrics_address, HttpLimits{});
        } catch (const std::exception& e) {
            snprintf(error, sizeof error, "%s", e.what());
            return nullptr;
        }
    });
    if (http == nullptr) {
        ereport(WARNING,
                (errmsg("eventbox supervisor: %s", error), errdetail("Trying again in 60 s.")));
        next_listen_attempt = TimestampTzPlusMilliseconds(now, 60000);
    } else {
        ereport(LOG, (errmsg("eventbox supervisor serving metrics on http://%s/metrics",
                             guc::metrics_address)));
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
    char* text = render(counters, &gauges, &len);
    int64 at = worker::now_ms();
    call_cpp([&] { http->respond(std::string_view(text, len), at); });
}

void wait_for_events(long timeout_ms) {
    int n_watch = 0;
    HttpServer::Watch* watch = nullptr;
    bool listen = false;
    if (http != nullptr) {
        int64 deadline = http->next_deadline_ms();
        if (deadline != INT64_MAX)
            timeout_ms = Min(timeout_ms, Max(deadline - worker::now_ms(), 0L));
        listen = http->accepting();
        watch = endpoint_watches(&n_watch);
    }
    WaitEventSet* set = CreateWaitEventSet(CurrentMemoryContext, 3 + n_watch);
    AddWaitEventToSet(set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, nullptr);
    AddWaitEventToSet(set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, nullptr, nullptr);
    if (listen) AddWaitEventToSet(set, WL_SOCKET_READABLE, http->listen_fd(), nullptr, nullptr);
    for (int i = 0; i < n_watch; ++i)
        AddWaitEventToSet(set, watch[i].write ? WL_SOCKET_WRITEABLE : WL_SOCKET_READABLE,
                          watch[i].fd, nullptr, nullptr);
    WaitEvent event;
    (void)WaitEventSetWait(set, Max(timeout_ms, 0L), &event, 1, PG_WAIT_EXTENSION);
    FreeWaitEventSet(set);
    ResetLatch(MyLatch);
    if (http != nullptr) {
        int64 now = worker::now_ms();
        call_cpp([&] { http->step(now); });
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
