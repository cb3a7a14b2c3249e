// The Schema Registry as the ingest worker sees it: the Confluent wire format's header (magic
// byte 0, a 4-byte big-endian schema id), schemas fetched by id over HTTP with libcurl's multi
// interface (never blocking: the worker drives the transfers from its wait loop), kept in a
// bounded LRU cache, and the decoders that turn a record's data into JSON text
// (docs/guide/formats.md, docs/design/ingest.md). Pure C++.
//
// A record whose schema is not cached is "pending": decode() starts its fetch and the caller
// waits (the ingest worker stores the records before it and reads the rest again once the
// schema arrived). A fetch ends with the schema, with a definitive refusal that is cached like a
// schema (no such id: 404; a schema that cannot be parsed; an unsupported type), or with a
// transport failure (no connection, timeout, 5xx, 401/403) that is not cached: the caller pauses
// and asks again after its backoff. An Avro or Protobuf schema with references (named types or
// imports from other subjects) is usable once its referenced subject versions arrived, fetched
// the same way (registry/references.hpp): a missing one refuses the schema, a transport failure
// fails the fetch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "registry/references.hpp"

namespace eventbox {
struct JsonTokens;
}

namespace eventbox::registry {

class AvroSchema;
class ProtobufSchema;

// The Confluent wire format's header.
inline constexpr std::size_t kHeaderBytes = 5;
inline constexpr unsigned char kMagicByte = 0;

struct Config {
    std::string url;        // eventbox.schema_registry_url, without a trailing '/'
    std::string user_info;  // "user:password" for HTTP basic auth (never in messages)
    long timeout_ms = 10000;
    std::size_t max_schemas = 1000;             // cache entries
    std::size_t max_bytes = 64 * 1024 * 1024;   // cache bytes (an estimate of each schema's)
    std::size_t max_schema_text = 1024 * 1024;  // a larger schema is refused
    std::string invalid;  // why the options are unusable: every fetch fails with it
};

// Parses eventbox.schema_registry_options ("key=value,..."; see docs/reference/settings.md) into
// `config`. Throws eventbox::Error (22023) naming the key, never a value.
void parse_options(std::string_view text, Config* config);
// The configuration of eventbox.schema_registry_url and _options: options that do not parse
// leave `invalid` set to why (every fetch then fails with it) instead of throwing.
Config make_config(std::string_view url, std::string_view options);

// `url` without its user information (what messages may show).
std::string url_for_messages(std::string_view url);

enum class SchemaType { kAvro, kProtobuf, kJson };

// A cached schema id: a usable schema or the reason its records are unparsable.
struct Schema {
    SchemaType type = SchemaType::kAvro;
    std::string refused;  // non-empty: records written with this id are unparsable, and why
    std::string name;     // full name of the record type (Avro, Protobuf) or title/$id (JSON)
    std::unique_ptr<AvroSchema> avro;
    std::unique_ptr<ProtobufSchema> protobuf;
    std::size_t bytes = 0;  // estimated memory
    Schema();
    ~Schema();
};

struct Decoded {
    enum Status { kOk, kPending, kBad };
    Status status = kBad;
    uint32_t id = 0;
    std::string reason;                 // kBad: why the record is unparsable
    const std::string* name = nullptr;  // kOk: the schema's full name ("" when it has none)
    bool utf8 = false;    // kOk: the JSON text is known to be UTF-8 (Avro's: our walker checks)
    bool tokens = false;  // kOk: the value is in decode()'s `tokens`, not in its text
};

// What encoding a payload for a subject came to (the relay's side).
struct Encoded {
    enum Status {
        kOk,       // the wire format is in `out`
        kPending,  // the subject's schema is being fetched: try again shortly
        kFailed,   // the registry could not be asked (transport): retry with backoff
        kRefused   // no such subject/version, a schema we cannot use, or a payload it refuses
    };
    Status status = kRefused;
    std::string reason;
    // kRefused: the schema was there and refused this payload (not the subject or the schema).
    bool payload_refused = false;
};

// Reads the wire header of [data, data+len): false with the reason when it is not one.
bool read_header(const char* data, std::size_t len, uint32_t* id, std::string* reason);

class Registry {
  public:
    explicit Registry(Config config);
    ~Registry();
    Registry(const Registry&) = delete;
    Registry& operator=(const Registry&) = delete;

    const Config& config() const noexcept { return config_; }

    // Decodes one record's value into JSON text (appended to `json`). kPending starts the
    // schema's fetch (if it is not under way). With `tokens`, an Avro value is written there
    // instead, as the JSON scanner's tokens (Decoded::tokens; registry/avro_json.hpp).
    Decoded decode(const char* data, std::size_t len, std::string* json,
                   JsonTokens* tokens = nullptr);
    // Starts the fetch of the schema of [data, data+len) when it is not cached; the caller
    // prefetches the schemas of records after a pending one this way.
    void prefetch(const char* data, std::size_t len);

