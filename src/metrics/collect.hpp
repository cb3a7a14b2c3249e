// eventbox.metrics() and the eventbox.metrics view: the shared counters (metrics/counters.hpp)
// plus gauges read from the tables, rendered in the Prometheus text format
// (metrics/exposition.hpp). Also used by the supervisor's HTTP endpoint.
#pragma once

extern "C" {
#include "postgres.h"

#include "utils/memutils.h"
}

#include "metrics/counters.hpp"

namespace eventbox::metrics {

struct InboxGauge {
    char subscription[NAMEDATALEN];
    int64 pending;
    double oldest_age_s;
    int64 blocked_keys;  // on_dead 'block_key': keys a dead message holds back
    int64 held;          // and the messages waiting behind them
};
struct LagGauge {
    char subscription[NAMEDATALEN];
    char* topic;
    int32 partition;
    int64 lag;
};
struct Gauges {
    bool valid;
    int64 outbox_pending;
    double outbox_oldest_age_s;
    int n_inbox;
    InboxGauge* inbox;
    int n_lag;
    LagGauge* lag;
};

// Runs the gauge queries (SPI connected, a snapshot active) into `out`, allocated in `context`.
// Each is bounded by the rows waiting (partial indexes of pending rows) or by the partitions.
void query_gauges(Gauges* out, MemoryContext context);

// The text exposition of `counters` and (when valid) `gauges`, palloc'd; *len gets its length.
char* render(const Counters& counters, const Gauges* gauges, size_t* len);

}  // namespace eventbox::metrics
