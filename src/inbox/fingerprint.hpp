// Message ids from content (subscription option message_id_rule => 'fingerprint'): the SHA-256
// of a record's value in the JSON Canonicalization Scheme (RFC 8785), so that two producers
// publishing the same logical event get the same id. Pure C++.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace eventbox::inbox {

// `json` in RFC 8785 canonical form into `*out`: members sorted by their names' UTF-16 code
// units, no insignificant whitespace, strings with only the escapes the RFC keeps, numbers as
// ECMAScript prints the IEEE 754 double they denote. Returns false (with `*error`) for text
// that is not I-JSON: not JSON, not UTF-8, a lone surrogate escape, a repeated member name, a
// number beyond the double range, or nesting deeper than kMaxCanonicalDepth.
bool canonicalize_json(std::string_view json, std::string* out, std::string* error);
inline constexpr int kMaxCanonicalDepth = 1000;

// ECMAScript's Number::toString of a finite double (RFC 8785 section 3.2.2.3): the shortest
// digits that read back as `value`, in plain notation from 1e-6 up to 1e21, else exponential
// ("1e+21", "1.5e-7"); -0 is "0". Throws std::invalid_argument for NaN and infinities.
std::string ecmascript_number(double value);

// Lower-case hex SHA-256 of `data`.
std::string sha256_hex(std::string_view data);

// The fingerprint of a record value: sha256_hex of its canonical JSON, or of its bytes as they
// are when they are not JSON. `scratch` is a buffer the caller may keep between calls.
std::string fingerprint(std::string_view value, std::string* scratch);

}  // namespace eventbox::inbox
