// Validation rules for outgoing messages (see messages/message_rules.hpp).
#include "messages/message_rules.hpp"

#include <string>

#include "core/error.hpp"

namespace eventbox {

// Length of the well-formed UTF-8 character starting at s[i], or 0.
static std::size_t utf8_char_len(std::string_view s, std::size_t i) {
    auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80             ? 1
                    : (c & 0xE0) == 0xC0 ? 2
                    : (c & 0xF0) == 0xE0 ? 3
                    : (c & 0xF8) == 0xF0 ? 4
                                         : 0;
    if (n == 0 || i + n > s.size()) return 0;
    for (std::size_t k = 1; k < n; ++k)
        if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
    return n;
}

// Shows a value in an error message: control characters and bytes that are not part of a
// well-formed UTF-8 character are escaped as \xHH, and a long value is cut between characters.
std::string printable(std::string_view s, std::size_t max_chars) {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out;
    std::size_t chars = 0, i = 0;
    for (; i < s.size() && chars < max_chars; ++chars) {
        auto u = static_cast<unsigned char>(s[i]);
        std::size_t n = utf8_char_len(s, i);
        if (n == 0 || u < 0x20 || u == 0x7f) {
            out += "\\x";
            out += kHex[u >> 4];
            out += kHex[u & 15];
            ++i;
        } else {
            out.append(s, i, n);
            i += n;
        }
    }
    if (i < s.size()) out += "...";
    return out;
}

// The character of `s` at byte i (whole, or one byte if malformed).
static std::string_view char_at(std::string_view s, std::size_t i) {
    std::size_t n = utf8_char_len(s, i);
    return s.substr(i, n == 0 ? 1 : n);
}

namespace {

bool is_topic_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
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
                    "The name is " + std::to_string(topic.size()) + " bytes long.", hint);
    if (topic == "." || topic == "..")
        throw Error(sqlstate::kInvalidParameterValue,
                    "topic name \"" + std::string(topic) + "\" is not allowed", {}, hint);
    for (std::size_t i = 0; i < topic.size(); ++i) {
        if (!is_topic_char(topic[i]))
            throw Error(sqlstate::kInvalidParameterValue,
                        "invalid topic name \"" + printable(topic) + "\"",
                        "Character \"" + printable(char_at(topic, i)) + "\" is not allowed.", hint);
    }
}

void validate_header(std::string_view name, std::string_view value) {
    const char* hint = "Headers must be a flat JSON object of string values without CR, LF or NUL.";
    if (name.empty())
        throw Error(sqlstate::kInvalidParameterValue, "header name must not be empty", {}, hint);
    if (name == kMessageIdHeader)
        throw Error(sqlstate::kInvalidParameterValue, "header \"message_id\" is reserved",
                    "Every record carries the outbox row's message_id header.",
                    "Pass the id as send(..., message_id => '...') instead.");
    if (has_line_break_or_nul(name))
        throw Error(sqlstate::kInvalidParameterValue,
                    "header name \"" + printable(name) + "\" contains CR, LF or NUL", {}, hint);
    if (has_line_break_or_nul(value))
        throw Error(sqlstate::kInvalidParameterValue,
                    "value of header \"" + printable(name) + "\" contains CR, LF or NUL", {}, hint);
}

std::size_t varint_bytes(int64_t value) {
    uint64_t zigzag = (static_cast<uint64_t>(value) << 1) ^ static_cast<uint64_t>(value >> 63);
    std::size_t n = 1;
    while (zigzag >= 0x80) {
        zigzag >>= 7;
        ++n;
    }
    return n;
}

std::size_t header_wire_bytes(std::size_t name_len, std::size_t value_len) {
    return varint_bytes(static_cast<int64_t>(name_len)) + name_len +
           varint_bytes(static_cast<int64_t>(value_len)) + value_len;
}

void validate_header_count(std::size_t n) {
    if (n > kMaxHeaders)
        throw Error(sqlstate::kProgramLimitExceeded, "too many headers",
                    "The record has " + std::to_string(n) + " headers; at most " +
                        std::to_string(kMaxHeaders) + " are allowed besides message_id.",
                    "Put structured data in the payload; consumers parse every header of a "
                    "record before any of it.");
}

void validate_message_size(std::size_t bytes, std::size_t limit) {
    if (bytes > limit)
        throw Error(sqlstate::kProgramLimitExceeded, "message is too large for Kafka",
                    "The record has " + std::to_string(bytes) +
                        " bytes; eventbox.max_message_bytes is " + std::to_string(limit) + ".",
                    "Send a smaller payload, or raise eventbox.max_message_bytes together with the "
                    "broker's message.max.bytes.");
}

}  // namespace eventbox
