// JSON values of the registry formats' decoders, as text or as the JSON scanner's tokens
// (messages/json_scan.hpp): strings checked to be UTF-8, a token stream written directly by a
// decoder (no text written and scanned again), the top-level fields read from it as scan_json()
// reads them, and tokens written back as text. Pure C++.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "messages/json_scan.hpp"

namespace eventbox::registry {

// Appends [s, s+len) as a quoted JSON string; false (nothing sensible appended) when it is not
// valid UTF-8.
bool append_json_string(const char* s, std::size_t len, std::string* out);

// Appends the tokens of one JSON value to a JsonTokens, exactly as scan_json() stores those of
// the value's text: strings unescaped, numbers as written, each followed by a NUL, the deepest
// nesting in `depth`. The caller writes a well-formed sequence (keys only inside objects).
class TokenWriter {
  public:
    explicit TokenWriter(JsonTokens* tokens) : t_(tokens) {}

    void begin_object() { open(JsonTokens::kBeginObject); }
    void end_object() { close(JsonTokens::kEndObject); }
    void begin_array() { open(JsonTokens::kBeginArray); }
    void end_array() { close(JsonTokens::kEndArray); }
    // A key or a string; false when it is not valid UTF-8 (valid_utf8() refuses NUL too, which
    // the scanner and jsonb refuse), then nothing is added.
    bool key(const char* s, std::size_t len) { return text(JsonTokens::kKey, s, len, true); }
    bool string(const char* s, std::size_t len) { return text(JsonTokens::kString, s, len, true); }
    // A string the caller knows to be ASCII without NUL or control characters (dates, base64).
    void ascii(std::string_view s) { text(JsonTokens::kString, s.data(), s.size(), false); }
    // A number's text, valid JSON number syntax (what the decoders' printf formats write).
    void number(std::string_view s) { text(JsonTokens::kNumber, s.data(), s.size(), false); }
    void boolean(bool b) { mark(b ? JsonTokens::kTrue : JsonTokens::kFalse); }
    void null() { mark(JsonTokens::kNull); }

  private:
    void open(JsonTokens::Kind kind) {
        mark(kind);
        if (++level_ > t_->depth) t_->depth = level_;
    }
    void close(JsonTokens::Kind kind) {
        mark(kind);
        --level_;
    }
    void mark(JsonTokens::Kind kind) { t_->tokens.push_back(JsonTokens::Token{kind}); }
    bool text(JsonTokens::Kind kind, const char* s, std::size_t len, bool check);

    JsonTokens* t_;
    std::size_t level_ = 0;
};

// The top-level `fields` of the value in `tokens`, as scan_json() reads them from its text: a
// member's value when it is a string or an integer (a number without fraction or exponent, as
// written), "" when it is an object or an array, else nullopt; the last member of a name wins.
std::vector<std::optional<std::string>> top_fields(const JsonTokens& tokens,
                                                   const std::vector<std::string_view>& fields);

// Appends the JSON text of the value in `tokens` (what scan_json() would tokenize again into the
// same tokens): no spaces, strings escaped as append_json_string() escapes them.
void append_tokens_json(const JsonTokens& tokens, std::string* out);

}  // namespace eventbox::registry
