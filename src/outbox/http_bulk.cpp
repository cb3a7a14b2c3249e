// Bulk requests and signatures of HTTP destinations (see outbox/http_bulk.hpp).
#include "outbox/http_bulk.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/base64.hpp"
#include "messages/json_write.hpp"
#include "messages/message_rules.hpp"
#include "outbox/http_client.hpp"

namespace eventbox::http {

namespace {

using messages::append_json_string;
using nlohmann::json;

// One record of json_array / ndjson.
void append_record(std::string& out, std::string_view topic, const BulkRecord& r) {
    out += "{\"id\":";
    append_json_string(out, r.message_id);
    out += ",\"topic\":";
    append_json_string(out, topic);
    if (!r.has_key) {
        out += ",\"key\":null";
    } else if (is_utf8(r.key)) {
        out += ",\"key\":";
        append_json_string(out, r.key);
    } else {
        out += ",\"key_base64\":";
        append_json_string(out, eventbox::base64(r.key));
    }
    out += ",\"headers\":{";
    for (std::size_t i = 0; i < r.headers.size(); ++i) {
        if (i) out.push_back(',');
        append_json_string(out, r.headers[i].first);
        out.push_back(':');
        append_json_string(out, r.headers[i].second);
    }
    out += "}";
    if (!r.has_payload) {
        out += ",\"payload\":null";
    } else if (r.json) {
        out += ",\"payload\":";
        out += r.payload;
    } else {
        out += ",\"payload_base64\":";
        append_json_string(out, eventbox::base64(r.payload));
    }
    out.push_back('}');
}

std::string excerpt(const json& value) {
    return printable(value.dump(-1, ' ', false, json::error_handler_t::replace), kBodyExcerpt);
}

// What one per-record result entry says.
RecordResult read_entry(const json& entry, int status) {
    std::string prefix = "HTTP " + std::to_string(status) + ", record: ";
    if (!entry.is_object())
        return {Settled::kTransient, prefix + "unreadable result " + excerpt(entry)};
    auto failure = [&](Settled how) {
        json detail = json::object();
        for (const char* field : {"status", "errors", "error", "message"}) {
            auto it = entry.find(field);
            if (it != entry.end() && !it->is_null()) detail[field] = *it;
        }
        return RecordResult{how, prefix + excerpt(detail)};
    };
    auto s = entry.find("status");
    bool has_status = s != entry.end() && s->is_number_integer();
    auto ok = entry.find("success");
    if (ok != entry.end() && ok->is_boolean()) {
        if (ok->get<bool>()) return {Settled::kDelivered, {}};
        if (has_status && classify(s->get<int>()) == Verdict::kTransient)
            return failure(Settled::kTransient);
        return failure(Settled::kPermanent);
    }
    if (has_status) {
        switch (classify(s->get<int>())) {
            case Verdict::kDelivered:
                return {Settled::kDelivered, {}};
            case Verdict::kTransient:
                return failure(Settled::kTransient);
            case Verdict::kPermanent:
                return failure(Settled::kPermanent);
        }
    }
    for (const char* field : {"error", "errors"}) {
        auto it = entry.find(field);
        if (it == entry.end() || it->is_null() || it->is_boolean() ||
            ((it->is_array() || it->is_object() || it->is_string()) && it->empty()))
            continue;
        return failure(Settled::kPermanent);
    }
    return {Settled::kDelivered, {}};
}

std::vector<RecordResult> all(std::size_t n, Settled how, const std::string& error) {
    return std::vector<RecordResult>(n, RecordResult{how, error});
}

// Where a response's per-record results are: none (every record delivered), a JSON array, or
// NDJSON lines.
enum class Shape { kNone, kArray, kLines };

bool is_space(char c) {
    return std::isspace(static_cast<unsigned char>(c)) != 0;
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
    return s;
}

// The non-empty lines of `body`, blanks (and a CR before the LF) trimmed.
std::vector<std::string_view> lines_of(std::string_view body) {
    std::vector<std::string_view> out;
    while (!body.empty()) {
        std::size_t nl = body.find('\n');
        std::string_view line = trim(body.substr(0, nl));
        if (!line.empty()) out.push_back(line);
        if (nl == std::string_view::npos) break;
        body.remove_prefix(nl + 1);
    }
    return out;
}

// Whether a Content-Type names NDJSON: application/x-ndjson, application/ndjson or
// application/jsonl, in any case, with any parameters.
bool is_ndjson_type(std::string_view content_type) {
    std::string type(trim(content_type.substr(0, content_type.find(';'))));
    std::transform(type.begin(), type.end(), type.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return type == "application/x-ndjson" || type == "application/ndjson" ||
           type == "application/jsonl";
}

// Whether an ndjson destination's response without an NDJSON Content-Type is NDJSON results:
// its first line is a JSON object, and a 207, or more lines follow, or the request carried one
// message, or the object's "id" names a message of the request. A single object otherwise
// (such as {"ok": true}) is a summary, not one result for several records.
bool looks_like_ndjson(int status, const std::vector<std::string_view>& lines,
                       const std::vector<std::string_view>& message_ids) {
    if (lines.empty() || lines.front().front() != '{') return false;
    if (status == 207) return true;
    json first = json::parse(lines.front().begin(), lines.front().end(), nullptr, false);
    if (first.is_discarded() || !first.is_object()) return false;
    if (lines.size() > 1 || message_ids.size() == 1) return true;
    auto id = first.find("id");
    return id != first.end() && id->is_string() &&
           std::find(message_ids.begin(), message_ids.end(), id->get_ref<const std::string&>()) !=
               message_ids.end();
}

Shape results_shape(BatchFormat format, int status, std::string_view content_type,
                    std::string_view body, const std::vector<std::string_view>& message_ids) {
    std::string_view text = trim(body);
    if (format == BatchFormat::kNdjson && !text.empty()) {
        if (is_ndjson_type(content_type)) return Shape::kLines;
        if (text.front() == '{' && looks_like_ndjson(status, lines_of(text), message_ids))
            return Shape::kLines;
    }
    if (status == 207 || format == BatchFormat::kSobjectCollections ||
        (!text.empty() && text.front() == '['))
        return Shape::kArray;
    return Shape::kNone;
}

// NDJSON results as the array of their lines' objects; a line that is not a JSON object makes
// them unreadable (`*unreadable` names it).
json read_lines(std::string_view body, std::string* unreadable) {
    json results = json::array();
    std::size_t number = 0;
    for (std::string_view line : lines_of(body)) {
        ++number;
        json entry = json::parse(line.begin(), line.end(), nullptr, false);
        if (entry.is_discarded() || !entry.is_object()) {
            *unreadable = "line " + std::to_string(number) +
                          " is not a JSON object: " + printable(line, kBodyExcerpt);
            return json();
        }
        results.push_back(std::move(entry));
    }
    return results;
}

// Settles each message from `results`: by message id when entries name the request's messages
// (not sObject Collections: its "id" is the record's id in the CRM), else by position.
std::vector<RecordResult> map_results(BatchFormat format, int status, const json& results,
                                      std::string_view body,
                                      const std::vector<std::string_view>& message_ids) {
    const std::size_t n = message_ids.size();
    std::string prefix = "HTTP " + std::to_string(status) + ": ";
    if (format != BatchFormat::kSobjectCollections) {
        std::unordered_map<std::string_view, std::size_t> position;
        for (std::size_t i = 0; i < n; ++i) position.emplace(message_ids[i], i);
        std::vector<const json*> by_id(n, nullptr);
        bool any = false;
        for (const json& entry : results) {
            if (!entry.is_object()) continue;
            auto id = entry.find("id");
            if (id == entry.end() || !id->is_string()) continue;
            auto p = position.find(id->get_ref<const std::string&>());
            if (p == position.end()) continue;
            by_id[p->second] = &entry;
            any = true;
        }
        if (any) {
            std::vector<RecordResult> out;
            out.reserve(n);
            for (std::size_t i = 0; i < n; ++i)
                out.push_back(by_id[i] != nullptr
                                  ? read_entry(*by_id[i], status)
                                  : RecordResult{Settled::kTransient,
                                                 prefix + "no per-record result for this message"});
            return out;
        }
    }
    if (results.size() != n)
        return all(n, Settled::kTransient,
                   prefix + std::to_string(results.size()) + " per-record results for " +
                       std::to_string(n) + " records: " + printable(body, kBodyExcerpt));
    std::vector<RecordResult> out;
    out.reserve(n);
    for (const json& entry : results) out.push_back(read_entry(entry, status));
    return out;
}

}  // namespace

bool parse_batch_format(std::string_view name, BatchFormat* format) {
    if (name == "json_array")
        *format = BatchFormat::kJsonArray;
    else if (name == "ndjson")
        *format = BatchFormat::kNdjson;
    else if (name == "sobject_collections")
        *format = BatchFormat::kSobjectCollections;
    else
        return false;
    return true;
}

const char* bulk_content_type(BatchFormat format) {
    return format == BatchFormat::kNdjson ? "application/x-ndjson" : "application/json";
}

bool bulk_accepts(BatchFormat format, const BulkRecord& record) {
    if (format != BatchFormat::kSobjectCollections) return true;
    if (!record.has_payload || !record.json) return false;
    auto first = std::find_if(record.payload.begin(), record.payload.end(),
                              [](char c) { return !std::isspace(static_cast<unsigned char>(c)); });
    return first != record.payload.end() && *first == '{';
}

std::string bulk_body(BatchFormat format, std::string_view topic,
                      const std::vector<const BulkRecord*>& records) {
    std::string out;
    std::size_t size = 64;
    for (const BulkRecord* r : records) size += r->payload.size() + r->message_id.size() + 96;
    out.reserve(size);
    switch (format) {
        case BatchFormat::kJsonArray:
            out.push_back('[');
            for (std::size_t i = 0; i < records.size(); ++i) {
                if (i) out.push_back(',');
                append_record(out, topic, *records[i]);
            }
            out.push_back(']');
            break;
        case BatchFormat::kNdjson:
            for (const BulkRecord* r : records) {
                append_record(out, topic, *r);
                out.push_back('\n');
            }
            break;
        case BatchFormat::kSobjectCollections:
            out += "{\"allOrNone\":false,\"records\":[";
            for (std::size_t i = 0; i < records.size(); ++i) {
                if (i) out.push_back(',');
                out += records[i]->payload;
            }
            out += "]}";
            break;
    }
    return out;
}

std::string bulk_idempotency_key(const std::vector<std::string_view>& message_ids) {
    std::string ids;
    for (std::string_view id : message_ids) {
        ids.append(id);
        ids.push_back(',');
    }
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int digest_len = 0;
    EVP_Digest(ids.data(), ids.size(), digest, &digest_len, EVP_sha256(), nullptr);
    // Shaped as a UUID of version 8 (custom), variant 10.
    digest[6] = static_cast<unsigned char>((digest[6] & 0x0F) | 0x80);
    digest[8] = static_cast<unsigned char>((digest[8] & 0x3F) | 0x80);
    static const char hex[] = "0123456789abcdef";
    std::string out;
    for (int i = 0; i < 16; ++i) {
        if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
        out.push_back(hex[digest[i] >> 4]);
        out.push_back(hex[digest[i] & 15]);
    }
    return out;
}

std::vector<RecordResult> settle_bulk(BatchFormat format, int status, std::string_view content_type,
                                      std::string_view body, bool truncated,
                                      const std::vector<std::string_view>& message_ids) {
    const std::size_t n = message_ids.size();
    Shape shape = results_shape(format, status, content_type, body, message_ids);
    if (shape == Shape::kNone) return all(n, Settled::kDelivered, {});
    std::string prefix = "HTTP " + std::to_string(status) + ": ";
    if (truncated)
        return all(n, Settled::kTransient,
                   prefix + "per-record results longer than the relay reads");
    json results;
    std::string unreadable;
    if (shape == Shape::kLines) {
        results = read_lines(body, &unreadable);
    } else {
        results = json::parse(body.begin(), body.end(), nullptr, false);
        if (results.is_discarded() || !results.is_array())
            unreadable = printable(body, kBodyExcerpt);
    }
    if (!unreadable.empty())
        return all(n, Settled::kTransient, prefix + "unreadable per-record results: " + unreadable);
    return map_results(format, status, results, body, message_ids);
}

bool decode_webhook_secret(std::string_view secret, std::string* key) {
    constexpr std::string_view kPrefix = "whsec_";
    if (secret.substr(0, kPrefix.size()) != kPrefix) return false;
    std::string_view text = secret.substr(kPrefix.size());
    if (text.empty() || text.size() % 4 != 0 || text.size() > 1024) return false;
    std::string out;
    if (!decode_base64(text, &out)) return false;
    if (out.empty()) return false;
    *key = std::move(out);
    return true;
}

std::string webhook_signature(const std::vector<std::string>& keys, std::string_view id,
                              int64_t timestamp, std::string_view body) {
    std::string content;
    content.reserve(id.size() + body.size() + 24);
    content.append(id);
    content.push_back('.');
    content += std::to_string(timestamp);
    content.push_back('.');
    content.append(body);
    std::string out;
    for (const std::string& key : keys) {
        unsigned char mac[EVP_MAX_MD_SIZE];
        unsigned int mac_len = 0;
        HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
             reinterpret_cast<const unsigned char*>(content.data()), content.size(), mac, &mac_len);
        if (!out.empty()) out.push_back(' ');
        out += "v1,";
        out += eventbox::base64(std::string_view(reinterpret_cast<const char*>(mac), mac_len));
    }
    return out;
}

}  // namespace eventbox::http
