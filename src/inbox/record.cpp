// Classification of Kafka records for the inbox (see inbox/record.hpp).
#include "inbox/record.hpp"

#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>
#include <unordered_map>

#include "inbox/cdc.hpp"
#include "inbox/fingerprint.hpp"
#include "messages/json_scan.hpp"
#include "registry/json_text.hpp"
#include "registry/registry.hpp"

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
void header_string(const char* data, std::size_t len, std::string* out) {
    if (valid_utf8(data, len)) {
        out->assign(data, len);
        return;
    }
    static constexpr char kHex[] = "0123456789abcdef";
    out->assign("\\x");
    for (std::size_t i = 0; i < len; ++i) {
        auto b = static_cast<unsigned char>(data[i]);
        out->push_back(kHex[b >> 4]);
        out->push_back(kHex[b & 15]);
    }
}

void set(std::optional<std::string>& target, std::string_view value) {
    if (!target) target.emplace();
    target->assign(value);
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

// The id of a record under message_id_rule 'fingerprint'; false for a record without value
// bytes (a tombstone or an empty value), which has nothing to fingerprint.
bool fingerprint_id(const Record& r, std::string* id) {
    if (r.value == nullptr || r.value_len == 0) return false;
    static std::string scratch;  // the canonical text, kept between records
    *id = fingerprint(std::string_view(r.value, r.value_len), &scratch);
    if (scratch.capacity() > kKeptBufferBytes) std::string().swap(scratch);
    return true;
}

// The headers object's members into `fields`, reusing the strings it holds.
void header_fields(const Record& r, std::vector<HeaderField>& fields) {
    std::size_t count = 0;
    std::unordered_map<std::string, std::size_t> index;
    for (std::size_t i = 0; i < r.n_headers; ++i) {
        const KafkaHeader& h = r.headers[i];
        if (count == fields.size()) fields.emplace_back();
        HeaderField& f = fields[count];
        header_string(h.name.data(), h.name.size(), &f.name);
        if (h.value == nullptr) {
            f.value.reset();
        } else {
            if (!f.value) f.value.emplace();
            header_string(h.value, h.value_len, &*f.value);
        }
        // A record may carry thousands of headers: names are looked up through a hash index
        // beyond a few.
        std::size_t same = count;
        if (r.n_headers <= kLinearHeaders) {
            for (std::size_t k = 0; k < count && same == count; ++k)
                if (fields[k].name == f.name) same = k;
        } else {
            auto [it, added] = index.try_emplace(f.name, count);
            if (!added) same = it->second;
        }
        if (same < count)
            fields[same].value.swap(f.value);
        else
            ++count;
    }
    fields.resize(count);
}

}  // namespace

bool valid_utf8(const char* data, std::size_t len) {
    const auto* s = reinterpret_cast<const unsigned char*>(data);
    std::size_t i = 0;
    while (i < len) {
        // Eight bytes at a time while they are ASCII without NUL (most payloads, all of their
        // JSON structure): a quarter of the byte-wise loop's time at 1 KiB.
        while (len - i >= 8) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            constexpr uint64_t kHigh = 0x8080808080808080ull, kOnes = 0x0101010101010101ull;
            if ((w & kHigh) != 0 || ((w - kOnes) & ~w & kHigh) != 0) break;
            i += 8;
        }
        if (i >= len) break;
        unsigned char c = s[i];
        if (c < 0x80) {
            if (c == 0) return false;  // PostgreSQL text cannot hold NUL
            ++i;
            continue;
        }
        std::size_t n;
        uint32_t cp;
        if ((c & 0xE0) == 0xC0)
            n = 1, cp = c & 0x1F;
        else if ((c & 0xF0) == 0xE0)
            n = 2, cp = c & 0x0F;
        else if ((c & 0xF8) == 0xF0)
            n = 3, cp = c & 0x07;
        else
            return false;
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
    classify(r, options, out);
    return out;
}

