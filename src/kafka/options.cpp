// eventbox.kafka_options parser (see kafka/options.hpp).
#include "kafka/options.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace eventbox {

namespace {

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

// Splits on unescaped commas, resolving "\," and "\\".
std::vector<std::string> split_items(std::string_view text) {
    std::vector<std::string> items(1);
    for (std::size_t i = 0; i < text.size(); ++i) {
        char c = text[i];
        if (c == '\\' && i + 1 < text.size() && (text[i + 1] == ',' || text[i + 1] == '\\')) {
            items.back() += text[++i];
        } else if (c == ',') {
            items.emplace_back();
        } else {
            items.back() += c;
        }
    }
    return items;
}

}  // namespace

std::vector<KafkaOption> parse_kafka_options(std::string_view text) {
    std::vector<KafkaOption> out;
    if (trim(text).empty()) return out;
    const char* hint =
        "Write options as key=value pairs separated by commas, e.g. "
        "'security.protocol=SASL_SSL,sasl.mechanism=PLAIN'.";
    int position = 0;
    for (const std::string& item : split_items(text)) {
        ++position;
        std::string_view s = trim(item);
        if (s.empty()) continue;
        auto eq = s.find('=');
        if (eq == std::string_view::npos)
            throw Error(
                sqlstate::kInvalidParameterValue,
                "kafka option " + std::to_string(position) + " is not of the form key=value", {},
                hint);
        std::string_view key = trim(s.substr(0, eq));
        std::string_view value = trim(s.substr(eq + 1));
        if (key.empty())
            throw Error(sqlstate::kInvalidParameterValue,
                        "kafka option " + std::to_string(position) + " has an empty key", {}, hint);
        if (key == "bootstrap.servers" || key == "metadata.broker.list")
            throw Error(sqlstate::kInvalidParameterValue,
                        "kafka option \"" + std::string(key) + "\" is set by eventbox.brokers", {},
                        "Set the broker list in eventbox.brokers.");
        out.emplace_back(std::string(key), std::string(value));
    }
    return out;
}

namespace {

bool is_sensitive_key(const std::string& key) {
    static const char* const kMarkers[] = {"password",    "secret",       "token",    "jaas",
                                           "oauthbearer", "ssl.key",      "keystore", "credential",
                                           "private",     "sasl.username"};
    for (const char* marker : kMarkers)
        if (key.find(marker) != std::string::npos) return true;
    return false;
}

}  // namespace

SecretScrubber::SecretScrubber(const std::vector<KafkaOption>& options) {
    for (const KafkaOption& option : options) {
        if (!is_sensitive_key(option.first) || option.second.empty()) continue;
        secrets_.push_back(option.second);
        std::string token;
        for (char c : option.second + " ") {
            if (c == ' ' || c == ',' || c == ';' || c == '=' || c == '\t') {
                if (token.size() >= 4) secrets_.push_back(token);
                token.clear();
            } else {
                token += c;
            }
        }
    }
    std::sort(secrets_.begin(), secrets_.end(),
              [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
}

std::string SecretScrubber::scrub(std::string text) const {
    for (const std::string& secret : secrets_) {
        for (std::size_t at = text.find(secret); at != std::string::npos;
             at = text.find(secret, at + 3))
            text.replace(at, secret.size(), "***");
    }
    return text;
}

bool kafka_options_valid(const char* text, char* why, std::size_t why_size) noexcept {
    try {
        parse_kafka_options(text ? text : "");
        return true;
    } catch (...) {
        ErrorReport report;
        capture_current_exception(report);
        copy_truncated(why, why_size, report.message);
        return false;
    }
}

}  // namespace eventbox
