// Standard base64 (RFC 4648 section 4: alphabet A-Z a-z 0-9 + /, padded with '='), the one
// implementation of the project: Avro bytes in JSON, HTTP bulk bodies, webhook signatures and
// secrets. Pure C++.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace eventbox {

// Appends the padded base64 of `bytes` to `*out`.
void append_base64(std::string_view bytes, std::string* out);

// The padded base64 of `bytes`.
std::string base64(std::string_view bytes);

// Decodes base64 `text` into `*out` (replacing it). Padding is optional, but when present it
// must complete the last group of four; characters outside the alphabet, a lone character in the
// last group, or '=' before the end are refused (false, `*out` unspecified).
bool decode_base64(std::string_view text, std::string* out);

// The same into `out`, which holds at least base64_decoded_bound(text.size()) bytes (no
// allocation: for buffers PostgreSQL allocates). Returns the bytes written, or -1 when refused.
long decode_base64(std::string_view text, char* out) noexcept;
inline constexpr std::size_t base64_decoded_bound(std::size_t text_len) noexcept {
    return text_len / 4 * 3 + 3;
}

}  // namespace eventbox
