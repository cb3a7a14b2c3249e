// A one-pass JSON check that follows PostgreSQL's json grammar and string rules (RFC 8259; no
// raw control characters, no \u0000, surrogates only in pairs), and reads the top-level string or
// integer values of a few named fields on the way, optionally keeping the value's tokens (the
// ingest worker builds the payload jsonb from them). Iterative, so nesting depth cannot exhaust
// the stack. Numbers are checked for syntax only: whether numeric can hold one is for
// numeric_in to say. What it accepts must be exactly what PostgreSQL's json parser accepts.
// Pure C++.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace eventbox {

struct JsonScan {
    bool valid = false;
    std::string error;  // why not, when !valid
    // One entry per requested field: its value when it is a top-level string (unescaped) or
    // integer (as written); the last occurrence wins, as in jsonb.
    std::vector<std::optional<std::string>> fields;
};

// A valid JSON value as the token stream PostgreSQL's JSON parser hands to jsonb_in, so that
// the ingest worker can build the jsonb without parsing the text again.
struct JsonTokens {
    enum Kind : unsigned char {
        kBeginObject,
        kEndObject,
        kBeginArray,
        kEndArray,
        kKey,
        kString,
        kNumber,
        kTrue,
        kFalse,
        kNull
    };
    struct Token {
        Kind kind;
        std::size_t offset = 0, len = 0;  // kKey, kString, kNumber: their bytes in `text`
    };
    std::vector<Token> tokens;
    // Keys and strings unescaped, numbers as written; each followed by a NUL.
    std::string text;
    std::size_t depth = 0;  // deepest nesting of containers

    const char* at(const Token& t) const { return text.data() + t.offset; }
};

// `text` must be valid UTF-8 (the caller checks); `fields` are top-level keys to read. With
// `tokens`, the value's tokens are stored there when it is valid.
JsonScan scan_json(std::string_view text, const std::vector<std::string_view>& fields,
                   JsonTokens* tokens = nullptr);

// Appends code point `cp` to `out` in UTF-8 (the JSON scanners' \u escapes).
void append_utf8(std::string& out, uint32_t cp);

// The name outbox/http_client.cpp calls it by, from when this file was in inbox/.
namespace inbox {
using eventbox::scan_json;
}

}  // namespace eventbox
