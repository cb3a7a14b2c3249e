// Call-time validation of what eventbox.send() accepts: Kafka topic names, header names and
// values, and the message size limit. Pure C++; every failure is an eventbox::Error.
#pragma once

#include <cstddef>
#include <cstdint>
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

// Most headers a record from send() may carry besides message_id. Kafka sets no limit, but
// consumers must parse every header of a record before they see any: librdkafka-based clients
// (ours among them) failed on a record with 100,001, losing message_id. 1000 is far beyond any
// header set in practice and parsed by every mainstream client.
inline constexpr std::size_t kMaxHeaders = 1000;
// Bytes of a zigzag varint, as Kafka's record format (v2) encodes lengths and deltas.
std::size_t varint_bytes(int64_t value);
// What one header costs in a Kafka record: its name and value plus their length varints.
std::size_t header_wire_bytes(std::size_t name_len, std::size_t value_len);
// What a record costs beyond its key, value and headers: attributes, timestamp and offset
// deltas, the key, value and record lengths and the header count, each at its largest.
inline constexpr std::size_t kRecordOverheadBytes = 1 + 10 + 5 + 5 + 5 + 5 + 5;
// Throws when a record carries more than kMaxHeaders headers (besides message_id).
void validate_header_count(std::size_t n);
// Throws when the record (key + value + headers, with their framing) exceeds `limit` bytes.
void validate_message_size(std::size_t bytes, std::size_t limit);

}  // namespace eventbox
