// What an HTTP destination's bulk requests and signatures are made of: the body of a request
// carrying several messages in one of the batch formats, the request's idempotency key derived
// from its messages, the settling of each message from the response's per-record results, and
// the Standard Webhooks signature. The contracts are those of docs/guide/http.md ("Bulk
// requests", "Signed requests"). Pure C++.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace eventbox::http {

// How the messages of a bulk request are written (batch_format).
enum class BatchFormat {
    kJsonArray,           // 'json_array': [record, ...]
    kNdjson,              // 'ndjson': one record a line
    kSobjectCollections,  // 'sobject_collections': {"allOrNone": false, "records": [payload, ...]}
};

// The format named `name`; false when there is none of that name.
bool parse_batch_format(std::string_view name, BatchFormat* format);
// Content-Type of a bulk request's body.
const char* bulk_content_type(BatchFormat format);

// One message of a bulk request.
struct BulkRecord {
    std::string message_id;
    std::string key;
    bool has_key = false;
    std::string payload;
    bool has_payload = false;
    bool json = false;  // payload is JSON (written as a value; else base64)
    std::vector<std::pair<std::string, std::string>> headers;
};

// Whether `format` can carry `record` (sObject Collections: a JSON object payload only).
bool bulk_accepts(BatchFormat format, const BulkRecord& record);
// The request body for `records` (in their order) of `topic`.
std::string bulk_body(BatchFormat format, std::string_view topic,
                      const std::vector<const BulkRecord*>& records);
// The Idempotency-Key of a bulk request: UUID-shaped text of the SHA-256 of its message ids in
// order. The same messages give the same key; each message keeps its own id inside.
std::string bulk_idempotency_key(const std::vector<std::string_view>& message_ids);

// What the response says of one record.
enum class Settled { kDelivered, kTransient, kPermanent };
struct RecordResult {
    Settled settled = Settled::kDelivered;
    std::string error;  // for last_error, when not delivered
};

// Largest response body read for per-record results; a longer one is unreadable.
inline constexpr std::size_t kMaxBulkResponse = 8u << 20;

// Settles each of `message_ids` (the request's records, in request order) from a 2xx response
// `status` with `content_type` and `body` (`truncated`: longer than kMaxBulkResponse).
// Per-record results are expected from a 207, from sObject Collections, or when the body is a
// JSON array; for ndjson, also as NDJSON (one JSON object a line) when the Content-Type says so
// or the body is NDJSON. They map by "id" (a message id) or else by position. Results that
// cannot be read or mapped leave the records concerned transient (retried, never taken as
// delivered).
std::vector<RecordResult> settle_bulk(BatchFormat format, int status, std::string_view content_type,
                                      std::string_view body, bool truncated,
                                      const std::vector<std::string_view>& message_ids);

// The key bytes of a Standard Webhooks secret "whsec_<base64>"; false when malformed.
bool decode_webhook_secret(std::string_view secret, std::string* key);
// The webhook-signature header's value: "v1,<base64 HMAC-SHA256 of id.timestamp.body>" for each
// key, separated by a space.
std::string webhook_signature(const std::vector<std::string>& keys, std::string_view id,
                              int64_t timestamp, std::string_view body);
}  // namespace eventbox::http
