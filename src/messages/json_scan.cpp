// One-pass JSON check and top-level field reader (see messages/json_scan.hpp).
#include "messages/json_scan.hpp"

#include <cstdint>
#include <cstring>
#include <utility>

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
        ++p_;               // opening quote
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
                case '"':
                case '\\':
                case '/':
                    if (out) out->push_back(e);
                    break;
                case 'b':
                    if (out) out->push_back('\b');
                    break;
                case 'f':
                    if (out) out->push_back('\f');
                    break;
                case 'n':
                    if (out) out->push_back('\n');
                    break;
                case 'r':
                    if (out) out->push_back('\r');
                    break;
                case 't':
                    if (out) out->push_back('\t');
                    break;
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

// One scan: the states of a pushdown automaton over the text, one method per state. With
// tokens, strings are unescaped into the token text (and copied from there when they are wanted
// as fields).
class Scan {
  public:
    Scan(std::string_view text, const std::vector<std::string_view>& fields, JsonTokens* tokens)
        : s_(text), fields_(fields), tokens_(tokens) {
        result_.fields.resize(fields.size());
        if (tokens_ != nullptr) {
            tokens_->tokens.clear();
            tokens_->text.clear();
            tokens_->depth = 0;
        }
    }

    JsonScan run() {
        for (;;) {
            s_.skip_ws();
            bool ok = true;
            switch (state_) {
                case State::kArrayFirst:
                    if (close_empty(']', JsonTokens::kEndArray)) break;
                    [[fallthrough]];
                case State::kValue:
                    ok = value();
                    break;
                case State::kObjectFirst:
                    if (close_empty('}', JsonTokens::kEndObject)) break;
                    [[fallthrough]];
                case State::kKey:
                    ok = key();
                    break;
                case State::kColon:
                    ok = s_.consume(':') || error("expected ':'");
                    state_ = State::kValue;
                    break;
                case State::kAfterValue:
                    if (stack_.empty()) return end();
                    ok = after_value();
                    break;
            }
            if (!ok) return fail();
        }
    }

  private:
    enum class State { kValue, kArrayFirst, kObjectFirst, kKey, kColon, kAfterValue };

    bool error(const char* why) {
        result_.error = why;
        return false;
    }
    JsonScan fail() {
        if (tokens_ != nullptr) {
            tokens_->tokens.clear();
            tokens_->text.clear();
        }
        return std::move(result_);
    }
    JsonScan end() {
        if (!s_.at_end()) {
            error("unexpected text after the value");
            return fail();
        }
        result_.valid = true;
        return std::move(result_);
    }

    void add_token(JsonTokens::Kind kind, std::size_t offset) {
        tokens_->text.push_back('\0');
        tokens_->tokens.push_back(
            JsonTokens::Token{kind, offset, tokens_->text.size() - 1 - offset});
    }
    void add_mark(JsonTokens::Kind kind) {
        if (tokens_ != nullptr) tokens_->tokens.push_back(JsonTokens::Token{kind});
    }

    // An empty container's closing character right after its opening one.
    bool close_empty(char c, JsonTokens::Kind kind) {
        if (!s_.consume(c)) return false;
        stack_.pop_back();
        add_mark(kind);
        state_ = State::kAfterValue;
        return true;
    }

    // A value; a requested top-level field's scalar is kept in result_.fields.
    bool value() {
        bool top_field = stack_.size() == 1 && field_ >= 0;
        scalar_.clear();
        std::string* out = top_field ? &scalar_ : nullptr;
        char c = s_.peek();
        if (s_.at_end()) return error("unexpected end of input");
        if (c == '{' || c == '[') {
            open(c);
        } else if (c == '"') {
            if (!string_value(out)) return false;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            if (!number_value(&out)) return false;
        } else if (c == 't' || c == 'f' || c == 'n') {
            if (!s_.literal(c == 't' ? "true" : c == 'f' ? "false" : "null", result_.error))
                return false;
            add_mark(c == 't'   ? JsonTokens::kTrue
                     : c == 'f' ? JsonTokens::kFalse
                                : JsonTokens::kNull);
            out = nullptr;
        } else {
            return error("invalid token");
        }
        if (top_field) {
            if (out)
                result_.fields[field_] = scalar_;
            else
                result_.fields[field_].reset();
        }
        field_ = -1;
        if (c != '{' && c != '[') state_ = State::kAfterValue;
        return true;
    }

    void open(char c) {
        s_.consume(c);
        stack_.push_back(c);
        if (tokens_ != nullptr && stack_.size() > tokens_->depth) tokens_->depth = stack_.size();
        add_mark(c == '{' ? JsonTokens::kBeginObject : JsonTokens::kBeginArray);
        state_ = c == '{' ? State::kObjectFirst : State::kArrayFirst;
    }

    bool string_value(std::string* out) {
        std::size_t offset = tokens_ ? tokens_->text.size() : 0;
        if (!s_.string(tokens_ ? &tokens_->text : out, result_.error)) return false;
        if (tokens_ != nullptr) {
            if (out) out->assign(tokens_->text, offset, std::string::npos);
            add_token(JsonTokens::kString, offset);
        }
        return true;
    }

    // A number; *out is cleared when it is not an integer (only integers are kept as fields).
    bool number_value(std::string** out) {
        std::size_t offset = tokens_ ? tokens_->text.size() : 0;
        const char* start = s_.pos();
        if (!s_.number(*out, result_.error)) return false;
        if (*out && scalar_.empty()) *out = nullptr;  // not an integer
        if (tokens_ != nullptr) {
            tokens_->text.append(start, s_.pos());
            add_token(JsonTokens::kNumber, offset);
        }
        return true;
    }

    // An object key; a top-level one names the field whose value comes next, if requested.
    bool key() {
        if (s_.peek() != '"' || s_.at_end()) return error("expected an object key");
        bool top = stack_.size() == 1;
        key_.clear();
        std::size_t offset = tokens_ ? tokens_->text.size() : 0;
        if (!s_.string(tokens_ ? &tokens_->text : top ? &key_ : nullptr, result_.error))
            return false;
        std::string_view name = key_;
        if (tokens_ != nullptr) {
            add_token(JsonTokens::kKey, offset);
            name = std::string_view(tokens_->text.data() + offset, tokens_->tokens.back().len);
        }
        field_ = -1;
        if (top)
            for (std::size_t i = 0; i < fields_.size(); ++i)
                if (fields_[i] == name) field_ = static_cast<int>(i);
        state_ = State::kColon;
        return true;
    }

    // After a value inside a container: a comma, or the container's end.
    bool after_value() {
        if (s_.consume(',')) {
            state_ = stack_.back() == '{' ? State::kKey : State::kValue;
        } else if (s_.consume(stack_.back() == '{' ? '}' : ']')) {
            add_mark(stack_.back() == '{' ? JsonTokens::kEndObject : JsonTokens::kEndArray);
            stack_.pop_back();
        } else {
            return error("expected ',' or the end of the container");
        }
        return true;
    }

    Scanner s_;
    const std::vector<std::string_view>& fields_;
    JsonTokens* tokens_;
    JsonScan result_;
    std::vector<char> stack_;  // open containers: '{' or '['
    State state_ = State::kValue;
    int field_ = -1;  // requested field whose top-level value comes next
    std::string key_, scalar_;
};

}  // namespace

JsonScan scan_json(std::string_view text, const std::vector<std::string_view>& fields,
                   JsonTokens* tokens) {
    return Scan(text, fields, tokens).run();
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
