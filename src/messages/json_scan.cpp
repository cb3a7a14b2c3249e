// One-pass JSON check and top-level field reader (see messages/json_scan.hpp).
#include "messages/json_scan.hpp"

#include <cstdint>
#include <cstring>

namespace eventbox {

namespace {

class Scanner {
public:
    explicit Scanner(std::string_view text) : p_(text.data()), end_(text.data() + text.size()) {}

    bool at_end() const { return p_ == end_; }
    char peek() const { return p_ < end_ ? *p_ : '\0'; }
    void skip_ws() {
        while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
    }
    bool consume(char c) {
        if (peek() != c || at_end()) return false;
        ++p_;
        return true;
    }

    // Moves the cursor over whole 8-byte words holding no quote, backslash or control
    // character (the byte loop after it finds the exact end of the run).
    void skip_plain_words() {
        constexpr uint64_t kOnes = 0x0101010101010101ull, kHigh = 0x8080808080808080ull;
        while (end_ - p_ >= 8) {
            uint64_t w;
            memcpy(&w, p_, 8);
            uint64_t quote = w ^ (kOnes * '"'), backslash = w ^ (kOnes * '\\');
            // A zero byte in quote/backslash, or a byte below 0x20 in w (may also flag a
            // harmless byte after a real one: the byte loop then decides).
            uint64_t special = ((quote - kOnes) & ~quote) | ((backslash - kOnes) & ~backslash) |
                               ((w - kOnes * 0x20) & ~w);
            if ((special & kHigh) != 0) return;
            p_ += 8;
        }
    }

    // A string at the cursor; unescaped into `out` when given.
    bool string(std::string* out, std::string& error) {
        ++p_;  // opening quote
        uint32_t high = 0;  // pending high surrogate
        while (p_ < end_) {
            auto c = static_cast<unsigned char>(*p_++);
            if (c == '"') {
                if (high) return fail(error, "lone high surrogate in a \\u escape");
                return true;
            }
            if (c < 0x20) return fail(error, "control character in a string");
            if (c != '\\') {
                if (high) return fail(error, "lone high surrogate in a \\u escape");
                // The run of plain characters up to the next quote, escape or control character.
                const char* run = p_ - 1;
                skip_plain_words();
                while (p_ < end_ && *p_ != '"' && *p_ != '\\' &&
                       static_cast<unsigned char>(*p_) >= 0x20)
                    ++p_;
                if (out) out->append(run, p_);
                continue;
            }
            if (p_ >= end_) break;
            char e = *p_++;
            if (e != 'u' && high) return fail(error, "lone high surrogate in a \\u escape");
            switch (e) {
                case '"': case '\\': case '/':
                    if (out) out->push_back(e);
                    break;
                case 'b': if (out) out->push_back('\b'); break;
                case 'f': if (out) out->push_back('\f'); break;
                case 'n': if (out) out->push_back('\n'); break;
                case 'r': if (out) out->push_back('\r'); break;
                case 't': if (out) out->push_back('\t'); break;
                case 'u': {
                    uint32_t cp = 0;
                    for (int i = 0; i < 4; ++i) {
                        if (p_ >= end_) return fail(error, "truncated \\u escape");
                        char h = *p_++;
                        int v = h >= '0' && h <= '9'   ? h - '0'
                                : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                                       : -1;
                        if (v < 0) return fail(error, "invalid \\u escape");
                        cp = cp * 16 + static_cast<uint32_t>(v);
                    }
                    if (cp == 0) return fail(error, "\\u0000 cannot be stored in jsonb");
                    if (cp >= 0xD800 && cp <= 0xDBFF) {
                        if (high) return fail(error, "lone high surrogate in a \\u escape");
                        high = cp;
                        break;
                    }
                    if (cp >= 0xDC00 && cp <= 0xDFFF) {
                        if (!high) return fail(error, "lone low surrogate in a \\u escape");
                        cp = 0x10000 + ((high - 0xD800) << 10) + (cp - 0xDC00);
                        high = 0;
                    }
                    if (out) append_utf8(*out, cp);
                    break;
                }
                default:
                    return fail(error, "invalid escape in a string");
            }
        }
        return fail(error, "unterminated string");
    }

    const char* pos() const { return p_; }

    // A number at the cursor; its text into `out` when it is an integer.
    bool number(std::string* out, std::string& error) {
        const char* start = p_;
        bool integer = true;
        consume('-');
        if (consume('0')) {
        } else if (digits() == 0) {
            return fail(error, "invalid number");
        }
        if (consume('.')) {
            integer = false;
            if (digits() == 0) return fail(error, "invalid number");
        }
        if (peek() == 'e' || peek() == 'E') {
            ++p_;
            integer = false;
            if (!consume('+')) consume('-');
            if (digits() == 0) return fail(error, "invalid number");
        }
        if (out && integer) out->assign(start, p_);
        return true;
    }

    bool literal(std::string_view word, std::string& error) {
        if (static_cast<std::size_t>(end_ - p_) < word.size() ||
            std::string_view(p_, word.size()) != word)
            return fail(error, "invalid token");
        p_ += word.size();
        return true;
    }

private:
    static bool fail(std::string& error, const char* why) {
        error = why;
        return false;
    }
    std::size_t digits() {
        std::size_t n = 0;
        while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_, ++n;
        return n;
    }

