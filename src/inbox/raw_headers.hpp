// The exact representation of a Kafka record's headers (inbox.raw_headers): every header in the
// producer's order, repeated names, null values and bytes that are not UTF-8 kept as they came,
// which the jsonb of inbox.headers cannot hold. A dead letter carries them to the relay, which
// publishes them again as they were (docs/guide/dead-letters.md). Pure C++, no allocation: the
// PostgreSQL side sizes and allocates the buffers.
//
// Format: for each header, its name's length as 4 bytes big-endian, the name, then its value's
// length likewise (0xFFFFFFFF for a null value) and the value.
#pragma once

#include <cstddef>
#include <string_view>

#include "inbox/record.hpp"

namespace eventbox::inbox {

// Bytes the representation of headers[0..n) takes.
std::size_t raw_headers_size(const KafkaHeader* headers, std::size_t n) noexcept;

// Writes the representation of headers[0..n) to `out` (raw_headers_size() bytes).
void write_raw_headers(const KafkaHeader* headers, std::size_t n, char* out) noexcept;

// One header read back: `value` is nullptr for a null value (else points into the bytes read).
struct RawHeader {
    std::string_view name;
    const char* value = nullptr;
    std::size_t value_len = 0;
};

// Reads the next header of `*rest` into `*header` and advances `*rest` past it. False when
// `*rest` is empty or does not start with a whole header (then nothing is read).
bool next_raw_header(std::string_view* rest, RawHeader* header) noexcept;

// The number of headers in `bytes`, or -1 when they are not a well-formed representation.
long count_raw_headers(std::string_view bytes) noexcept;

// The header the relay expands into the headers of `bytes` (base64 of them): the dead letters'
// way to carry the original headers through an outbox row's jsonb headers.
inline constexpr std::string_view kRawHeadersHeader = "__eventbox.raw_headers";

}  // namespace eventbox::inbox
