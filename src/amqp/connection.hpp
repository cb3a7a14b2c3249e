// Opening a RabbitMQ connection (librabbitmq) with eventbox.amqp_url and eventbox.amqp_options:
// TCP or TLS, login, bounded by connect_timeout at each step. Shared by the relay's publisher
// and the ingest worker's consumer. Pure C++; errors never contain a credential.
#pragma once

#include <string>
#include <vector>

#include "amqp/settings.hpp"

namespace eventbox::amqp {

// Opens and logs in; returns the amqp_connection_state_t (as void*), or nullptr with `failed`
// set. `capabilities` are the client capabilities announced at login (e.g.
// "connection.blocked", "consumer_cancel_notify"), each true.
void* open_connection(const Settings& settings, const std::vector<std::string>& capabilities,
                      std::string* failed);

}  // namespace eventbox::amqp
