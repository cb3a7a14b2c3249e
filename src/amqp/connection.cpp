// Opening a RabbitMQ connection (see amqp/connection.hpp).
#include "amqp/connection.hpp"

#include <amqp.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>

namespace eventbox::amqp {

std::string text_of(amqp_bytes_t b) {
    return std::string(static_cast<const char*>(b.bytes), b.len);
}

std::string reply_text(const amqp_rpc_reply_t& reply, int* code) {
    if (code != nullptr) *code = 0;
    switch (reply.reply_type) {
        case AMQP_RESPONSE_NORMAL:
            return "no error";
        case AMQP_RESPONSE_NONE:
            return "no reply";
        case AMQP_RESPONSE_LIBRARY_EXCEPTION:
            return amqp_error_string2(reply.library_error);
        case AMQP_RESPONSE_SERVER_EXCEPTION:
            if (reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
                auto* m = static_cast<amqp_channel_close_t*>(reply.reply.decoded);
                if (code != nullptr) *code = m->reply_code;
                return std::to_string(m->reply_code) + " " + text_of(m->reply_text);
            }
            if (reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
                auto* m = static_cast<amqp_connection_close_t*>(reply.reply.decoded);
                if (code != nullptr) *code = -1;  // the connection is gone
                return std::to_string(m->reply_code) + " " + text_of(m->reply_text);
            }
            return "unexpected method from the broker";
    }
    return "unknown reply";
}

void* open_connection(const Settings& settings, const std::vector<std::string>& capabilities,
                      std::string* failed) {
    failed->clear();
    amqp_connection_state_t c = amqp_new_connection();
    if (c == nullptr) {
        *failed = "out of memory";
        return nullptr;
    }
    amqp_socket_t* socket = settings.tls ? amqp_ssl_socket_new(c) : amqp_tcp_socket_new(c);
    if (socket == nullptr) *failed = "could not create a socket";
    if (failed->empty() && settings.tls) {
        amqp_ssl_socket_set_verify_peer(socket, settings.tls_verify ? 1 : 0);
        amqp_ssl_socket_set_verify_hostname(socket, settings.tls_verify ? 1 : 0);
        if (!settings.tls_ca.empty() &&
            amqp_ssl_socket_set_cacert(socket, settings.tls_ca.c_str()) != AMQP_STATUS_OK)
            *failed = "could not read tls_ca_file";
        if (failed->empty() && !settings.tls_cert.empty() &&
            amqp_ssl_socket_set_key(socket, settings.tls_cert.c_str(), settings.tls_key.c_str()) !=
                AMQP_STATUS_OK)
            *failed = "could not read tls_cert_file or tls_key_file";
    }
    struct timeval timeout;
    timeout.tv_sec = settings.connect_timeout_ms / 1000;
    timeout.tv_usec = (settings.connect_timeout_ms % 1000) * 1000;
    if (failed->empty()) {
        amqp_set_handshake_timeout(c, &timeout);
        amqp_set_rpc_timeout(c, &timeout);
        int rc = amqp_socket_open_noblock(socket, settings.host.c_str(), settings.port, &timeout);
        if (rc != AMQP_STATUS_OK) *failed = std::string("connect: ") + amqp_error_string2(rc);
    }
    if (failed->empty()) {
        std::vector<amqp_table_entry_t> entries(capabilities.size());
        for (std::size_t i = 0; i < capabilities.size(); ++i) {
            entries[i].key = amqp_cstring_bytes(capabilities[i].c_str());
            entries[i].value.kind = AMQP_FIELD_KIND_BOOLEAN;
            entries[i].value.value.boolean = 1;
        }
        amqp_table_entry_t property;
        property.key = amqp_cstring_bytes("capabilities");
        property.value.kind = AMQP_FIELD_KIND_TABLE;
        property.value.value.table.num_entries = static_cast<int>(entries.size());
        property.value.value.table.entries = entries.data();
        amqp_table_t properties;
        properties.num_entries = 1;
        properties.entries = &property;
        amqp_rpc_reply_t reply = amqp_login_with_properties(
            c, settings.vhost.c_str(), 0, 131072, 0, &properties, AMQP_SASL_METHOD_PLAIN,
            settings.user.c_str(), settings.password.c_str());
        if (reply.reply_type != AMQP_RESPONSE_NORMAL) *failed = "login: " + reply_text(reply);
    }
    if (!failed->empty()) {
        *failed = redacted(*failed, settings);
        amqp_destroy_connection(c);
        return nullptr;
    }
    return c;
}

}  // namespace eventbox::amqp