    // Starts the fetch of schema `id` unless it is cached or under way (a subscription paused
    // because the registry could not be reached asks this way whether it answers again).
    void probe(uint32_t id) {
        if (!cached(id)) want(id, true);
    }
    // Whether the transfers open are all probes (none that a record waits for): the caller may
    // then serve them less often.
    bool probes_only() const noexcept {
        return !open_.empty() && queued_.empty() && open_subjects_.empty() && resolving_.empty() &&
               probing_.size() == open_.size();
    }

    // The schema id of a value decode() found pending.
    uint32_t pending_id(const char* data, std::size_t len) const;

    // Encodes the JSON text [json, json+len) with the schema of `subject` at `version` (0:
    // latest, looked up again after kLatestTtlMs) into the wire format, appended to `out`.
    Encoded encode(const std::string& subject, int version, const char* json, std::size_t len,
                   std::string* out, int64_t now_ms);

    // Serves the transfers without blocking (`now_ms`: the clock subjects are stamped with).
    void perform(int64_t now_ms = 0);
    // Whether transfers are open or queued.
    bool busy() const noexcept {
        return !open_.empty() || !queued_.empty() || !open_subjects_.empty() || !resolving_.empty();
    }
    // Whether schema `id` is cached (usable or refused).
    bool cached(uint32_t id) const { return cache_.count(id) != 0; }
    // Why the last fetch of `id` failed in transport ("" when it did not): the registry and the
    // reason, never credentials.
    std::string failure(uint32_t id) const;

    // Puts `schema` in the cache as id `id` (the fetches do; tests too).
    void put(uint32_t id, std::unique_ptr<Schema> schema);
    std::size_t cached_count() const noexcept { return cache_.size(); }
    std::size_t cached_bytes() const noexcept { return bytes_; }

    // A registry response body as a schema (or its refusal), with its references fetched
    // (`references`: each after those it uses; nullptr: none were, and an Avro or Protobuf schema
    // that has some is refused). Public for the unit tests.
    static std::unique_ptr<Schema> parse_response(
        uint32_t id, std::string_view body, std::size_t max_text,
        const std::vector<Reference>* references = nullptr);

  private:
    struct Entry {
        std::unique_ptr<Schema> schema;
        std::list<uint32_t>::iterator lru;
    };
    struct Transfer;
    struct Resolution;  // a schema whose references are being fetched
    // A subject's version as the relay encodes with it.
    struct SubjectEntry {
        uint32_t id = 0;
        std::unique_ptr<Schema> schema;
        int64_t fetched_ms = 0;
    };

    void want(uint32_t id, bool probe = false);
    void want_subject(const std::string& key, const std::string& subject, int version);
    Transfer* start(const std::string& path);
    void start_queued();
    void finish(Transfer* t, int curl_code);
    void finish_subject(Transfer* t, int curl_code, long status);
    void evict();
    std::string subject_path(const std::string& subject, int version) const;
    void resolve(uint32_t id, const std::string& subject_key, std::string body);
    void ask_references(Resolution* r);
    void finish_reference(Transfer* t, int curl_code, long status);
    // Keeps a referenced subject version's answer (a pinned version: it never changes).
    void keep_reference(const std::string& key, const std::string& body);
    void resolved(Resolution* r);
    void release(Transfer* t);

    Config config_;
    std::string shown_url_;
    std::unordered_map<uint32_t, Entry> cache_;
    std::list<uint32_t> lru_;  // most recent first
    std::size_t bytes_ = 0;
    std::unordered_map<uint32_t, std::string> failures_;
    std::vector<uint32_t> queued_;
    std::unordered_set<uint32_t> probing_;  // ids queued or open for probe() only
    std::unordered_map<uint32_t, Transfer*> open_;
    std::unordered_map<std::string, SubjectEntry> subjects_;  // by "subject@version"
    std::string subject_key_;  // encode()'s lookup key, its buffer kept between messages
    std::unordered_map<std::string, std::string> subject_failures_;
    std::unordered_map<std::string, Transfer*> open_subjects_;
    // By "#id" (a schema id's) or the subject key (the relay's).
    std::unordered_map<std::string, std::unique_ptr<Resolution>> resolving_;
    // The answers of referenced subject versions ("subject@version", pinned versions only):
    // a schema resolved again (the relay's 'latest' looked up again, an id evicted and fetched
    // again) does not fetch them again. At most kMaxKeptReferences entries and a quarter of
    // cache.max.bytes; beyond, they are all dropped and fetched again when used.
    std::unordered_map<std::string, std::string> references_;
    std::size_t reference_bytes_ = 0;
    void* multi_ = nullptr;  // CURLM*
    int64_t now_ms_ = 0;     // as of the last perform()
};

// Fetches open or queued at once, and the entries the cache never evicts (the most recent):
// what a pending record waits for is fetched in a round of at most this many, so it is still
// cached when its records are read again.
inline constexpr std::size_t kMaxFetches = 256;
// Referenced subject versions kept (Registry::references_).
inline constexpr std::size_t kMaxKeptReferences = 1024;
// How long the relay encodes with a subject's latest version before it asks again (in the
// background: the cached version is used meanwhile).
inline constexpr int64_t kLatestTtlMs = 60000;

}  // namespace eventbox::registry
