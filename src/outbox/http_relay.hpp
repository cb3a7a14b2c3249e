// What the relay worker needs for HTTP destinations on the PostgreSQL side: the destinations'
// generation in shared memory (moved before a change's commit becomes visible and again after,
// so that the relay never routes a row committed after a change by the old configuration: see
// outbox/relay_routes.hpp), loading the destinations into an http::Client, feeding its outcomes
// to the dispatcher, and the per-destination counters behind the eventbox_http_* metric
// families.
#pragma once

extern "C" {
#include "postgres.h"

#include "utils/timestamp.h"
}

#include <cstddef>

#include "metrics/exposition.hpp"
#include "outbox/http_client.hpp"
#include "outbox/relay_dispatch.hpp"
#include "outbox/relay_routes.hpp"

namespace eventbox::http_relay {

// Registers the shared memory hooks; called from _PG_init.
void install_hooks();
// The destinations' generation and the changes between its two moves (generation read first).
relay::RouteStamp stamp();
// The generation alone.
uint64 generation();
// Reads the destinations in a transaction of its own (call outside one). Returns a client for
// them, or nullptr when there are none; *loaded gets the stamp read before the transaction's
// snapshot, *fingerprint (palloc'd in TopMemoryContext) what fingerprint() read in it.
http::Client* load_client(std::size_t queue_limit, relay::RouteStamp* loaded, char** fingerprint);
// The destinations as one text, as the current snapshot shows them (in a transaction, SPI
// connected); palloc'd in the current memory context. Equal texts, equal destinations.
char* fingerprint();
// Serves the client's sockets and timers and hands finished requests to the dispatcher.
void take_outcomes(http::Client& client, relay::Dispatcher& dispatcher);
// A destination's circuit breaker as shared memory shows it (eventbox.http_breakers).
struct BreakerRow {
    char topic[256];
    int state;             // http::Breaker::State
    TimestampTz since;     // its last transition (0: none since the relay loaded it)
    int64 transitions[3];  // into closed, open, half-open
};
// Fills up to `max` rows (destinations with a breaker the relay has loaded); returns how many.
int read_breakers(BreakerRow* rows, int max);
// Adds the eventbox_http_* families (reads shared memory only).
void add_families(metrics::Exposition& e);
// The relay reloads its destinations once the current transaction commits.
void destinations_changed_at_commit();
// A count of this backend's own changes of destinations and topic formats that the generation
// does not show yet: it moves at each change, at a rollback to a savepoint that may undo one,
// and at the end of a transaction that made one. A cache of what the current transaction reads
// keys on it beside the generation (send()'s format check does).
uint64 own_changes();

}  // namespace eventbox::http_relay
