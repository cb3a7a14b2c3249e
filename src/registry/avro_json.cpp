// Avro datums as JSON text (see registry/avro_json.hpp and docs/guide/formats.md).
#include "registry/avro_json.hpp"

#include <avro.h>

#include <algorithm>
#include <charconv>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/base64.hpp"
#include "core/error.hpp"
#include "registry/avro_tree.hpp"
#include "registry/json_text.hpp"

namespace eventbox::registry {

namespace {

using avro::Node;

// What to_json() keeps of its scratch tokens between records.
constexpr std::size_t kKeptScratchBytes = 64 * 1024;

// Days since 1970-01-01 as a civil date (Howard Hinnant's algorithm).
void civil(int64_t days, int64_t* y, unsigned* m, unsigned* d) {
    days += 719468;
    int64_t era = (days >= 0 ? days : days - 146096) / 146097;
    auto doe = static_cast<unsigned>(days - era * 146097);
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t year = static_cast<int64_t>(yoe) + era * 400;
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    unsigned mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = year + (*m <= 2 ? 1 : 0);
}

int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

// "YYYY-MM-DD" into `buf` (48 bytes); returns its length.
int format_date(int64_t days, char* buf) {
    int64_t y;
    unsigned m, d;
    civil(days, &y, &m, &d);
    return snprintf(buf, 48, "%04" PRId64 "-%02u-%02u", y, m, d);
}

// Time of day from `units` of 1/per second since midnight, with `digits` fraction digits, into
// `buf` (48 bytes); returns its length.
int format_time(int64_t units, int64_t per, int digits, char* buf) {
    int64_t seconds = units / per, fraction = units % per;
    return snprintf(buf, 48, "%02" PRId64 ":%02" PRId64 ":%02" PRId64 ".%0*" PRId64, seconds / 3600,
                    seconds / 60 % 60, seconds % 60, digits, fraction);
}

void write_timestamp(int64_t units, int64_t per, int digits, bool utc, TokenWriter& w) {
    int64_t per_day = 86400 * per;
    int64_t days = floor_div(units, per_day);
    char buf[112];
    int n = format_date(days, buf);
    buf[n++] = 'T';
    n += format_time(units - days * per_day, per, digits, buf + n);
    if (utc) buf[n++] = 'Z';
    w.ascii(std::string_view(buf, static_cast<std::size_t>(n)));
}

// A two's-complement big-endian integer scaled by 10^-scale, as decimal text.
void write_decimal(const unsigned char* b, std::size_t len, int scale, TokenWriter& w) {
    bool negative = len > 0 && (b[0] & 0x80) != 0;
    std::vector<unsigned char> mag(b, b + len);
    if (negative) {  // magnitude = ~x + 1
        for (auto& c : mag) c = static_cast<unsigned char>(~c);
        for (std::size_t i = mag.size(); i-- > 0;)
            if (++mag[i] != 0) break;
    }
    std::string digits;
    std::size_t start = 0;
    while (start < mag.size() && mag[start] == 0) ++start;
    while (start < mag.size()) {  // repeated division by 10
        unsigned rem = 0;
        for (std::size_t i = start; i < mag.size(); ++i) {
            unsigned cur = rem * 256 + mag[i];
            mag[i] = static_cast<unsigned char>(cur / 10);
            rem = cur % 10;
        }
        digits.push_back(static_cast<char>('0' + rem));
        while (start < mag.size() && mag[start] == 0) ++start;
    }
    if (digits.empty()) digits = "0";
    while (digits.size() <= static_cast<std::size_t>(scale)) digits.push_back('0');
    std::string text;
    if (negative) text.push_back('-');
    for (std::size_t i = digits.size(); i-- > 0;) {
        text.push_back(digits[i]);
        if (i == static_cast<std::size_t>(scale) && scale > 0) text.push_back('.');
    }
    w.ascii(text);
}

// NaN and the infinities as the strings "NaN", "Infinity", "-Infinity" (JSON has no such
// numbers); the others with the digits that read back to the same value.
void write_double(double v, bool single, TokenWriter& w) {
    if (std::isnan(v)) {
        w.ascii("NaN");
    } else if (std::isinf(v)) {
        w.ascii(v > 0 ? "Infinity" : "-Infinity");
    } else {
        char buf[40];
        int n = snprintf(buf, sizeof buf, single ? "%.9g" : "%.17g", v);
        w.number(std::string_view(buf, static_cast<std::size_t>(n)));
    }
}

void write_int(int64_t v, TokenWriter& w) {
    char buf[24];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    (void)ec;  // 24 bytes hold any int64
    w.number(std::string_view(buf, static_cast<std::size_t>(end - buf)));
}

uint32_t le32(const unsigned char* p) {
    return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

// The walk of one datum read by Avro C, along the schema's node tree (for the logical types),
// into a TokenWriter. Its methods return false with `error` on data Avro C read but JSON
// cannot say (a string or map key that is not UTF-8).
class Walker {
  public:
    Walker(TokenWriter& w, std::string* error) : w_(w), error_(error) {}

    bool value(avro_value_t* v, const Node* n);

  private:
    bool children(avro_value_t* v, const Node* n, avro_type_t type);
    void integer(int64_t x, Node::Logical logical);
    void bytes(const unsigned char* b, std::size_t len, const Node* n);
    bool scalar(avro_value_t* v, avro_type_t type);

    TokenWriter& w_;
    std::string* error_;
    std::string scratch_;  // base64 text
};

bool Walker::children(avro_value_t* v, const Node* n, avro_type_t type) {
    bool object = type != AVRO_ARRAY, by_field = type == AVRO_RECORD;
    size_t count = 0;
    avro_value_get_size(v, &count);
    if (object)
        w_.begin_object();
    else
        w_.begin_array();
    for (size_t i = 0; i < count; ++i) {
        avro_value_t child;
        const char* name = nullptr;
        avro_value_get_by_index(v, i, &child, &name);
        if (object && !w_.key(name, strlen(name))) {
            *error_ = "Avro map key is not valid UTF-8";
            return false;
        }
        const Node* c = by_field ? (i < n->children.size() ? n->children[i] : nullptr)
                                 : (n->children.empty() ? nullptr : n->children[0]);
        if (!value(&child, c)) return false;
    }
    if (object)
        w_.end_object();
    else
        w_.end_array();
    return true;
}

void Walker::integer(int64_t x, Node::Logical logical) {
    char buf[48];
    switch (logical) {
        case Node::kDate:
            w_.ascii(std::string_view(buf, static_cast<std::size_t>(format_date(x, buf))));
            return;
        case Node::kTimeMillis:
        case Node::kTimeMicros: {
            bool millis = logical == Node::kTimeMillis;
            int n = format_time(x, millis ? 1000 : 1000000, millis ? 3 : 6, buf);
            w_.ascii(std::string_view(buf, static_cast<std::size_t>(n)));
            return;
        }
        case Node::kTimestampMillis:
        case Node::kLocalTimestampMillis:
            write_timestamp(x, 1000, 3, logical == Node::kTimestampMillis, w_);
            return;
        case Node::kTimestampMicros:
        case Node::kLocalTimestampMicros:
            write_timestamp(x, 1000000, 6, logical == Node::kTimestampMicros, w_);
            return;
        default:
            write_int(x, w_);
            return;
    }
}

void Walker::bytes(const unsigned char* b, std::size_t len, const Node* n) {
    Node::Logical logical = n ? n->logical : Node::kNone;
    if (logical == Node::kDecimal) {
        write_decimal(b, len, n->scale, w_);
    } else if (logical == Node::kDuration && len == 12) {
        w_.begin_object();
        const char* parts[] = {"months", "days", "milliseconds"};
        for (int k = 0; k < 3; ++k) {
            w_.key(parts[k], strlen(parts[k]));
            write_int(le32(b + 4 * k), w_);
        }
        w_.end_object();
    } else {
        scratch_.clear();
        append_base64(std::string_view(reinterpret_cast<const char*>(b), len), &scratch_);
        w_.ascii(scratch_);
    }
}

// null, boolean, float, double, string and enum values.
bool Walker::scalar(avro_value_t* v, avro_type_t type) {
    switch (type) {
        case AVRO_NULL:
            w_.null();
            return true;
        case AVRO_BOOLEAN: {
            int b = 0;
            avro_value_get_boolean(v, &b);
            w_.boolean(b != 0);
            return true;
        }
        case AVRO_FLOAT: {
            float x = 0;
            avro_value_get_float(v, &x);
            write_double(x, true, w_);
            return true;
        }
        case AVRO_DOUBLE: {
            double x = 0;
            avro_value_get_double(v, &x);
            write_double(x, false, w_);
            return true;
        }
        case AVRO_STRING: {
            const char* s = nullptr;
            size_t size = 0;
            avro_value_get_string(v, &s, &size);
            if (!w_.string(s, size > 0 ? size - 1 : 0)) {
                *error_ = "Avro string is not valid UTF-8";
                return false;
            }
            return true;
        }
        case AVRO_ENUM: {
            int symbol = 0;
            avro_value_get_enum(v, &symbol);
            // Avro C reads any index; the symbol's lookup past the last is undefined.
            avro_schema_t schema = avro_value_get_schema(v);
            const char* name = symbol >= 0 && symbol < avro_schema_enum_number_of_symbols(schema)
                                   ? avro_schema_enum_get(schema, symbol)
                                   : nullptr;
            if (name == nullptr) {
                *error_ = "Avro enum symbol " + std::to_string(symbol) + " out of range";
                return false;
            }
            return w_.string(name, strlen(name));
        }
        default:
            *error_ = "Avro value of an unsupported type";
            return false;
    }
}

bool Walker::value(avro_value_t* v, const Node* n) {
    avro_type_t type = avro_value_get_type(v);
    switch (type) {
        case AVRO_INT32: {
            int32_t x = 0;
            avro_value_get_int(v, &x);
            integer(x, n ? n->logical : Node::kNone);
            return true;
        }
        case AVRO_INT64: {
            int64_t x = 0;
            avro_value_get_long(v, &x);
            integer(x, n ? n->logical : Node::kNone);
            return true;
        }
        case AVRO_BYTES:
        case AVRO_FIXED: {
            const void* b = nullptr;
            size_t size = 0;
            if (type == AVRO_BYTES)
                avro_value_get_bytes(v, &b, &size);
            else
                avro_value_get_fixed(v, &b, &size);
            bytes(static_cast<const unsigned char*>(b), size, n);
            return true;
        }
        case AVRO_RECORD:
        case AVRO_MAP:
        case AVRO_ARRAY:
            return children(v, n, type);
        case AVRO_UNION: {
            int branch = 0;
            avro_value_t current;
            avro_value_get_discriminant(v, &branch);
            avro_value_get_current_branch(v, &current);
            const Node* c =
                n && branch >= 0 && static_cast<std::size_t>(branch) < n->children.size()
                    ? n->children[branch]
                    : nullptr;
            return value(&current, c);
        }
        default:
            return scalar(v, type);
    }
}

}  // namespace

struct AvroSchema::Impl {
    avro_schema_t schema = nullptr;
    avro_value_iface_t* iface = nullptr;
    avro_value_t value{};
    bool has_value = false;
    avro_reader_t reader = nullptr;
    std::vector<std::unique_ptr<Node>> nodes;
    const Node* root = nullptr;
    std::string name;
    JsonTokens scratch;  // to_json()'s tokens, kept between records

