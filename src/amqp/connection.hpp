// Opening a RabbitMQ connection (librabbitmq) with eventbox.amqp_url and eventbox.amqp_options:
// TCP or TLS, login, bounded by connect_timeout at each step. Shared by the relay's publisher
// and the ingest worker's consumer. Pure C++; errors never contain a credential.
#pragma once

#include <amqp.h>

#include <string>
#include <vector>

#include "amqp/settings.hpp"

namespace eventbox::amqp {

// The bytes of an AMQP short or long string.
std::string text_of(amqp_bytes_t b);

// What an RPC reply says went wrong: the broker's reply code and text (connection.close or
// channel.close), or the library's reason. `code` (optional) is set to the channel's reply
// code, -1 when the broker closed the connection, else 0. Neither side echoes a credential.
std::string reply_text(const amqp_rpc_reply_t& reply, int* code = nullptr);

// Opens and logs in; returns the amqp_connection_state_t (as void*), or nullptr with `failed`
// set (redacted(): without the user or password of `settings`). `capabilities` are the client
// capabilities announced at login (e.g. "connection.blocked", "consumer_cancel_notify"), each true.
void* open_connection(const Settings& settings, const std::vector<std::string>& capabilities,
                      std::string* failed);

}  // namespace eventbox::amqp
