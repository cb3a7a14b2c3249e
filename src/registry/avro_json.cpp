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

#include "core/error.hpp"
#include "registry/json_text.hpp"

namespace eventbox::registry {

namespace {

// What the JSON of a value needs beyond what Avro C knows: its logical type, and the nodes of
// its children (record fields in order, union branches, array items or map values).
struct Node {
    enum Logical {
        kNone,
        kDecimal,
        kDate,
        kTimeMillis,
        kTimeMicros,
        kTimestampMillis,
        kTimestampMicros,
        kLocalTimestampMillis,
        kLocalTimestampMicros,
        kDuration
    };
    // The type, for the encoder (the decoder asks Avro C).
    enum Kind {
        kNull,
        kBoolean,
        kInt,
        kLong,
        kFloat,
        kDouble,
        kBytes,
        kString,
        kRecord,
        kEnum,
        kArray,
        kMap,
        kUnion,
        kFixed
    };
    Kind kind = kNull;
    Logical logical = kNone;
    int scale = 0;
    std::size_t size = 0;  // fixed
    std::vector<const Node*> children;
    std::vector<std::string> names;               // record fields; enum symbols
    std::vector<const nlohmann::json*> defaults;  // record fields' defaults (nullptr: none)
};

Node::Kind primitive_kind(const std::string& name) {
    static const std::unordered_map<std::string, Node::Kind> kinds = {
        {"null", Node::kNull},   {"boolean", Node::kBoolean}, {"int", Node::kInt},
        {"long", Node::kLong},   {"float", Node::kFloat},     {"double", Node::kDouble},
        {"bytes", Node::kBytes}, {"string", Node::kString}};
    return kinds.at(name);
}

Node::Logical logical_of(const nlohmann::json& j) {
    auto it = j.find("logicalType");
    if (it == j.end() || !it->is_string()) return Node::kNone;
    static const std::unordered_map<std::string, Node::Logical> names = {
        {"decimal", Node::kDecimal},
        {"date", Node::kDate},
        {"time-millis", Node::kTimeMillis},
        {"time-micros", Node::kTimeMicros},
        {"timestamp-millis", Node::kTimestampMillis},
        {"timestamp-micros", Node::kTimestampMicros},
        {"local-timestamp-millis", Node::kLocalTimestampMillis},
        {"local-timestamp-micros", Node::kLocalTimestampMicros},
        {"duration", Node::kDuration}};
    auto found = names.find(it->get<std::string>());
    return found == names.end() ? Node::kNone : found->second;
}

bool is_primitive(const std::string& name) {
    return name == "null" || name == "boolean" || name == "int" || name == "long" ||
           name == "float" || name == "double" || name == "bytes" || name == "string";
}

// Builds the node tree of a schema, resolving named types as Avro does (full names; a simple
// name in the enclosing namespace).
class TreeBuilder {
  public:
    explicit TreeBuilder(std::vector<std::unique_ptr<Node>>* nodes) : nodes_(nodes) {}

    const Node* build(const nlohmann::json& j, const std::string& ns) {
        if (j.is_string()) return reference(j.get<std::string>(), ns);
        if (j.is_array()) {
            Node* n = make();
            n->kind = Node::kUnion;
            for (const auto& branch : j) n->children.push_back(build(branch, ns));
            return n;
        }
        if (!j.is_object() || !j.contains("type"))
            throw Error(sqlstate::kInvalidParameterValue, "Avro schema has a malformed type");
        const nlohmann::json& type = j["type"];
        if (!type.is_string()) return build(type, ns);
        std::string t = type.get<std::string>();
        if (t == "record" || t == "error" || t == "enum" || t == "fixed") return named(j, t, ns);
        Node* n = make();
        if (t == "array") {
            n->kind = Node::kArray;
            n->children.push_back(build(j.at("items"), ns));
        } else if (t == "map") {
            n->kind = Node::kMap;
            n->children.push_back(build(j.at("values"), ns));
        } else if (is_primitive(t)) {
            n->kind = primitive_kind(t);
            set_logical(n, j);
        } else {
            return reference(t, ns);
        }
        return n;
    }

    std::string top_name;  // the first named type met at the top

  private:
    Node* make() {
        nodes_->push_back(std::make_unique<Node>());
        return nodes_->back().get();
    }

    static void set_logical(Node* n, const nlohmann::json& j) {
        n->logical = logical_of(j);
        if (n->logical == Node::kDecimal) {
            auto scale = j.find("scale");
            n->scale = scale != j.end() && scale->is_number_integer() ? scale->get<int>() : 0;
            if (n->scale < 0 || n->scale > 1000)
                throw Error(sqlstate::kInvalidParameterValue, "Avro decimal has a bad scale");
        }
    }