namespace {

// Clears `out` for the next record. Kept buffers are for the usual record: those a large one
// grew are given back.
void reset(Classified& out) {
    out.transport_id = false;
    out.skip = false;
    out.skipped.clear();
    out.parsable = false;
    out.raw_len = 0;
    out.raw_null = false;
    out.note.clear();
    if (out.payload.text.capacity() > kKeptBufferBytes) std::string().swap(out.payload.text);
    out.decoded.clear();
    out.schema_name.clear();
    out.pending = false;
    out.pending_id = 0;
    out.keep_raw = false;
    out.key_decoded.clear();
    out.key_decoded_ok = false;
    if (out.decoded.capacity() > kKeptBufferBytes) std::string().swap(out.decoded);
    if (out.payload.tokens.capacity() * sizeof(JsonTokens::Token) > kKeptBufferBytes)
        std::vector<JsonTokens::Token>().swap(out.payload.tokens);
    out.payload.tokens.clear();
    out.payload.text.clear();
    out.payload.depth = 0;
    if (out.headers.capacity() * sizeof(HeaderField) > kKeptBufferBytes)
        std::vector<HeaderField>().swap(out.headers);
}

// The top-level fields the value's scan reads: the message id field (if any) and "type".
std::vector<std::string_view> wanted_fields(const Options& options) {
    std::string_view fields[2] = {options.message_id_field, "type"};
    return std::vector<std::string_view>(fields + (options.message_id_field.empty() ? 1 : 0),
                                         fields + 2);
}

// A value decoded into the payload's tokens: the scan's fields read from them; its JSON text
// written only for the CDC rules, which read the envelope from text (the payload's jsonb is
// built from the tokens, or from text written then where jsonb_in must build it: inbox/jsonb.hpp).
JsonScan decoded_tokens(const Options& options, Classified& out) {
    JsonScan scan;
    scan.valid = true;
    scan.fields = registry::top_fields(out.payload, wanted_fields(options));
    out.parsable = true;
    if (options.id_rule == IdRule::kDebezium || options.id_rule == IdRule::kCockroachDb)
        registry::append_tokens_json(out.payload, &out.decoded);
    return scan;
}

// A value in the Schema Registry's wire format, its bytes kept in raw_payload; a record whose
// schema is not cached yet is pending. Avro is decoded straight into the payload's tokens (no
// text written and scanned again), the others into JSON text scanned like a JSON value.
JsonScan classify_registry(const Record& r, const Options& options, Classified& out) {
    JsonScan scan;
    out.keep_raw = true;
    out.raw_len = r.value_len;
    registry::Decoded d =
        options.registry->decode(r.value, r.value_len, &out.decoded, &out.payload);
    if (d.status == registry::Decoded::kPending) {
        out.pending = true;
        out.pending_id = d.id;
        return scan;
    }
    if (d.status == registry::Decoded::kBad) {
        out.payload.tokens.clear();  // a part of the value
        out.payload.text.clear();
        out.payload.depth = 0;
        out.note = d.reason;
        return scan;
    }
    if (d.name != nullptr) out.schema_name = *d.name;
    if (d.tokens) return decoded_tokens(options, out);
    if (!d.utf8 && !valid_utf8(out.decoded.data(), out.decoded.size())) {
        out.note = "schema id " + std::to_string(d.id) + ": decoded value is not valid UTF-8";
        return scan;
    }
    out.payload.text.reserve(out.decoded.size() + 16);
    scan = scan_json(out.decoded, wanted_fields(options), &out.payload);
    out.parsable = scan.valid;
    if (!scan.valid)
        out.note = "schema id " + std::to_string(d.id) +
                   ": decoded value is not valid JSON: " + scan.error;
    return scan;
}

// key_format 'registry': the key decoded into key_decoded. A key that cannot be decoded makes
// the record unparsable (its value's bytes kept, the reason in the note); no key, or an empty
// one, has no key_payload.
void classify_key(const Record& r, const Options& options, Classified& out) {
    if (r.key == nullptr || r.key_len == 0) return;
    registry::Decoded d = options.registry->decode(r.key, r.key_len, &out.key_decoded);
    if (d.status == registry::Decoded::kPending) {
        out.pending = true;
        out.pending_id = d.id;
        return;
    }
    std::string why = d.reason;
    if (d.status == registry::Decoded::kOk && !d.utf8 &&
        !valid_utf8(out.key_decoded.data(), out.key_decoded.size()))
        why = "schema id " + std::to_string(d.id) + ": decoded key is not valid UTF-8";
    if (d.status == registry::Decoded::kOk && why.empty()) {
        out.key_decoded_ok = true;
        return;
    }
    if (out.parsable) {
        out.parsable = false;
        out.payload.tokens.clear();
        out.payload.text.clear();
        out.raw_len = std::min(r.value_len, options.max_message_bytes);
    }
    out.note = out.note.empty() ? "key: " + why : "key: " + why + "; " + out.note;
}

// The value: JSON that jsonb accepts, or raw bytes with a note. Whether numeric can hold every
// number is left to jsonb_in, whose refusal the ingest worker also records this way. Returns the
// scan, whose fields are the configured message id field (if any) and "type" when it is valid.
JsonScan classify_value(const Record& r, const Options& options, Classified& out) {
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
    } else if (options.registry_values) {
        return classify_registry(r, options, out);
    } else if (!valid_utf8(r.value, r.value_len)) {
        out.raw_len = r.value_len;
        out.note = "value is not valid UTF-8";
    } else {
        out.payload.text.reserve(r.value_len + 16);
        scan =
            scan_json(std::string_view(r.value, r.value_len), wanted_fields(options), &out.payload);
        out.parsable = scan.valid;
        if (!scan.valid) {
            out.raw_len = r.value_len;
            out.note = "value is not valid JSON: " + scan.error;
        }
    }
    return scan;
}