    ~Impl() {
        if (has_value) avro_value_decref(&value);
        if (iface != nullptr) avro_value_iface_decref(iface);
        if (schema != nullptr) avro_schema_decref(schema);
        if (reader != nullptr) avro_reader_free(reader);
    }
};

AvroSchema::AvroSchema(std::string_view json) : impl_(std::make_unique<Impl>()) {
    avro_schema_error_t ignored = nullptr;
    if (avro_schema_from_json_length(json.data(), json.size(), &impl_->schema) != 0)
        throw Error(sqlstate::kInvalidParameterValue,
                    std::string("Avro schema refused: ") + avro_strerror());
    nlohmann::json parsed = nlohmann::json::parse(json, nullptr, false);
    if (parsed.is_discarded())
        throw Error(sqlstate::kInvalidParameterValue, "Avro schema is not valid JSON");
    (void)ignored;
    try {
        avro::TreeBuilder builder(&impl_->nodes);
        impl_->root = builder.build(parsed, "");
        impl_->name = builder.top_name;
    } catch (const nlohmann::json::exception& e) {
        throw Error(sqlstate::kInvalidParameterValue,
                    std::string("Avro schema is malformed: ") + e.what());
    }
    impl_->iface = avro_generic_class_from_schema(impl_->schema);
    if (impl_->iface == nullptr || avro_generic_value_new(impl_->iface, &impl_->value) != 0)
        throw Error(sqlstate::kInvalidParameterValue,
                    std::string("Avro schema refused: ") + avro_strerror());
    impl_->has_value = true;
    impl_->reader = avro_reader_memory(nullptr, 0);
}

AvroSchema::~AvroSchema() = default;

bool AvroSchema::from_json(std::string_view json, std::string* out, std::string* error) const {
    return avro::encode(json, impl_->root, out, error);
}

const std::string& AvroSchema::full_name() const noexcept {
    return impl_->name;
}

bool AvroSchema::to_json(const char* data, std::size_t len, std::string* out,
                         std::string* error) const {
    JsonTokens& tokens = impl_->scratch;
    tokens.tokens.clear();
    tokens.text.clear();
    tokens.depth = 0;
    bool ok = to_tokens(data, len, &tokens, error);
    if (ok) append_tokens_json(tokens, out);
    if (tokens.text.capacity() > kKeptScratchBytes) JsonTokens().text.swap(tokens.text);
    if (tokens.tokens.capacity() * sizeof(JsonTokens::Token) > kKeptScratchBytes)
        std::vector<JsonTokens::Token>().swap(tokens.tokens);
    return ok;
}

bool AvroSchema::to_tokens(const char* data, std::size_t len, JsonTokens* tokens,
                           std::string* error) const {
    avro_reader_memory_set_source(impl_->reader, data, static_cast<int64_t>(len));
    if (avro_value_read(impl_->reader, &impl_->value) != 0) {
        *error = std::string("Avro data does not match its schema: ") + avro_strerror();
        while (!error->empty() && (error->back() == '\n' || error->back() == ' '))
            error->pop_back();
        return false;
    }
    size_t used = 0;
    if (avro_value_sizeof(&impl_->value, &used) != 0 || used != len) {
        *error = "Avro data has " + std::to_string(len - used) + " bytes after its value";
        return false;
    }
    TokenWriter writer(tokens);
    return Walker(writer, error).value(&impl_->value, impl_->root);
}

}  // namespace eventbox::registry
