// What the relay worker needs for AMQP (RabbitMQ) destinations on the PostgreSQL side: loading
// eventbox.amqp_destination_config and the connection settings into an amqp::Publisher, and
// feeding its outcomes to the dispatcher. AMQP destinations share the HTTP destinations'
// generation and fingerprint (outbox/http_relay.hpp, outbox/relay_routes.hpp): a change of
// either kind is announced the same way and makes the relay load both again.
#pragma once

extern "C" {
#include "postgres.h"
}

#include <cstddef>

#include "amqp/publisher.hpp"
#include "outbox/relay_dispatch.hpp"

namespace eventbox::amqp_relay {

// Reads the destinations in a transaction of its own (call outside one). Returns a publisher for
// them, or nullptr when there are none, or when eventbox.amqp_url is empty or the settings are
// invalid (said in the log; their rows wait in the outbox).
amqp::Publisher* load_publisher(std::size_t queue_limit);
// The destinations as text, as the current snapshot shows them (in a transaction, SPI
// connected), appended to http_relay::fingerprint()'s; palloc'd.
char* fingerprint();
// Reads the broker's confirms and hands finished publishes to the dispatcher.
void take_outcomes(amqp::Publisher& publisher, relay::Dispatcher& dispatcher);

}  // namespace eventbox::amqp_relay
