// Classification of Kafka records for the inbox (see inbox_record.hpp).
#include "inbox_record.hpp"

#include <nlohmann/json.hpp>

namespace eventbox::inbox {

namespace {

// The last header named `name` with a usable (UTF-8, non-empty) value.
std::optional<std::string_view> header_text(const Record& r, std::string_view name) {
    std::optional<std::string_view> found;
    for (std::size_t i = 0; i < r.n_headers; ++i) {
        const KafkaHeader& h = r.headers[i];
        if (h.name != name || h.value == nullptr || h.value_len == 0) continue;
        if (!valid_utf8(h.value, h.value_len)) continue;
        found = std::string_view(h.value, h.value_len);
    }
    return found;
}

// Header names and values as JSON strings; bytes that are not UTF-8 are written as "\\x<hex>".
nlohmann::json header_string(const char* data, std::size_t len) {
    if (valid_utf8(data, len)) return std::string(data, len);
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out = "\\x";
    for (std::size_t i = 0; i < len; ++i) {
        auto b = static_cast<unsigned char>(data[i]);
        out += kHex[b >> 4];
        out += kHex[b & 15];
    }
    return out;
}

std::string headers_to_json(const Record& r) {
    nlohmann::json object = nlohmann::json::object();
    for (std::size_t i = 0; i < r.n_headers; ++i) {
        const KafkaHeader& h = r.headers[i];
        std::string name = header_string(h.name.data(), h.name.size()).get<std::string>();
        object[name] = h.value ? header_string(h.value, h.value_len) : nlohmann::json(nullptr);
    }
    return object.dump();
}

// A top-level string or integer field of a JSON object, as text.
std::optional<std::string> json_field(const nlohmann::json& doc, const std::string& field) {
    if (!doc.is_object()) return std::nullopt;
    auto it = doc.find(field);
    if (it == doc.end()) return std::nullopt;
    if (it->is_string()) return it->get<std::string>();
    if (it->is_number_unsigned()) return std::to_string(it->get<uint64_t>());
    if (it->is_number_integer()) return std::to_string(it->get<int64_t>());
    return std::nullopt;
}

// Validates JSON syntax and rejects numbers PostgreSQL's numeric (inside jsonb) refuses: an
// exponent beyond +-1000 ("value overflows numeric format").
class JsonbCompatible final : public nlohmann::json_sax<nlohmann::json> {
public:
    bool null() override { return true; }
    bool boolean(bool) override { return true; }
    bool number_integer(number_integer_t) override { return true; }
    bool number_unsigned(number_unsigned_t) override { return true; }
    bool number_float(number_float_t, const string_t& text) override {
        auto e = text.find_first_of("eE");
        if (e == string_t::npos) return true;
        const char* p = text.c_str() + e + 1;
        if (*p == '-' || *p == '+') ++p;
        long exponent = 0;
        for (; *p; ++p) {
            exponent = exponent * 10 + (*p - '0');
            if (exponent > 100000) break;
        }
        return exponent <= 1000;
    }
    bool string(string_t&) override { return true; }
    bool binary(binary_t&) override { return true; }
    bool start_object(std::size_t) override { return true; }
    bool key(string_t&) override { return true; }
    bool end_object() override { return true; }
    bool start_array(std::size_t) override { return true; }
    bool end_array() override { return true; }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
        return false;
    }
};

bool jsonb_compatible(const char* data, std::size_t len) {
    JsonbCompatible sax;
    return nlohmann::json::sax_parse(data, data + len, &sax, nlohmann::json::input_format_t::json,
                                     true);
}

}  // namespace

bool valid_utf8(const char* data, std::size_t len) {
    const auto* s = reinterpret_cast<const unsigned char*>(data);
    std::size_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        if (c < 0x80) {
            if (c == 0) return false;  // PostgreSQL text cannot hold NUL
            ++i;
            continue;
        }
        std::size_t n;
        uint32_t cp;
        if ((c & 0xE0) == 0xC0) n = 1, cp = c & 0x1F;
        else if ((c & 0xF0) == 0xE0) n = 2, cp = c & 0x0F;
        else if ((c & 0xF8) == 0xF0) n = 3, cp = c & 0x07;
        else return false;
        for (std::size_t k = 1; k <= n; ++k) {
            if (i + k >= len || (s[i + k] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
            cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += n + 1;
    }
    return true;
}

Classified classify(const Record& r, const Options& options) {
    Classified out;
    out.headers_json = headers_to_json(r);

    // The value: JSON that jsonb accepts, or raw bytes with a note.
    std::optional<nlohmann::json> doc;
    if (r.value == nullptr) {
        out.raw_null = true;
        out.note = "null value (tombstone)";
    } else if (r.value_len > options.max_message_bytes) {
        out.raw_len = options.max_message_bytes;
        out.note = "value of " + std::to_string(r.value_len) +
                   " bytes exceeds eventbox.max_message_bytes (" +
                   std::to_string(options.max_message_bytes) + "); raw_payload holds the first " +
                   std::to_string(options.max_message_bytes) + " bytes";
    } else if (r.value_len == 0) {
        out.note = "empty value";
    } else if (!valid_utf8(r.value, r.value_len)) {
        out.raw_len = r.value_len;
        out.note = "value is not valid UTF-8";
    } else if (std::string_view(r.value, r.value_len).find("\\u0000") != std::string_view::npos) {
        out.raw_len = r.value_len;
        out.note = "value contains \\u0000, which jsonb cannot store";
    } else if (!jsonb_compatible(r.value, r.value_len)) {
        out.raw_len = r.value_len;
        out.note = "value is not valid JSON";
    } else {
        out.parsable = true;
        // Fields are read from the document only when no header names the id or type.
        bool need_id = !header_text(r, "message_id") && !header_text(r, "ce_id") &&
                       !options.message_id_field.empty();
        bool need_type = !header_text(r, "event_type") && !header_text(r, "ce_type");
        if (need_id || need_type) {
            auto parsed = nlohmann::json::parse(r.value, r.value + r.value_len, nullptr, false);
            if (!parsed.is_discarded()) doc = std::move(parsed);
        }
    }

    // Message id: header message_id, CloudEvents ce_id, the configured field, else transport.
    std::optional<std::string> id;
    if (auto h = header_text(r, "message_id")) id = std::string(*h);
    else if (auto ce = header_text(r, "ce_id")) id = std::string(*ce);
    else if (doc && !options.message_id_field.empty()) id = json_field(*doc, options.message_id_field);
    if (id && (id->empty() || id->size() > kMaxMessageIdBytes || !valid_utf8(id->data(), id->size())))
        id.reset();
    if (id) {
        out.message_id = std::move(*id);
    } else {
        out.transport_id = true;
        out.message_id = std::string(r.topic) + "/" + std::to_string(r.partition) + "/" +
                         std::to_string(r.offset);
    }

    // Event type: header event_type, CloudEvents ce_type, JSON field "type", else none.
    if (auto h = header_text(r, "event_type")) out.event_type = std::string(*h);
    else if (auto ce = header_text(r, "ce_type")) out.event_type = std::string(*ce);
    else if (doc) out.event_type = json_field(*doc, "type");
    if (out.event_type && out.event_type->empty()) out.event_type.reset();
    return out;
}

}  // namespace eventbox::inbox