    const Node* named(const nlohmann::json& j, const std::string& t, const std::string& ns) {
        std::string name = j.at("name").get<std::string>();
        std::string space = ns;
        auto n_it = j.find("namespace");
        if (n_it != j.end() && n_it->is_string()) space = n_it->get<std::string>();
        std::string full =
            name.find('.') != std::string::npos || space.empty() ? name : space + "." + name;
        std::string inner =
            full.substr(0, full.rfind('.') == std::string::npos ? 0 : full.rfind('.'));
        Node* n = make();
        if (top_name.empty() && depth_ == 0) top_name = full;
        by_name_[full] = n;  // before the fields: a record may refer to itself
        if (t == "record" || t == "error") {
            n->kind = Node::kRecord;
            ++depth_;
            for (const auto& field : j.at("fields")) {
                n->children.push_back(build(field.at("type"), inner));
                n->names.push_back(field.at("name").get<std::string>());
                auto d = field.find("default");
                n->defaults.push_back(d == field.end() ? nullptr : &*d);
            }
            --depth_;
        } else if (t == "fixed") {
            n->kind = Node::kFixed;
            n->size = j.at("size").get<std::size_t>();
            set_logical(n, j);
        } else {
            n->kind = Node::kEnum;
            for (const auto& symbol : j.at("symbols"))
                n->names.push_back(symbol.get<std::string>());
        }
        return n;
    }

    const Node* reference(const std::string& name, const std::string& ns) {
        if (is_primitive(name)) {
            Node* n = make();
            n->kind = primitive_kind(name);
            return n;
        }
        auto it = by_name_.find(name);
        if (it == by_name_.end() && !ns.empty()) it = by_name_.find(ns + "." + name);
        if (it == by_name_.end())
            throw Error(sqlstate::kInvalidParameterValue,
                        "Avro schema refers to an unknown type \"" + name + "\"",
                        "References to other subjects' schemas are not supported.");
        return it->second;
    }

    std::vector<std::unique_ptr<Node>>* nodes_;
    std::unordered_map<std::string, Node*> by_name_;
    int depth_ = 0;
};

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
        append_base64(b, len, out);
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

// ---- encoding: JSON (the mapping above, read back) as Avro binary --------------------------

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
bool decimal_bytes(const nlohmann::json& v, int scale, std::size_t size, std::string* out) {
    std::string text = v.is_string() ? v.get<std::string>() : v.is_number_integer() ? v.dump() : "";
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

bool base64_decode(const std::string& text, std::string* out) {
    static const std::string kAlphabet =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    out->clear();
    uint32_t buffer = 0;
    int bits = 0;
    std::size_t i = 0;
    for (; i < text.size() && text[i] != '='; ++i) {
        std::size_t v = kAlphabet.find(text[i]);
        if (v == std::string::npos) return false;
        buffer = (buffer << 6) | static_cast<uint32_t>(v);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out->push_back(static_cast<char>((buffer >> bits) & 0xff));
        }
    }
    for (; i < text.size(); ++i)
        if (text[i] != '=') return false;
    return true;
}

class Encoder {
  public:
    explicit Encoder(std::string* error) : error_(error) {}

    bool encode(const nlohmann::json& v, const Node* n, std::string* out) {
        switch (n->kind) {
            case Node::kNull:
                return v.is_null() || fail("null");
            case Node::kBoolean:
                if (!v.is_boolean()) return fail("a boolean");
                out->push_back(v.get<bool>() ? 1 : 0);
                return true;
            case Node::kInt:
            case Node::kLong:
                return encode_integer(v, n, out);
            case Node::kFloat:
            case Node::kDouble:
                return encode_float(v, n->kind == Node::kFloat, out);
            case Node::kString:
                if (!v.is_string()) return fail("a string");
                put_bytes(v.get_ref<const std::string&>(), out);
                return true;
            case Node::kBytes:
            case Node::kFixed:
                return encode_bytes(v, n, out);
            case Node::kEnum: {
                if (!v.is_string()) return fail("an enum symbol");
                auto it = std::find(n->names.begin(), n->names.end(), v.get<std::string>());
                if (it == n->names.end()) return fail("one of the enum's symbols");
                put_long(it - n->names.begin(), out);
                return true;
            }
            case Node::kArray:
                if (!v.is_array()) return fail("an array");
                if (!v.empty()) put_long(static_cast<int64_t>(v.size()), out);
                for (std::size_t i = 0; i < v.size(); ++i) {
                    Scope scope(this, "[" + std::to_string(i) + "]");
                    if (!encode(v[i], n->children[0], out)) return false;
                }
                out->push_back(0);
                return true;
            case Node::kMap:
                if (!v.is_object()) return fail("an object (map)");
                if (!v.empty()) put_long(static_cast<int64_t>(v.size()), out);
                for (auto it = v.begin(); it != v.end(); ++it) {
                    put_bytes(it.key(), out);
                    Scope scope(this, "." + it.key());
                    if (!encode(it.value(), n->children[0], out)) return false;
                }
                out->push_back(0);
                return true;
            case Node::kRecord:
                return encode_record(v, n, out);
            case Node::kUnion:
                return encode_union(v, n, out);
        }
        return fail("a supported value");
    }

