// The RabbitMQ connection's settings (see amqp/settings.hpp).
#include "amqp/settings.hpp"

#include <cctype>
#include <cstdio>

#include "core/error.hpp"
#include "kafka/options.hpp"

namespace eventbox::amqp {

namespace {

[[noreturn]] void bad_url(const std::string& what) {
    throw Error(sqlstate::kInvalidParameterValue, "invalid eventbox.amqp_url: " + what,
                std::string(),
                "Write amqp://host:port/vhost (amqps:// for TLS), e.g. "
                "'amqp://127.0.0.1:5672/%2f'; credentials go in eventbox.amqp_options.");
}

int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

std::string percent_decode(std::string_view in) {
    std::string out;
    for (std::size_t i = 0; i < in.size(); ++i) {
        if (in[i] != '%') {
            out += in[i];
            continue;
        }
        if (i + 2 >= in.size()) bad_url("a % escape is cut");
        int hi = hex(in[i + 1]);
        int lo = hex(in[i + 2]);
        if (hi < 0 || lo < 0) bad_url("a % escape is not two hex digits");
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
    }
    return out;
}

int64_t milliseconds(const std::string& key, const std::string& value, int64_t lo, int64_t hi) {
    int64_t n = 0;
    bool ok = !value.empty() && value.size() <= 9;
    for (char c : value) {
        if (!std::isdigit(static_cast<unsigned char>(c))) ok = false;
        if (ok) n = n * 10 + (c - '0');
    }
    if (!ok || n < lo || n > hi)
        throw Error(sqlstate::kInvalidParameterValue,
                    "invalid eventbox.amqp_options: " + key +
                        " is not a number of milliseconds "
                        "from " +
                        std::to_string(lo) + " to " + std::to_string(hi),
                    std::string(), "E.g. " + key + "=2000.");
    return n;
}

bool boolean(const std::string& key, const std::string& value) {
    if (value == "on" || value == "true" || value == "1") return true;
    if (value == "off" || value == "false" || value == "0") return false;
    throw Error(sqlstate::kInvalidParameterValue,
                "invalid eventbox.amqp_options: " + key + " must be on or off", std::string(),
                "E.g. " + key + "=on.");
}

}  // namespace

void parse_url(std::string_view url, Settings& s) {
    std::string_view rest;
    if (url.substr(0, 7) == "amqp://") {
        s.tls = false;
        s.port = 5672;
        rest = url.substr(7);
    } else if (url.substr(0, 8) == "amqps://") {
        s.tls = true;
        s.port = 5671;
        rest = url.substr(8);
    } else {
        bad_url("it must start with amqp:// or amqps://");
    }
    for (char c : rest)
        if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f)
            bad_url("it contains a space or control character");
    std::size_t slash = rest.find('/');
    std::string_view authority = rest.substr(0, slash);
    if (authority.find('@') != std::string_view::npos)
        bad_url("it contains user information (user:password@)");
    if (rest.find_first_of("?#") != std::string_view::npos)
        bad_url("query strings and fragments are not supported");
    std::string_view host = authority;
    std::size_t colon = authority.rfind(':');
    bool bracketed = !authority.empty() && authority[0] == '[';
    std::size_t close = authority.find(']');
    if (bracketed && close == std::string_view::npos) bad_url("an IPv6 address lacks its ']'");
    if (colon != std::string_view::npos && (!bracketed || colon > close)) {
        std::string_view port = authority.substr(colon + 1);
        long n = 0;
        if (port.empty() || port.size() > 5) bad_url("the port must be from 1 to 65535");
        for (char c : port) {
            if (!std::isdigit(static_cast<unsigned char>(c)))
                bad_url("the port must be from 1 to 65535");
            n = n * 10 + (c - '0');
        }
        if (n < 1 || n > 65535) bad_url("the port must be from 1 to 65535");
        s.port = static_cast<int>(n);
        host = authority.substr(0, colon);
    }
    if (bracketed) host = host.substr(1, host.size() >= 2 ? host.size() - 2 : 0);
    if (host.empty()) bad_url("it names no host");
    s.host = std::string(host);
    s.vhost = "/";
    if (slash != std::string_view::npos) {
        std::string vhost = percent_decode(rest.substr(slash + 1));
        // amqp://host/ names the vhost "" in the URI spec; RabbitMQ has none such: take "/".
        if (!vhost.empty()) s.vhost = vhost;
    }
}

void parse_options(std::string_view options, Settings& s) {
    for (const KafkaOption& o : parse_kafka_options(options)) {
        const std::string& key = o.first;
        const std::string& value = o.second;
        if (key == "user")
            s.user = value;
        else if (key == "password")
            s.password = value;
        else if (key == "tls_ca_file")
            s.tls_ca = value;
        else if (key == "tls_cert_file")
            s.tls_cert = value;
        else if (key == "tls_key_file")
            s.tls_key = value;
        else if (key == "tls_verify")
            s.tls_verify = boolean(key, value);
        else if (key == "connect_timeout")
            s.connect_timeout_ms = milliseconds(key, value, 100, 60000);
        else if (key == "confirm_timeout")
            s.confirm_timeout_ms = milliseconds(key, value, 100, 3600000);
        else
            throw Error(sqlstate::kInvalidParameterValue,
                        "invalid eventbox.amqp_options: unknown option \"" + key + "\"",
                        std::string(),
                        "Known options: user, password, tls_ca_file, tls_cert_file, "
                        "tls_key_file, tls_verify, connect_timeout, confirm_timeout.");
    }
    if (s.tls_cert.empty() != s.tls_key.empty())
        throw Error(sqlstate::kInvalidParameterValue,
                    "invalid eventbox.amqp_options: tls_cert_file and tls_key_file go together",
                    std::string(), "Set both for a client certificate, or neither.");
}

bool url_valid(const char* url, char* why, std::size_t why_size) noexcept {
    try {
        Settings s;
        parse_url(url, s);
        return true;
    } catch (const std::exception& e) {
        std::snprintf(why, why_size, "%s", e.what());
    } catch (...) {
        std::snprintf(why, why_size, "invalid eventbox.amqp_url");
    }
    return false;
}

std::string redacted(std::string text, const Settings& s) {
    for (const std::string* secret : {&s.password, &s.user}) {
        if (secret->empty()) continue;
        // Bounded: each replacement moves past what it wrote.
        for (std::size_t at = text.find(*secret); at != std::string::npos;
             at = text.find(*secret, at + 3))
            text.replace(at, secret->size(), "***");
    }
    return text;
}

}  // namespace eventbox::amqp
