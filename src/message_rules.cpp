// Validation rules for outgoing messages (see message_rules.hpp).
#include "message_rules.hpp"

#include <string>

#include "error.hpp"

namespace eventbox {

namespace {

bool is_topic_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == '-';
}

// Shows a value in an error message without letting control characters through.
std::string printable(std::string_view s, std::size_t max = 80) {
    std::string out;
    for (char c : s.substr(0, max)) {
        unsigned char u = static_cast<unsigned char>(c);
        if (u < 0x20 || u == 0x7f) {
            static constexpr char kHex[] = "0123456789abcdef";
            out += "\\x";
            out += kHex[u >> 4];
            out += kHex[u & 15];
        } else {
            out += c;
        }
    }
    if (s.size() > max) out += "...";
    return out;
}

bool has_line_break_or_nul(std::string_view s) {
    return s.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos;
}

}  // namespace

void validate_topic(std::string_view topic) {
    const char* hint =
        "Kafka topic names are 1 to 249 characters of letters, digits, '.', '_' and '-'.";
    if (topic.empty())
        throw Error(sqlstate::kInvalidParameterValue, "topic name must not be empty", {}, hint);
    if (topic.size() > kMaxTopicLength)
        throw Error(sqlstate::kInvalidParameterValue, "topic name is too long",
                    "The name has " + std::to_string(topic.size()) + " characters.", hint);
    if (topic == "." || topic == "..")
        throw Error(sqlstate::kInvalidParameterValue,
                    "topic name \"" + std::string(topic) + "\" is not allowed", {}, hint);
    for (char c : topic) {
        if (!is_topic_char(c))
            throw Error(sqlstate::kInvalidParameterValue,
                        "invalid topic name \"" + printable(topic) + "\"",
                        "Character \"" + printable(std::string_view(&c, 1)) + "\" is not allowed.",
                        hint);
    }
}

void validate_header(std::string_view name, std::string_view value) {
    const char* hint = "Headers must be a flat JSON object of string values without CR, LF or NUL.";
    if (name.empty())
        throw Error(sqlstate::kInvalidParameterValue, "header name must not be empty", {}, hint);
    if (name == kMessageIdHeader)
        throw Error(sqlstate::kInvalidParameterValue,
                    "header \"message_id\" is reserved",
                    "Every record carries the outbox row's message_id header.",
                    "Pass the id as send(..., message_id => '...') instead.");
    if (has_line_break_or_nul(name))
        throw Error(sqlstate::kInvalidParameterValue,
                    "header name \"" + printable(name) + "\" contains CR, LF or NUL", {}, hint);
    if (has_line_break_or_nul(value))
        throw Error(sqlstate::kInvalidParameterValue,
                    "value of header \"" + printable(name) + "\" contains CR, LF or NUL", {}, hint);
}

void validate_message_size(std::size_t bytes, std::size_t limit) {
    if (bytes > limit)
        throw Error(sqlstate::kProgramLimitExceeded, "message is too large for Kafka",
                    "The record has " + std::to_string(bytes) + " bytes; eventbox.max_message_bytes is " +
                        std::to_string(limit) + ".",
                    "Send a smaller payload, or raise eventbox.max_message_bytes together with the "
                    "broker's message.max.bytes.");
}

}  // namespace eventbox
