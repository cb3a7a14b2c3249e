// What the HTTP side of the relay reads and writes as text: what a response status means,
// Retry-After, message header names as HTTP tokens, UTF-8 and JSON checks, and the excerpt of a
// response kept in last_error. Pure C++.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace eventbox::http {

// Bytes of a response body kept for last_error.
inline constexpr std::size_t kBodyExcerpt = 200;
// Retry-After values are honoured up to this delay.
inline constexpr int64_t kMaxRetryAfterMs = 3600 * 1000;

// What a response means: 2xx delivered; 408, 429 and 5xx transient; the rest permanent.
enum class Verdict { kDelivered, kTransient, kPermanent };
Verdict classify(int status);
// Retry-After (delay-seconds or an HTTP-date) in ms from `now_epoch_s`; -1 when unreadable.
int64_t parse_retry_after(std::string_view value, int64_t now_epoch_s);
// A message header name as an HTTP token: bytes outside tchar (and '%') as %XX.
std::string header_token(std::string_view name);
// Whether `text` is valid UTF-8.
bool is_utf8(std::string_view text);
// Whether `payload` is UTF-8 JSON (Content-Type application/json) or not (octet-stream).
bool is_json(const char* payload, std::size_t len);
// `status` and the start of `body`, printable, for last_error.
std::string describe_response(int status, std::string_view body);

}  // namespace eventbox::http
