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
    int64 pending;  // -1: not counted (GaugeCost::kHeads)
    double oldest_age_s;
    int64 blocked_keys;     // on_dead 'block_key': keys a dead message holds back
    int64 held;             // and the messages waiting behind them
    int64 failing_workers;  // ingest workers failing it (eventbox.subscription_errors)
};
struct LagGauge {
    char subscription[NAMEDATALEN];
    char* topic;
    int32 partition;
    int64 lag;
};
struct Gauges {
    bool valid;
    int64 outbox_pending;  // -1: not counted (GaugeCost::kHeads)
    double outbox_oldest_age_s;
    int n_inbox;
    InboxGauge* inbox;
    int n_lag;
    LagGauge* lag;
    // The endpoint's exact counts (metrics/pending_estimate.hpp): how many ran, how long the
    // last took; counts == 0 (SQL functions, which count every time) leaves them out.
    int64 counts;
    double count_seconds;
};

// kCounted: pending counts and oldest ages over every row waiting (bounded by the rows waiting,
// through the partial indexes of pending rows). kHeads: no counts (pending -1); the oldest ages
// from the first waiting row of the outbox (by id) and of each inbox partition (by offset),
// a few index probes whatever is waiting; the rest as with kCounted.
enum class GaugeCost { kCounted, kHeads };

// Runs the gauge queries (SPI connected, a snapshot active) into `out`, allocated in `context`;
// the lag gauges are bounded by the partitions.
void query_gauges(Gauges* out, MemoryContext context, GaugeCost cost);

// The text exposition of `counters` and (when valid) `gauges`, palloc'd; *len gets its length.
// `database`, when not null, labels every series database="..." (eventbox.database lists
// several databases).
char* render(const Counters& counters, const Gauges* gauges, size_t* len,
             const char* database = nullptr);
// The database label of the calling session's series: its database's name when
// eventbox.database lists several, else null (palloc'd).
const char* session_database_label();

}  // namespace eventbox::metrics