    const char* p_;
    const char* end_;
};

}  // namespace

JsonScan scan_json(std::string_view text, const std::vector<std::string_view>& fields,
                   JsonTokens* tokens) {
    JsonScan result;
    result.fields.resize(fields.size());
    if (tokens != nullptr) {
        tokens->tokens.clear();
        tokens->text.clear();
        tokens->depth = 0;
    }
    Scanner s(text);
    std::vector<char> stack;  // open containers: '{' or '['
    enum class State { kValue, kArrayFirst, kObjectFirst, kKey, kColon, kAfterValue };
    State state = State::kValue;
    int field = -1;  // requested field whose top-level value comes next
    std::string key, scalar;

    // With tokens, strings are unescaped into the token text (and copied from there when they
    // are wanted as fields).
    auto add_token = [&](JsonTokens::Kind kind, std::size_t offset) {
        tokens->text.push_back('\0');
        tokens->tokens.push_back(
            JsonTokens::Token{kind, offset, tokens->text.size() - 1 - offset});
    };
    auto add_mark = [&](JsonTokens::Kind kind) {
        if (tokens != nullptr) tokens->tokens.push_back(JsonTokens::Token{kind});
    };
    auto fail = [&]() {
        if (tokens != nullptr) {
            tokens->tokens.clear();
            tokens->text.clear();
        }
        return result;
    };

    for (;;) {
        s.skip_ws();
        switch (state) {
            case State::kArrayFirst:
                if (s.consume(']')) {
                    stack.pop_back();
                    add_mark(JsonTokens::kEndArray);
                    state = State::kAfterValue;
                    break;
                }
                [[fallthrough]];
            case State::kValue: {
                bool top_field = stack.size() == 1 && field >= 0;
                scalar.clear();
                std::string* out = top_field ? &scalar : nullptr;
                bool is_scalar = true;
                char c = s.peek();
                std::size_t offset = tokens ? tokens->text.size() : 0;
                if (s.at_end()) {
                    result.error = "unexpected end of input";
                    return fail();
                } else if (c == '{' || c == '[') {
                    s.consume(c);
                    stack.push_back(c);
                    if (tokens != nullptr && stack.size() > tokens->depth)
                        tokens->depth = stack.size();
                    add_mark(c == '{' ? JsonTokens::kBeginObject : JsonTokens::kBeginArray);
                    state = c == '{' ? State::kObjectFirst : State::kArrayFirst;
                    is_scalar = false;
                } else if (c == '"') {
                    if (!s.string(tokens ? &tokens->text : out, result.error)) return fail();
                    if (tokens != nullptr) {
                        if (out) out->assign(tokens->text, offset, std::string::npos);
                        add_token(JsonTokens::kString, offset);
                    }
                } else if (c == '-' || (c >= '0' && c <= '9')) {
                    const char* start = s.pos();
                    if (!s.number(out, result.error)) return fail();
                    if (out && scalar.empty()) out = nullptr;  // not an integer
                    if (tokens != nullptr) {
                        tokens->text.append(start, s.pos());
                        add_token(JsonTokens::kNumber, offset);
                    }
                } else if (c == 't' || c == 'f' || c == 'n') {
                    if (!s.literal(c == 't' ? "true" : c == 'f' ? "false" : "null", result.error))
                        return fail();
                    add_mark(c == 't'   ? JsonTokens::kTrue
                             : c == 'f' ? JsonTokens::kFalse
                                        : JsonTokens::kNull);
                    out = nullptr;
                } else {
                    result.error = "invalid token";
                    return fail();
                }
                if (top_field) {
                    if (out) result.fields[field] = scalar;
                    else result.fields[field].reset();
                }
                field = -1;
                if (is_scalar) state = State::kAfterValue;
                break;
            }
            case State::kObjectFirst:
                if (s.consume('}')) {
                    stack.pop_back();
                    add_mark(JsonTokens::kEndObject);
                    state = State::kAfterValue;
                    break;
                }
                [[fallthrough]];
            case State::kKey: {
                if (s.peek() != '"' || s.at_end()) {
                    result.error = "expected an object key";
                    return fail();
                }
                bool top = stack.size() == 1;
                key.clear();
                std::size_t offset = tokens ? tokens->text.size() : 0;
                if (!s.string(tokens ? &tokens->text : top ? &key : nullptr, result.error))
                    return fail();
                std::string_view name = key;
                if (tokens != nullptr) {
                    add_token(JsonTokens::kKey, offset);
                    name = std::string_view(tokens->text.data() + offset,
                                            tokens->tokens.back().len);
                }
                field = -1;
                if (top)
                    for (std::size_t i = 0; i < fields.size(); ++i)
                        if (fields[i] == name) field = static_cast<int>(i);
                state = State::kColon;
                break;
            }
            case State::kColon:
                if (!s.consume(':')) {
                    result.error = "expected ':'";
                    return fail();
                }
                state = State::kValue;
                break;
            case State::kAfterValue:
                if (stack.empty()) {
                    if (!s.at_end()) {
                        result.error = "unexpected text after the value";
                        return fail();
                    }
                    result.valid = true;
                    return result;
                }
                if (s.consume(',')) {
                    state = stack.back() == '{' ? State::kKey : State::kValue;
                } else if (s.consume(stack.back() == '{' ? '}' : ']')) {
                    add_mark(stack.back() == '{' ? JsonTokens::kEndObject : JsonTokens::kEndArray);
                    stack.pop_back();
                } else {
                    result.error = "expected ',' or the end of the container";
                    return fail();
                }
                break;
        }
    }
}

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

}  // namespace eventbox
