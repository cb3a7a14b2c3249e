// What the ingest worker stores for one Kafka record: the message id and event type
// (docs/design/guarantees.md), the headers as a JSON object, and whether the value can be kept
// as jsonb or goes to raw_payload as 'unparsable' (docs/reference/bad-input.md). Pure C++.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "messages/json_scan.hpp"

namespace eventbox::registry {
class Registry;
}

namespace eventbox::inbox {

struct KafkaHeader {
    std::string_view name;
    const char* value = nullptr;  // nullptr: null header value
    std::size_t value_len = 0;
};

struct Record {
    std::string_view topic;
    int32_t partition = 0;
    int64_t offset = 0;
    const char* value = nullptr;  // nullptr: null value (tombstone)
    std::size_t value_len = 0;
    const char* key = nullptr;  // nullptr: no key
    std::size_t key_len = 0;
    const KafkaHeader* headers = nullptr;
    std::size_t n_headers = 0;
    // The client could not parse the record's headers (e.g. librdkafka with very many of
    // them): none are known, so neither its message_id nor its event type.
    bool headers_unreadable = false;
    std::string_view headers_error;  // the client's reason, when unreadable
};

// A subscription's message_id_rule. 'fingerprint': the id is the SHA-256 of the value in
// canonical JSON (raw bytes when it is not JSON), whatever the headers and fields say (see
// inbox/fingerprint.hpp). 'debezium', 'cockroachdb': the change event's position (see
// inbox/cdc.hpp), with its operation as the event type; records that are not change events of
// that source get the default rule.
enum class IdRule { kDefault, kFingerprint, kDebezium, kCockroachDb };

// The rule named `name` (as in eventbox.subscriptions.message_id_rule); kDefault if unknown.
IdRule id_rule_named(std::string_view name);

struct Options {
    std::string message_id_field;  // top-level JSON field used as message id; empty: none
    std::size_t max_message_bytes = 1000000;
    IdRule id_rule = IdRule::kDefault;
    // Every record's value bytes go to raw_payload, JSON ones too (see keeps_raw()).
    bool keep_raw = false;
    // value_format / key_format 'registry': values / keys are in the Schema Registry's wire
    // format, decoded through `registry` (the ingest worker's; docs/guide/formats.md).
    registry::Registry* registry = nullptr;
    bool registry_values = false;
    bool registry_keys = false;
};

// What decides whether a subscription keeps the value bytes of every record in raw_payload.
struct RawNeeds {
    bool keep_raw = false;           // the subscription option keep_raw
    bool dead_letter_topic = false;  // dead letters carry the producer's bytes
    bool json_values = true;         // values are JSON text (value_format 'json')
};

// Whether the bytes are kept: when asked for, when a dead-letter topic needs them, and when the
// stored payload is not the value's own text. The one place that decides it.
bool keeps_raw(const RawNeeds& needs);

// Message ids longer than this fall back to the transport identity (the primary key index has a
// size limit, and an id this long is not an id).
inline constexpr std::size_t kMaxMessageIdBytes = 256;

// One member of the headers object: a header name and its value as JSON strings (bytes that
// are not UTF-8, or hold NUL, written as "\\x<hex>"); no value: JSON null.
struct HeaderField {
    std::string name;
    std::optional<std::string> value;
};

struct Classified {
    std::string message_id;
    bool transport_id = false;  // message id is topic/partition/offset
    std::optional<std::string> event_type;
    // The headers object's members, each name once (a repeated name keeps its last value), in
    // order of first appearance. The ingest worker builds the jsonb from them directly.
    std::vector<HeaderField> headers;
    bool parsable = false;    // value is JSON that jsonb accepts: store it in payload
    JsonTokens payload;       // when parsable: the value's tokens, to build its jsonb from
    std::size_t raw_len = 0;  // bytes of the value kept in raw_payload when not parsable
    bool raw_null = false;    // no value at all (tombstone): raw_payload NULL
    std::string note;         // why the record is unparsable (goes to last_error)
    // Not stored (a Debezium tombstone, a CockroachDB resolved timestamp): `skipped` says which.
    // Its offset is stored with the batch's like any other.
    bool skip = false;
    std::string skipped;
    // value_format 'registry': the value decoded into JSON text (the payload's text; an Avro
    // value is decoded into `payload`'s tokens, its text written only for the CDC rules), the
    // schema's full name, and whether the schema is still to be fetched (then nothing else is
    // set: the record waits). The producer's bytes are kept in raw_payload (keep_raw).
    std::string decoded;
    std::string schema_name;
    bool pending = false;
    uint32_t pending_id = 0;  // the schema it waits for
    bool keep_raw = false;
    // key_format 'registry': the key decoded into JSON text (key_payload), when it has one.
    std::string key_decoded;
    bool key_decoded_ok = false;
};

Classified classify(const Record& record, const Options& options);

// The same into `out`, reusing the buffers it holds (the ingest worker keeps one per batch row);
// buffers a large record grew beyond kKeptBufferBytes are released on the next use.
void classify(const Record& record, const Options& options, Classified& out);
inline constexpr std::size_t kKeptBufferBytes = 64 * 1024;

// The headers object as JSON text (what jsonb_in would need to store the same value).
std::string headers_json(const Classified& classified);

// True when [data, data+len) is well-formed UTF-8 (no overlongs, surrogates or > U+10FFFF).
bool valid_utf8(const char* data, std::size_t len);

}  // namespace eventbox::inbox
