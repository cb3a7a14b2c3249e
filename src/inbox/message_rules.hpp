// Call-time validation of what eventbox.send() accepts: Kafka topic names, header names and
// values, and the message size limit. Pure C++; every failure is an eventbox::Error.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace eventbox {

// Kafka's own limit on topic name length.
inline constexpr std::size_t kMaxTopicLength = 249;
// Header the relay sets on every record from the outbox row's uuid.
inline constexpr std::string_view kMessageIdHeader = "message_id";

// `s` made safe to show in an error message: control characters and bytes that are not part of
// a well-formed UTF-8 character become \xHH; cut after `max_chars` characters with "...".
std::string printable(std::string_view s, std::size_t max_chars = 80);

// Throws unless `topic` is a legal Kafka topic name: 1..249 of [a-zA-Z0-9._-], not "." or "..".
void validate_topic(std::string_view topic);

// Throws unless a header is usable on the wire: non-empty name, no CR, LF or NUL in name or value,
// and not the reserved message_id header.
void validate_header(std::string_view name, std::string_view value);

// Throws when the record (key + value + headers) exceeds `limit` bytes.
void validate_message_size(std::size_t bytes, std::size_t limit);

}  // namespace eventbox