// The record's transport identity as its message id: topic/partition/offset.
void transport_id(const Record& r, Classified& out) {
    out.transport_id = true;
    out.message_id.assign(r.topic);
    out.message_id += "/" + std::to_string(r.partition) + "/" + std::to_string(r.offset);
}

// The change event a CDC rule reads from the record (Kind::kOther under the other rules). A
// registry-format value is read as decoded (the envelope is the record: Avro, Protobuf or JSON
// Schema), a registry-format key likewise (the row's identity is the key's content, not its
// schema id).
ChangeEvent change_event(const Record& r, const Options& options, const Classified& c) {
    if (options.id_rule != IdRule::kDebezium && options.id_rule != IdRule::kCockroachDb)
        return ChangeEvent{};
    ChangeRecord change{r.topic, r.key, r.key_len, r.value, r.value_len};
    if (options.registry_values && r.value != nullptr) {
        change.value = c.decoded.data();
        change.value_len = c.decoded.size();
    }
    if (options.registry_keys && c.key_decoded_ok) {
        change.key = c.key_decoded.data();
        change.key_len = c.key_decoded.size();
    }
    return options.id_rule == IdRule::kDebezium ? debezium_event(change)
                                                : cockroachdb_event(change);
}

// The id the subscription's rule reads from the record's content, whatever its headers say:
// its fingerprint, or the change event's position. False when the rule has none for it.
bool content_id(const Record& r, const Options& options, const ChangeEvent& change,
                std::string* id) {
    if (options.id_rule == IdRule::kFingerprint) return fingerprint_id(r, id);
    if (change.kind != ChangeEvent::Kind::kEvent) return false;
    id->assign(change.message_id);
    return true;
}

// Headers the client could not read: the record's identity and type are unknown. It is kept as
// unparsable (no handler can take it by a type it may not have), with the value's bytes and a
// note, under its transport identity: never silently routed or deduplicated as if it had no
// headers.
void classify_unreadable(const Record& r, const Options& options, const ChangeEvent& change,
                         Classified& out) {
    if (out.parsable) {
        out.parsable = false;
        out.payload.tokens.clear();
        out.payload.text.clear();
        out.raw_len = std::min(r.value_len, options.max_message_bytes);
    }
    // Under message_id_rule 'fingerprint' and the CDC rules the id does not depend on the headers.
    bool by_content = content_id(r, options, change, &out.message_id);
    std::string why = "headers could not be read (" + std::string(r.headers_error) +
                      (by_content ? "): event_type unknown"
                                  : "): message_id and event_type unknown; stored by its "
                                    "transport id");
    out.note = out.note.empty() ? why : why + "; " + out.note;
    if (!by_content) transport_id(r, out);
    out.event_type.reset();
}

