// Classification of Kafka records for the inbox (see inbox_record.hpp).
#include "inbox_record.hpp"

#include <nlohmann/json.hpp>
#include <unordered_map>

#include "json_scan.hpp"

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
std::string header_string(const char* data, std::size_t len) {
    if (valid_utf8(data, len)) return std::string(data, len);
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out = "\\x";
    out.reserve(2 + 2 * len);
    for (std::size_t i = 0; i < len; ++i) {
        auto b = static_cast<unsigned char>(data[i]);
        out += kHex[b >> 4];
        out += kHex[b & 15];
    }
    return out;
}

// A message id must be non-empty UTF-8 of at most kMaxMessageIdBytes.
bool usable_id(std::string_view id) {
    return !id.empty() && id.size() <= kMaxMessageIdBytes && valid_utf8(id.data(), id.size());
}

// The last header `name` whose value is a usable message id.
std::optional<std::string_view> id_candidate(const Record& r, std::string_view name) {
    std::optional<std::string_view> found;
    for (std::size_t i = 0; i < r.n_headers; ++i) {
        const KafkaHeader& h = r.headers[i];
        if (h.name != name || h.value == nullptr) continue;
        std::string_view value(h.value, h.value_len);
        if (usable_id(value)) found = value;
    }
    return found;
}

constexpr std::size_t kLinearHeaders = 16;

std::vector<HeaderField> header_fields(const Record& r) {
    std::vector<HeaderField> fields;
    fields.reserve(r.n_headers);
    std::unordered_map<std::string, std::size_t> index;
    for (std::size_t i = 0; i < r.n_headers; ++i) {
        const KafkaHeader& h = r.headers[i];
        std::string name = header_string(h.name.data(), h.name.size());
        std::optional<std::string> value;
        if (h.value != nullptr) value = header_string(h.value, h.value_len);
        // A record may carry thousands of headers: names are looked up through a hash index
        // beyond a few.
        std::size_t same = fields.size();
        if (r.n_headers <= kLinearHeaders) {
            for (std::size_t k = 0; k < fields.size() && same == fields.size(); ++k)
                if (fields[k].name == name) same = k;
        } else {
            auto [it, added] = index.try_emplace(name, fields.size());
            if (!added) same = it->second;
        }
        if (same < fields.size()) fields[same].value = std::move(value);
        else fields.push_back(HeaderField{std::move(name), std::move(value)});
    }
    return fields;
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
    out.headers = header_fields(r);

    // The value: JSON that jsonb accepts, or raw bytes with a note. Whether numeric can hold
    // every number is left to jsonb_in, whose refusal the ingest worker also records this way.
    std::optional<std::string_view> id_header = id_candidate(r, "message_id");
    std::optional<std::string_view> ce_id = id_candidate(r, "ce_id");
    std::optional<std::string_view> type_header = header_text(r, "event_type");
    std::optional<std::string_view> ce_type = header_text(r, "ce_type");
    JsonScan scan;
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
    } else {
        std::vector<std::string_view> fields;
        if (!options.message_id_field.empty()) fields.push_back(options.message_id_field);
        fields.push_back("type");
        out.payload.text.reserve(r.value_len + 16);
        scan = scan_json(std::string_view(r.value, r.value_len), fields, &out.payload);
        out.parsable = scan.valid;
        if (!scan.valid) {
            out.raw_len = r.value_len;
            out.note = "value is not valid JSON: " + scan.error;
        }
    }
    std::optional<std::string> id_field, type_field;
    if (scan.valid) {
        if (!options.message_id_field.empty()) id_field = scan.fields[0];
        type_field = scan.fields.back();
    }

    // Message id: header message_id, CloudEvents ce_id, the configured field, else transport.
    std::optional<std::string> id;
    if (id_header) id = std::string(*id_header);
    else if (ce_id) id = std::string(*ce_id);
    else if (id_field && usable_id(*id_field)) id = std::move(id_field);
    if (id) {
        out.message_id = std::move(*id);
    } else {
        out.transport_id = true;
        out.message_id = std::string(r.topic) + "/" + std::to_string(r.partition) + "/" +
                         std::to_string(r.offset);
    }

    // Event type: header event_type, CloudEvents ce_type, JSON field "type", else none.
    if (type_header) out.event_type = std::string(*type_header);
    else if (ce_type) out.event_type = std::string(*ce_type);
    else out.event_type = std::move(type_field);
    if (out.event_type && out.event_type->empty()) out.event_type.reset();
    return out;
}

std::string headers_json(const Classified& c) {
    nlohmann::json object = nlohmann::json::object();
    for (const HeaderField& f : c.headers)
        object[f.name] = f.value ? nlohmann::json(*f.value) : nlohmann::json(nullptr);
    return object.dump();
}

}  // namespace eventbox::inbox
