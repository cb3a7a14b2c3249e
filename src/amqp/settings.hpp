// The RabbitMQ connection's settings: eventbox.amqp_url (amqp[s]://host[:port][/vhost], no
// credentials) and eventbox.amqp_options (key=value list: user, password, TLS files, timeouts).
// Values of the options may be credentials: no error produced here contains one. Pure C++.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace eventbox::amqp {

struct Settings {
    std::string host;
    int port = 5672;
    std::string vhost = "/";
    bool tls = false;
    // From eventbox.amqp_options.
    std::string user = "guest";
    std::string password = "guest";
    std::string tls_ca;    // tls_ca_file: CA bundle to verify the server with
    std::string tls_cert;  // tls_cert_file + tls_key_file: client certificate
    std::string tls_key;
    bool tls_verify = true;              // tls_verify=off skips the peer and host name checks
    int64_t connect_timeout_ms = 2000;   // TCP connect, TLS and AMQP handshake, each RPC
    int64_t confirm_timeout_ms = 30000;  // an unconfirmed publish older than this: reconnect
};

// Parses the URL into `s` (host, port, vhost, tls). Throws eventbox::Error (22023) with a hint;
// the message names the URL's problem, never its text.
void parse_url(std::string_view url, Settings& s);
// Applies eventbox.amqp_options to `s`. Throws eventbox::Error (22023) naming the key, never
// a value.
void parse_options(std::string_view options, Settings& s);
// Non-throwing check for the GUC check hook of eventbox.amqp_url: on failure writes the reason
// to `why`.
bool url_valid(const char* url, char* why, std::size_t why_size) noexcept;
// `text` (a broker's or the library's reason, e.g. "access to vhost '/' refused for user 'bob'")
// with every occurrence of the user and the password replaced by "***": such texts are logged
// and shown in eventbox.subscription_errors.
std::string redacted(std::string text, const Settings& s);

}  // namespace eventbox::amqp
