// Avro datums as JSON text (see registry/avro_json.hpp and docs/guide/formats.md).
#include "registry/avro_json.hpp"

#include <avro.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <vector>

#include "core/base64.hpp"
#include "core/error.hpp"
#include "registry/avro_tree.hpp"
#include "registry/json_text.hpp"

namespace eventbox::registry {

namespace {

using avro::Node;

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

void append_date(int64_t days, std::string* out) {
    int64_t y;
    unsigned m, d;
    civil(days, &y, &m, &d);
    char buf[48];
    snprintf(buf, sizeof buf, "%04" PRId64 "-%02u-%02u", y, m, d);
    out->append(buf);
}

// Time of day from `units` of 1/per second since midnight, with `digits` fraction digits.
void append_time(int64_t units, int64_t per, int digits, std::string* out) {
    int64_t seconds = units / per, fraction = units % per;
    char buf[48];
    snprintf(buf, sizeof buf, "%02" PRId64 ":%02" PRId64 ":%02" PRId64 ".%0*" PRId64,
             seconds / 3600, seconds / 60 % 60, seconds % 60, digits, fraction);
    out->append(buf);
}

void append_timestamp(int64_t units, int64_t per, int digits, bool utc, std::string* out) {
    int64_t per_day = 86400 * per;
    int64_t days = floor_div(units, per_day);
    out->push_back('"');
    append_date(days, out);
    out->push_back('T');
    append_time(units - days * per_day, per, digits, out);
    if (utc) out->push_back('Z');
    out->push_back('"');
}

// A two's-complement big-endian integer scaled by 10^-scale, as decimal text.
void append_decimal(const unsigned char* b, std::size_t len, int scale, std::string* out) {
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
    out->push_back('"');
    if (negative) out->push_back('-');
    for (std::size_t i = digits.size(); i-- > 0;) {
        out->push_back(digits[i]);
        if (i == static_cast<std::size_t>(scale) && scale > 0) out->push_back('.');
    }
    out->push_back('"');
}

void append_double(double v, bool single, std::string* out) {
    if (std::isnan(v)) {
        out->append("\"NaN\"");
    } else if (std::isinf(v)) {
        out->append(v > 0 ? "\"Infinity\"" : "\"-Infinity\"");
    } else {
        char buf[40];
        snprintf(buf, sizeof buf, single ? "%.9g" : "%.17g", v);
        out->append(buf);
    }
}

void append_int(int64_t v, std::string* out) {
    char buf[24];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    out->append(buf);
}

uint32_t le32(const unsigned char* p) {
    return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

// Writes one value; false with `error` on data Avro C read but JSON cannot say.
bool write(avro_value_t* v, const Node* n, std::string* out, std::string* error);

bool write_children(avro_value_t* v, const Node* n, bool object, bool by_field, std::string* out,
                    std::string* error) {
    size_t count = 0;
    avro_value_get_size(v, &count);
    out->push_back(object ? '{' : '[');
    for (size_t i = 0; i < count; ++i) {
        avro_value_t child;
        const char* name = nullptr;
        avro_value_get_by_index(v, i, &child, &name);
        if (i > 0) out->push_back(',');
        if (object) {
            if (!append_json_string(name, strlen(name), out)) {
                *error = "Avro map key is not valid UTF-8";
                return false;
            }
            out->push_back(':');
        }
        const Node* c = by_field ? (i < n->children.size() ? n->children[i] : nullptr)
                                 : (n->children.empty() ? nullptr : n->children[0]);
        if (!write(&child, c, out, error)) return false;
    }
    out->push_back(object ? '}' : ']');
    return true;
}

bool write_int(int64_t x, Node::Logical logical, std::string* out) {
    switch (logical) {
        case Node::kDate:
            out->push_back('"');
            append_date(x, out);
            out->push_back('"');
            return true;
        case Node::kTimeMillis:
        case Node::kTimeMicros:
            out->push_back('"');
            if (logical == Node::kTimeMillis)
                append_time(x, 1000, 3, out);
            else
                append_time(x, 1000000, 6, out);
            out->push_back('"');
            return true;
        case Node::kTimestampMillis:
        case Node::kLocalTimestampMillis:
            append_timestamp(x, 1000, 3, logical == Node::kTimestampMillis, out);
            return true;
        case Node::kTimestampMicros:
        case Node::kLocalTimestampMicros:
            append_timestamp(x, 1000000, 6, logical == Node::kTimestampMicros, out);
            return true;
        default:
            append_int(x, out);
            return true;
    }
}

bool write_bytes(const unsigned char* b, std::size_t len, const Node* n, std::string* out) {
    Node::Logical logical = n ? n->logical : Node::kNone;
    if (logical == Node::kDecimal) {
        append_decimal(b, len, n->scale, out);
    } else if (logical == Node::kDuration && len == 12) {
        out->append("{\"months\":");
        append_int(le32(b), out);
        out->append(",\"days\":");
        append_int(le32(b + 4), out);
        out->append(",\"milliseconds\":");
        append_int(le32(b + 8), out);
        out->push_back('}');
    } else {
        out->push_back('"');
        append_base64(std::string_view(reinterpret_cast<const char*>(b), len), out);
        out->push_back('"');
    }
    return true;
}

bool write(avro_value_t* v, const Node* n, std::string* out, std::string* error) {
    Node::Logical logical = n ? n->logical : Node::kNone;
    switch (avro_value_get_type(v)) {
        case AVRO_NULL:
            out->append("null");
            return true;
        case AVRO_BOOLEAN: {
            int b = 0;
            avro_value_get_boolean(v, &b);
            out->append(b ? "true" : "false");
            return true;
        }
        case AVRO_INT32: {
            int32_t x = 0;
            avro_value_get_int(v, &x);
            return write_int(x, logical, out);
        }
        case AVRO_INT64: {
            int64_t x = 0;
            avro_value_get_long(v, &x);
            return write_int(x, logical, out);
        }
        case AVRO_FLOAT: {
            float x = 0;
            avro_value_get_float(v, &x);
            append_double(x, true, out);
            return true;
        }
        case AVRO_DOUBLE: {
            double x = 0;
            avro_value_get_double(v, &x);
            append_double(x, false, out);
            return true;
        }
        case AVRO_STRING: {
            const char* s = nullptr;
            size_t size = 0;
            avro_value_get_string(v, &s, &size);
            if (!append_json_string(s, size > 0 ? size - 1 : 0, out)) {
                *error = "Avro string is not valid UTF-8";
                return false;
            }
            return true;
        }
        case AVRO_BYTES:
        case AVRO_FIXED: {
            const void* b = nullptr;
            size_t size = 0;
            if (avro_value_get_type(v) == AVRO_BYTES)
                avro_value_get_bytes(v, &b, &size);
            else
                avro_value_get_fixed(v, &b, &size);
            return write_bytes(static_cast<const unsigned char*>(b), size, n, out);
        }
        case AVRO_ENUM: {
            int symbol = 0;
            avro_value_get_enum(v, &symbol);
            const char* name = avro_schema_enum_get(avro_value_get_schema(v), symbol);
            if (name == nullptr) {
                *error = "Avro enum symbol " + std::to_string(symbol) + " out of range";
                return false;
            }
            return append_json_string(name, strlen(name), out);
        }
        case AVRO_RECORD:
            return write_children(v, n, true, true, out, error);
        case AVRO_MAP:
            return write_children(v, n, true, false, out, error);
        case AVRO_ARRAY:
            return write_children(v, n, false, false, out, error);
        case AVRO_UNION: {
            int branch = 0;
            avro_value_t current;
            avro_value_get_discriminant(v, &branch);
            avro_value_get_current_branch(v, &current);
            const Node* c =
                n && branch >= 0 && static_cast<std::size_t>(branch) < n->children.size()
                    ? n->children[branch]
                    : nullptr;
            return write(&current, c, out, error);
        }
        default:
            *error = "Avro value of an unsupported type";
            return false;
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

bool AvroSchema::from_json(const std::string& json, std::string* out, std::string* error) const {
    return avro::encode(json, impl_->root, out, error);
}

const std::string& AvroSchema::full_name() const noexcept {
    return impl_->name;
}

bool AvroSchema::to_json(const char* data, std::size_t len, std::string* out,
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
    return write(&impl_->value, impl_->root, out, error);
}

}  // namespace eventbox::registry
