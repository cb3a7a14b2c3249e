// JSON payloads as Avro binary for the relay (see registry/avro_tree.hpp): the JSON is scanned
// into tokens (messages/json_scan.hpp, a tenth of a DOM parser's time) and walked as a tree
// along the schema's.
#include "registry/avro_tree.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/base64.hpp"
#include "messages/json_scan.hpp"

namespace eventbox::registry::avro {

namespace {

// A scanned JSON value as a tree over its tokens, in preorder: a node's children follow it and
// `end` is the index past its subtree.
struct JsonTree {
    struct Item {
        JsonTokens::Kind kind;
        std::string_view text;  // strings and numbers
        std::string_view key;   // as an object's member
        std::size_t end = 0;
        std::size_t children = 0;
    };
    JsonTokens tokens;
    std::vector<Item> items;

    // False when `json` is not JSON.
    bool build(std::string_view json) {
        items.clear();
        open.clear();
        tokens.tokens.clear();
        tokens.text.clear();
        tokens.depth = 0;
        if (!scan_json(json, {}, &tokens).valid) return false;
        std::string_view key;
        for (const JsonTokens::Token& t : tokens.tokens) {
            switch (t.kind) {
                case JsonTokens::kKey:
                    key = std::string_view(tokens.at(t), t.len);
                    continue;
                case JsonTokens::kEndObject:
                case JsonTokens::kEndArray:
                    items[open.back()].end = items.size();
                    open.pop_back();
                    continue;
                default:
                    break;
            }
            if (!open.empty()) ++items[open.back()].children;
            Item item;
            item.kind = t.kind;
            item.key = key;
            key = {};
            if (t.kind == JsonTokens::kString || t.kind == JsonTokens::kNumber)
                item.text = std::string_view(tokens.at(t), t.len);
            item.end = items.size() + 1;
            items.push_back(item);
            if (t.kind == JsonTokens::kBeginObject || t.kind == JsonTokens::kBeginArray)
                open.push_back(items.size() - 1);
        }
        return !items.empty();
    }

    // Gives back the buffers a large payload grew.
    void release_large() {
        constexpr std::size_t kKept = 64 * 1024;
        if (tokens.text.capacity() > kKept) std::string().swap(tokens.text);
        if (tokens.tokens.capacity() * sizeof(JsonTokens::Token) > kKept)
            std::vector<JsonTokens::Token>().swap(tokens.tokens);
        if (items.capacity() * sizeof(Item) > kKept) std::vector<Item>().swap(items);
    }