    std::string path = "$";

  private:
    struct Scope {
        Scope(Encoder* e, const std::string& part) : e_(e), size_(e->path.size()) {
            e->path += part;
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

    bool encode_integer(const nlohmann::json& v, const Node* n, std::string* out) {
        int64_t x = 0;
        if (v.is_number_integer()) {
            x = v.get<int64_t>();
        } else if (v.is_string()) {
            const std::string& t = v.get_ref<const std::string&>();
            const char* p = t.c_str();
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
                    ok = parse_timestamp(t, 1000, &x);
                    break;
                case Node::kTimestampMicros:
                case Node::kLocalTimestampMicros:
                    ok = parse_timestamp(t, 1000000, &x);
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

    bool encode_float(const nlohmann::json& v, bool single, std::string* out) {
        double x;
        if (v.is_number()) {
            x = v.get<double>();
        } else if (v == "NaN") {
            x = std::nan("");
        } else if (v == "Infinity" || v == "-Infinity") {
            x = v == "Infinity" ? HUGE_VAL : -HUGE_VAL;
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

    bool encode_bytes(const nlohmann::json& v, const Node* n, std::string* out) {
        std::string bytes;
        std::size_t fixed = n->kind == Node::kFixed ? n->size : 0;
        if (n->logical == Node::kDecimal) {
            if (!decimal_bytes(v, n->scale, fixed, &bytes))
                return fail("a decimal (a string of digits within the scale)");
        } else if (n->logical == Node::kDuration && v.is_object()) {
            for (const char* part : {"months", "days", "milliseconds"}) {
                auto x = static_cast<uint32_t>(v.value(part, 0u));
                for (int k = 0; k < 4; ++k)
                    bytes.push_back(static_cast<char>((x >> (8 * k)) & 0xff));
            }
        } else if (!v.is_string() || !base64_decode(v.get<std::string>(), &bytes)) {
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

    bool encode_record(const nlohmann::json& v, const Node* n, std::string* out) {
        if (!v.is_object()) return fail("an object (record)");
        std::size_t matched = 0;
        for (std::size_t i = 0; i < n->names.size(); ++i) {
            Scope scope(this, "." + n->names[i]);
            auto it = v.find(n->names[i]);
            const nlohmann::json* field = it != v.end() ? &*it : n->defaults[i];
            if (it != v.end()) ++matched;
            if (field == nullptr) return fail("the field (it has no default)");
            if (!encode(*field, n->children[i], out)) return false;
        }
        if (matched < v.size()) {
            for (auto it = v.begin(); it != v.end(); ++it)
                if (std::find(n->names.begin(), n->names.end(), it.key()) == n->names.end()) {
                    Scope scope(this, "." + it.key());
                    return fail("no such field: the schema has none");
                }
        }
        return true;
    }

    // The first branch that takes the value (the decoder writes unions plain).
    bool encode_union(const nlohmann::json& v, const Node* n, std::string* out) {
        std::string first_error;
        for (std::size_t b = 0; b < n->children.size(); ++b) {
            std::string attempt;
            std::string saved = *error_;
            error_->clear();
            std::string saved_path = path;
            bool ok = encode(v, n->children[b], &attempt);
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

struct AvroSchema::Impl {
    avro_schema_t schema = nullptr;
    avro_value_iface_t* iface = nullptr;
    avro_value_t value{};
    bool has_value = false;
    avro_reader_t reader = nullptr;
    nlohmann::json parsed;  // the schema's JSON (the fields' defaults point into it)
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
    impl_->parsed = nlohmann::json::parse(json, nullptr, false);
    const nlohmann::json& parsed = impl_->parsed;
    if (parsed.is_discarded())
        throw Error(sqlstate::kInvalidParameterValue, "Avro schema is not valid JSON");
    (void)ignored;
    try {
        TreeBuilder builder(&impl_->nodes);
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
    nlohmann::json value = nlohmann::json::parse(json, nullptr, false);
    if (value.is_discarded()) {
        *error = "payload is not JSON";
        return false;
    }
    error->clear();
    Encoder encoder(error);
    return encoder.encode(value, impl_->root, out);
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