// Message id: the fingerprint under message_id_rule 'fingerprint' (the value's own; headers and
// fields do not count), the change event's position under the CDC rules; else header
// message_id, CloudEvents ce_id, the configured field; else the transport identity.
void choose_message_id(const Record& r, const Options& options, const JsonScan& scan,
                       const ChangeEvent& change, Classified& out) {
    std::optional<std::string_view> id_header = id_candidate(r, "message_id");
    std::optional<std::string_view> ce_id = id_candidate(r, "ce_id");
    const std::optional<std::string>* id_field =
        scan.valid && !options.message_id_field.empty() ? &scan.fields[0] : nullptr;
    if (content_id(r, options, change, &out.message_id)) {
        // out.message_id holds the fingerprint or the change's position
    } else if (id_header) {
        out.message_id.assign(*id_header);
    } else if (ce_id) {
        out.message_id.assign(*ce_id);
    } else if (id_field && *id_field && usable_id(**id_field)) {
        out.message_id.assign(**id_field);
    } else {
        transport_id(r, out);
    }
}

// Event type: a change event's operation; else header event_type, CloudEvents ce_type, JSON
// field "type" (registry formats: the schema's full name), else none.
void choose_event_type(const Record& r, const Options& options, const JsonScan& scan,
                       const ChangeEvent& change, Classified& out) {
    if (change.kind == ChangeEvent::Kind::kEvent) {
        set(out.event_type, change.event_type);
        return;
    }
    std::optional<std::string_view> type_header = header_text(r, "event_type");
    std::optional<std::string_view> ce_type = header_text(r, "ce_type");
    const std::optional<std::string>* type_field = scan.valid ? &scan.fields.back() : nullptr;
    if (type_header)
        set(out.event_type, *type_header);
    else if (ce_type)
        set(out.event_type, *ce_type);
    else if (options.registry_values && !out.schema_name.empty())
        set(out.event_type, out.schema_name);
    else if (!options.registry_values && type_field && *type_field)
        set(out.event_type, **type_field);
    else
        out.event_type.reset();
    if (out.event_type && out.event_type->empty()) out.event_type.reset();
}

}  // namespace

void classify(const Record& r, const Options& options, Classified& out) {
    reset(out);
    header_fields(r, out.headers);
    JsonScan scan = classify_value(r, options, out);
    if (!out.pending && options.registry_keys) classify_key(r, options, out);
    if (out.pending) return;  // read again once its schema is cached
    // A change event is read only from a value jsonb accepts (or a tombstone): one that is not
    // JSON gets the default rule, and is stored unparsable with its bytes.
    ChangeEvent change =
        out.parsable || r.value == nullptr ? change_event(r, options, out) : ChangeEvent{};
    if (change.kind == ChangeEvent::Kind::kSkip) {
        out.skip = true;
        out.skipped = change.skipped;
        return;
    }
    if (r.headers_unreadable) {
        classify_unreadable(r, options, change, out);
        return;
    }
    choose_message_id(r, options, scan, change, out);
    choose_event_type(r, options, scan, change, out);
}

IdRule id_rule_named(std::string_view name) {
    if (name == "fingerprint") return IdRule::kFingerprint;
    if (name == "debezium") return IdRule::kDebezium;
    if (name == "cockroachdb") return IdRule::kCockroachDb;
    return IdRule::kDefault;
}

bool keeps_raw(const RawNeeds& needs) {
    return needs.keep_raw || needs.dead_letter_topic || !needs.json_values;
}

std::string headers_json(const Classified& c) {
    nlohmann::json object = nlohmann::json::object();
    for (const HeaderField& f : c.headers)
        object[f.name] = f.value ? nlohmann::json(*f.value) : nlohmann::json(nullptr);
    return object.dump();
}

}  // namespace eventbox::inbox