  private:
    std::vector<std::size_t> open;  // the containers being built
};

void put_long(int64_t v, std::string* out) {
    uint64_t z = (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
    while (z >= 0x80) {
        out->push_back(static_cast<char>((z & 0x7f) | 0x80));
        z >>= 7;
    }
    out->push_back(static_cast<char>(z));
}

void put_bytes(const std::string& b, std::string* out) {
    put_long(static_cast<int64_t>(b.size()), out);
    out->append(b);
}

int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
    y -= m <= 2 ? 1 : 0;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    auto yoe = static_cast<unsigned>(y - era * 400);
    unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

// "YYYY-MM-DD" at `p`; advances it.
bool parse_date(const char*& p, int64_t* days) {
    int y, m, d, n = 0;
    if (sscanf(p, "%5d-%2d-%2d%n", &y, &m, &d, &n) != 3 || n < 10 || m < 1 || m > 12 || d < 1 ||
        d > 31)
        return false;
    p += n;
    *days = days_from_civil(y, static_cast<unsigned>(m), static_cast<unsigned>(d));
    return true;
}

// "HH:MM:SS[.fraction]" at `p` as units of 1/per second; advances it.
bool parse_time(const char*& p, int64_t per, int64_t* units) {
    int h, mi, sec, n = 0;
    if (sscanf(p, "%2d:%2d:%2d%n", &h, &mi, &sec, &n) != 3 || n != 8 || h > 23 || mi > 59 ||
        sec > 60)
        return false;
    p += n;
    int64_t fraction = 0, scale = per;
    if (*p == '.') {
        ++p;
        while (*p >= '0' && *p <= '9') {
            if (scale > 1) {
                scale /= 10;
                fraction += (*p - '0') * scale;
            }
            ++p;
        }
    }
    *units = ((h * 60 + mi) * 60 + sec) * per + fraction;
    return true;
}

bool parse_timestamp(const std::string& text, int64_t per, int64_t* units) {
    const char* p = text.c_str();
    int64_t days, time;
    if (!parse_date(p, &days) || (*p != 'T' && *p != ' ')) return false;
    ++p;
    if (!parse_time(p, per, &time)) return false;
    int64_t offset_s = 0;
    if (*p == 'Z') {
        ++p;
    } else if (*p == '+' || *p == '-') {
        int oh, om, n = 0;
        if (sscanf(p + 1, "%2d:%2d%n", &oh, &om, &n) != 2) return false;
        offset_s = (oh * 60 + om) * 60 * (*p == '-' ? -1 : 1);
        p += 1 + n;
    }
    if (*p != '\0') return false;
    *units = days * 86400 * per + time - offset_s * per;
    return true;
}

// A decimal string (or integer) scaled by 10^scale as minimal two's-complement bytes (`size`
// bytes, sign-extended, when non-zero).
bool decimal_bytes(std::string_view text, int scale, std::size_t size, std::string* out) {
    if (text.empty()) return false;
    bool negative = text[0] == '-';
    std::size_t i = negative || text[0] == '+' ? 1 : 0;
    std::string digits;
    int fraction = -1;
    for (; i < text.size(); ++i) {
        char c = text[i];
        if (c == '.' && fraction < 0) {
            fraction = 0;
        } else if (c >= '0' && c <= '9') {
            digits.push_back(c);
            if (fraction >= 0) ++fraction;
        } else {
            return false;
        }
    }
    if (digits.empty() || fraction > scale) return false;
    for (int k = std::max(fraction, 0); k < scale; ++k) digits.push_back('0');
    std::vector<unsigned char> mag;  // big-endian magnitude
    for (char c : digits) {          // mag = mag * 10 + digit
        unsigned carry = static_cast<unsigned>(c - '0');
        for (std::size_t k = mag.size(); k-- > 0;) {
            unsigned cur = mag[k] * 10u + carry;
            mag[k] = static_cast<unsigned char>(cur & 0xff);
            carry = cur >> 8;
        }
        while (carry > 0) {
            mag.insert(mag.begin(), static_cast<unsigned char>(carry & 0xff));
            carry >>= 8;
        }
    }
    while (!mag.empty() && mag[0] == 0) mag.erase(mag.begin());
    bool zero = mag.empty();
    if (zero) negative = false;
    if (mag.empty() || (mag[0] & 0x80) != 0) mag.insert(mag.begin(), 0);  // room for the sign
    if (negative) {                                                       // two's complement
        for (auto& c : mag) c = static_cast<unsigned char>(~c);
        for (std::size_t k = mag.size(); k-- > 0;)
            if (++mag[k] != 0) break;
        while (mag.size() > 1 && mag[0] == 0xff && (mag[1] & 0x80) != 0) mag.erase(mag.begin());
    }
    if (size > 0) {
        if (mag.size() > size) return false;
        mag.insert(mag.begin(), size - mag.size(), negative ? 0xff : 0);
    }
    out->assign(mag.begin(), mag.end());
    return true;
}

// Integer text (no fraction or exponent) as int64.
bool integer_of(std::string_view text, int64_t* x) {
    if (text.find_first_of(".eE") != std::string_view::npos) return false;
    int64_t v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return false;
    *x = v;
    return true;
}

class Encoder {
  public:
    explicit Encoder(std::string* error) : error_(error) {}

    bool encode(const JsonTree& t, std::size_t i, const Node* n, std::string* out) {
        const JsonTree::Item& v = t.items[i];
        switch (n->kind) {
            case Node::kNull:
                return v.kind == JsonTokens::kNull || fail("null");
            case Node::kBoolean:
                if (v.kind != JsonTokens::kTrue && v.kind != JsonTokens::kFalse)
                    return fail("a boolean");
                out->push_back(v.kind == JsonTokens::kTrue ? 1 : 0);
                return true;
            case Node::kInt:
            case Node::kLong:
                return encode_integer(v, n, out);
            case Node::kFloat:
            case Node::kDouble:
                return encode_float(v, n->kind == Node::kFloat, out);
            case Node::kString:
                if (v.kind != JsonTokens::kString) return fail("a string");
                put_long(static_cast<int64_t>(v.text.size()), out);
                out->append(v.text);
                return true;
            case Node::kBytes:
            case Node::kFixed:
                return encode_bytes(t, i, n, out);
            case Node::kEnum: {
                if (v.kind != JsonTokens::kString) return fail("an enum symbol");
                auto it = std::find(n->names.begin(), n->names.end(), v.text);
                if (it == n->names.end()) return fail("one of the enum's symbols");
                put_long(it - n->names.begin(), out);
                return true;
            }
            case Node::kArray:
            case Node::kMap: {
                bool map = n->kind == Node::kMap;
                if (v.kind != (map ? JsonTokens::kBeginObject : JsonTokens::kBeginArray))
                    return fail(map ? "an object (map)" : "an array");
                if (v.children > 0) put_long(static_cast<int64_t>(v.children), out);
                std::size_t k = 0;
                for (std::size_t c = i + 1; c < v.end; c = t.items[c].end, ++k) {
                    if (map) {
                        put_long(static_cast<int64_t>(t.items[c].key.size()), out);
                        out->append(t.items[c].key);
                    }
                    char index[24];
                    std::size_t index_len =
                        map ? 0
                            : static_cast<std::size_t>(snprintf(index, sizeof index, "%zu]", k));
                    Scope scope(this, map ? "." : "[",
                                map ? t.items[c].key : std::string_view(index, index_len));
                    if (!encode(t, c, n->children[0], out)) return false;
                }
                out->push_back(0);
                return true;
            }
            case Node::kRecord:
                return encode_record(t, i, n, out);
            case Node::kUnion:
                return encode_union(t, i, n, out);
        }
        return fail("a supported value");
    }

    std::string path = "$";

  private:
    struct Scope {
        // Appends `prefix` and `part` to the path (no temporary string per field).
        Scope(Encoder* e, std::string_view prefix, std::string_view part)
            : e_(e), size_(e->path.size()) {
            e->path.append(prefix);
            e->path.append(part);
        }
        ~Scope() {
            if (e_->error_->empty()) e_->path.resize(size_);
        }
        Encoder* e_;
        std::size_t size_;
    };

    bool fail(const char* wanted) {
        if (error_->empty()) *error_ = path + ": expected " + wanted + " for the Avro schema";
        return false;
    }

    bool encode_integer(const JsonTree::Item& v, const Node* n, std::string* out) {
        int64_t x = 0;
        if (v.kind == JsonTokens::kNumber) {
            if (!integer_of(v.text, &x)) return fail("an integer");
        } else if (v.kind == JsonTokens::kString) {
            std::string text(v.text);
            const char* p = text.c_str();
            bool ok = false;
            switch (n->logical) {
                case Node::kDate:
                    ok = parse_date(p, &x) && *p == '\0';
                    break;
                case Node::kTimeMillis:
                case Node::kTimeMicros:
                    ok = parse_time(p, n->logical == Node::kTimeMillis ? 1000 : 1000000, &x) &&
                         *p == '\0';
                    break;
                case Node::kTimestampMillis:
                case Node::kLocalTimestampMillis:
                    ok = parse_timestamp(text, 1000, &x);
                    break;
                case Node::kTimestampMicros:
                case Node::kLocalTimestampMicros:
                    ok = parse_timestamp(text, 1000000, &x);
                    break;
                default:
                    break;
            }
            if (!ok) return fail(n->logical == Node::kNone ? "an integer" : "an ISO date/time");
        } else {
            return fail("an integer");
        }
        if (n->kind == Node::kInt && (x < INT32_MIN || x > INT32_MAX))
            return fail("an integer within int's range");
        put_long(x, out);
        return true;
    }

    bool encode_float(const JsonTree::Item& v, bool single, std::string* out) {
        double x;
        if (v.kind == JsonTokens::kNumber) {
            x = strtod(std::string(v.text).c_str(), nullptr);
        } else if (v.kind == JsonTokens::kString && v.text == "NaN") {
            x = std::nan("");
        } else if (v.kind == JsonTokens::kString &&
                   (v.text == "Infinity" || v.text == "-Infinity")) {
            x = v.text == "Infinity" ? HUGE_VAL : -HUGE_VAL;
        } else {
            return fail("a number");
        }
        if (single) {
            auto f = static_cast<float>(x);
            out->append(reinterpret_cast<const char*>(&f), 4);
        } else {
            out->append(reinterpret_cast<const char*>(&x), 8);
        }
        return true;
    }

    bool encode_bytes(const JsonTree& t, std::size_t i, const Node* n, std::string* out) {
        const JsonTree::Item& v = t.items[i];
        std::string bytes;
        std::size_t fixed = n->kind == Node::kFixed ? n->size : 0;
        if (n->logical == Node::kDecimal) {
            bool text = v.kind == JsonTokens::kString || v.kind == JsonTokens::kNumber;
            if (!text || !decimal_bytes(v.text, n->scale, fixed, &bytes))
                return fail("a decimal (a string of digits within the scale)");
        } else if (n->logical == Node::kDuration && v.kind == JsonTokens::kBeginObject) {
            for (const char* part : {"months", "days", "milliseconds"}) {
                int64_t x = 0;
                for (std::size_t c = i + 1; c < v.end; c = t.items[c].end)
                    if (t.items[c].key == part && !integer_of(t.items[c].text, &x))
                        return fail("a duration of integers");
                auto u = static_cast<uint32_t>(x);
                for (int k = 0; k < 4; ++k)
                    bytes.push_back(static_cast<char>((u >> (8 * k)) & 0xff));
            }
        } else if (v.kind != JsonTokens::kString || !decode_base64(v.text, &bytes)) {
            return fail("base64 bytes");
        }
        if (fixed > 0) {
            if (bytes.size() != fixed) return fail("fixed bytes of the schema's size");
            out->append(bytes);
        } else {
            put_bytes(bytes, out);
        }
        return true;
    }

    bool encode_record(const JsonTree& t, std::size_t i, const Node* n, std::string* out) {
        const JsonTree::Item& v = t.items[i];
        if (v.kind != JsonTokens::kBeginObject) return fail("an object (record)");
        std::size_t matched = 0;
        for (std::size_t f = 0; f < n->names.size(); ++f) {
            Scope scope(this, ".", n->names[f]);
            std::size_t found = 0;  // the last member of that name, as jsonb keeps it
            for (std::size_t c = i + 1; c < v.end; c = t.items[c].end)
                if (t.items[c].key == n->names[f]) found = c;
            if (found != 0) {
                ++matched;
                if (!encode(t, found, n->children[f], out)) return false;
            } else if (n->has_default[f]) {
                JsonTree d;
                if (!d.build(n->defaults[f]) || !encode(d, 0, n->children[f], out)) return false;
            } else {
                return fail("the field (it has no default)");
            }
        }
        if (matched < v.children) {
            for (std::size_t c = i + 1; c < v.end; c = t.items[c].end)
                if (std::find(n->names.begin(), n->names.end(), t.items[c].key) == n->names.end()) {
                    Scope scope(this, ".", t.items[c].key);
                    return fail("no such field: the schema has none");
                }
        }
        return true;
    }

    // The first branch that takes the value (the decoder writes unions plain).
    bool encode_union(const JsonTree& t, std::size_t i, const Node* n, std::string* out) {
        std::string first_error;
        for (std::size_t b = 0; b < n->children.size(); ++b) {
            std::string attempt;
            std::string saved = *error_;
            error_->clear();
            std::string saved_path = path;
            bool ok = encode(t, i, n->children[b], &attempt);
            if (first_error.empty()) first_error = *error_;
            *error_ = saved;
            path = saved_path;
            if (ok) {
                put_long(static_cast<int64_t>(b), out);
                out->append(attempt);
                return true;
            }
        }
        if (error_->empty())
            *error_ =
                first_error.empty() ? path + ": no union branch takes the value" : first_error;
        return false;
    }

    std::string* error_;
};

}  // namespace

bool encode(std::string_view json, const Node* root, std::string* out, std::string* error) {
    // The payload's tree, kept between calls (the relay encodes one payload after another):
    // its buffers are allocated once, not per message.
    static thread_local JsonTree tree;
    bool built = tree.build(json);
    error->clear();
    bool ok = built && Encoder(error).encode(tree, 0, root, out);
    if (!built) *error = "payload is not JSON";
    tree.release_large();
    return ok;
}

}  // namespace eventbox::registry::avro
