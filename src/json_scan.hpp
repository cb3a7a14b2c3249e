// A one-pass JSON check that follows PostgreSQL's json grammar and string rules (RFC 8259; no
// raw control characters, no \u0000, surrogates only in pairs), and reads the top-level string or
// integer values of a few named fields on the way. Iterative, so nesting depth cannot exhaust
// the stack. Numbers are checked for syntax only: whether numeric can hold one is for jsonb_in
// to say. Pure C++.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace eventbox::inbox {

struct JsonScan {
    bool valid = false;
    std::string error;  // why not, when !valid
    // One entry per requested field: its value when it is a top-level string (unescaped) or
    // integer (as written); the last occurrence wins, as in jsonb.
    std::vector<std::optional<std::string>> fields;
};

// `text` must be valid UTF-8 (the caller checks); `fields` are top-level keys to read.
JsonScan scan_json(std::string_view text, const std::vector<std::string_view>& fields);

}  // namespace eventbox::inbox
