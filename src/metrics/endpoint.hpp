// The supervisor's metrics duties: the HTTP endpoint at eventbox.metrics_address (GET /metrics,
// served from the supervisor's own wait loop, no thread) and the periodic sweep that frees the
// counters of dropped subscriptions. PostgreSQL side; the supervisor calls these in its loop.
#pragma once

extern "C" {
#include "postgres.h"
}

namespace eventbox::metrics::endpoint {

// Once, when the supervisor starts: the gauges' memory and the endpoint's close at exit. The
// supervisor of the database at position `group` of eventbox.database listens on the port of
// eventbox.metrics_address plus `group`; `database_label`, when not null, labels every series
// database="...".
void start(int group, const char* database_label);
// Listens on eventbox.metrics_address (its port moved by the group) when it is set and nothing
// listens yet (a failure is a WARNING, tried again after 60 s).
void open_listener();
// Answers the scrapes waiting for a body; the gauges need the current schema (`schema_ok`),
// else they are left out.
void serve_scrapes(bool schema_ok);
// Waits for the latch, postmaster death, the endpoint's sockets or `timeout_ms`, then serves
// the endpoint's sockets.
void wait_for_events(long timeout_ms);
// One sweep of the counters of dropped subscriptions when one is due; returns milliseconds
// until the next.
long sweep_step();

}  // namespace eventbox::metrics::endpoint
