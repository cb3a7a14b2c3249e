// The Schema Registry client, its cache and the wire format's decoding (see
// registry/registry.hpp).
#include "registry/registry.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "kafka/options.hpp"
#include "registry/avro_json.hpp"
#include "registry/avro_refs.hpp"
#include "registry/protobuf_json.hpp"
#include "registry/transfer.hpp"

namespace eventbox::registry {

Schema::Schema() = default;
Schema::~Schema() = default;

namespace {

std::size_t parse_size(const std::string& key, const std::string& value, std::size_t low,
                       std::size_t high) {
    std::size_t used = 0;
    unsigned long long v = 0;
    try {
        v = std::stoull(value, &used);
    } catch (...) {
        used = 0;
    }
    if (used == 0 || used != value.size() || v < low || v > high)
        throw Error(
            sqlstate::kInvalidParameterValue,
            "invalid value for eventbox.schema_registry_options key \"" + key + "\"", "",
            "Use an integer from " + std::to_string(low) + " to " + std::to_string(high) + ".");
    return static_cast<std::size_t>(v);
}

}  // namespace

void parse_options(std::string_view text, Config* config) {
    for (const KafkaOption& option : parse_kafka_options(text)) {
        const std::string& key = option.first;
        if (key == "basic.auth.user.info") {
            config->user_info = option.second;
        } else if (key == "request.timeout.ms") {
            config->timeout_ms = static_cast<long>(parse_size(key, option.second, 1, 3600000));
        } else if (key == "cache.max.schemas") {
            config->max_schemas = parse_size(key, option.second, 1, 1000000);
        } else if (key == "cache.max.bytes") {
            config->max_bytes = parse_size(key, option.second, 1024 * 1024, 1ull << 40);
        } else {
            throw Error(sqlstate::kInvalidParameterValue,
                        "unknown eventbox.schema_registry_options key \"" + key + "\"", "",
                        "Known keys: basic.auth.user.info, request.timeout.ms, "
                        "cache.max.schemas, cache.max.bytes.");
        }
    }
}

Config make_config(std::string_view url, std::string_view options) {
    Config config;
    config.url = std::string(url);
    try {
        parse_options(options, &config);
    } catch (const Error& e) {
        config.invalid = e.what();
    }
    return config;
}

std::string url_for_messages(std::string_view url) {
    std::size_t scheme = url.find("://");
    std::size_t start = scheme == std::string_view::npos ? 0 : scheme + 3;
    std::size_t end = url.find('/', start);
    std::size_t at = url.substr(0, end).rfind('@');
    if (at == std::string_view::npos || at < start) return std::string(url);
    return std::string(url.substr(0, start)) + std::string(url.substr(at + 1));
}

bool read_header(const char* data, std::size_t len, uint32_t* id, std::string* reason) {
    if (data == nullptr || len == 0) {
        *reason = "empty value: no Schema Registry wire format header";
        return false;
    }
    if (static_cast<unsigned char>(data[0]) != kMagicByte) {
        *reason = "value does not start with the Schema Registry magic byte 0 (it starts with " +
                  std::to_string(static_cast<unsigned char>(data[0])) + ")";
        return false;
    }
    if (len < kHeaderBytes) {
        *reason = "value of " + std::to_string(len) +
                  " bytes is shorter than the Schema Registry wire format header (5 bytes)";
        return false;
    }
    const auto* b = reinterpret_cast<const unsigned char*>(data);
    *id = (static_cast<uint32_t>(b[1]) << 24) | (b[2] << 16) | (b[3] << 8) | b[4];
    return true;
}

// ---- responses ------------------------------------------------------------------------------

namespace {

std::unique_ptr<Schema> refused(SchemaType type, std::string why) {
    auto s = std::make_unique<Schema>();
    s->type = type;
    s->refused = std::move(why);
    s->bytes = 256 + s->refused.size();
    return s;
}

// A JSON Schema's name: its title, else its $id.
std::string json_schema_name(const std::string& text) {
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_object()) return "";
    for (const char* key : {"title", "$id"}) {
        auto it = j.find(key);
        if (it != j.end() && it->is_string()) return it->get<std::string>();
    }
    return "";
}

}  // namespace

std::unique_ptr<Schema> Registry::parse_response(uint32_t id, std::string_view body,
                                                 std::size_t max_text,
                                                 const std::vector<Reference>* references) {
    std::string prefix = "schema id " + std::to_string(id) + ": ";
    nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    if (!j.is_object() || !j.contains("schema") || !j["schema"].is_string())
        return refused(SchemaType::kAvro, prefix + "the registry's answer has no schema");
    std::string type = j.value("schemaType", std::string("AVRO"));
    std::string text = j["schema"].get<std::string>();
    SchemaType kind = type == "PROTOBUF" ? SchemaType::kProtobuf
                      : type == "JSON"   ? SchemaType::kJson
                                         : SchemaType::kAvro;
    if (type != "AVRO" && type != "PROTOBUF" && type != "JSON")
        return refused(kind, prefix + "unsupported schema type \"" + type + "\"");
    // A JSON Schema's references ($ref to other subjects) need not be fetched: its records are
    // stored as sent and the schema is read for its name only. An Avro or Protobuf schema's are
    // (registry/references.hpp), and written in (Avro) or imported (Protobuf).
    static const std::vector<Reference> kNone;
    const std::vector<Reference>& refs = references != nullptr ? *references : kNone;
    if (references == nullptr && needs_references(body))
        return refused(kind, prefix + "the schema's references were not fetched");
    std::size_t total = text.size();
    for (const Reference& r : refs) total += r.text.size();
    if (total > max_text)
        return refused(kind, prefix + "schema of " + std::to_string(total) +
                                 " bytes (with its references) exceeds the cache's limit of " +
                                 std::to_string(max_text));
    auto s = std::make_unique<Schema>();
    s->type = kind;
    try {
        if (kind == SchemaType::kAvro) {
            std::vector<std::string> texts;
            for (const Reference& r : refs) texts.push_back(r.text);
            s->avro = std::make_unique<AvroSchema>(
                refs.empty() ? text : avro::inline_references(text, texts));
            s->name = s->avro->full_name();
            s->bytes = 1024 + 8 * total;  // Avro C's and our trees: measured ~5x the text
        } else if (kind == SchemaType::kProtobuf) {
            ProtobufSchema::Imports imports;
            for (const Reference& r : refs) imports.emplace_back(r.name, r.text);
            s->protobuf = std::make_unique<ProtobufSchema>(text, imports);
            s->bytes = 4096 + 16 * total;
        } else {
            s->name = json_schema_name(text);
            s->bytes = 256 + s->name.size();
        }
    } catch (const Error& e) {
        return refused(kind, prefix + e.what());
    }
    return s;
}

// ---- the cache ------------------------------------------------------------------------------

Registry::Registry(Config config)
    : config_(std::move(config)), shown_url_(url_for_messages(config_.url)) {
    while (!config_.url.empty() && config_.url.back() == '/') config_.url.pop_back();
    multi_ = curl_multi_init();
    if (multi_ == nullptr) throw Error(sqlstate::kOutOfMemory, "curl_multi_init failed");
}

void Registry::put(uint32_t id, std::unique_ptr<Schema> schema) {
    auto it = cache_.find(id);
    if (it != cache_.end()) {
        bytes_ -= it->second.schema->bytes;
        lru_.erase(it->second.lru);
        cache_.erase(it);
    }
    lru_.push_front(id);
    bytes_ += schema->bytes;
    cache_.emplace(id, Entry{std::move(schema), lru_.begin()});
    evict();
}

// The least recently used go first, but never the kMaxFetches most recent.
void Registry::evict() {
    while ((cache_.size() > config_.max_schemas || bytes_ > config_.max_bytes) &&
           cache_.size() > kMaxFetches) {
        uint32_t victim = lru_.back();
        lru_.pop_back();
        auto it = cache_.find(victim);
        bytes_ -= it->second.schema->bytes;
        cache_.erase(it);
    }
}

std::string Registry::failure(uint32_t id) const {
    auto it = failures_.find(id);
    return it == failures_.end() ? std::string() : it->second;
}

// ---- decoding -------------------------------------------------------------------------------

void Registry::prefetch(const char* data, std::size_t len) {
    uint32_t id;
    std::string ignored;
    if (read_header(data, len, &id, &ignored) && cache_.count(id) == 0) want(id);
}

uint32_t Registry::pending_id(const char* data, std::size_t len) const {
    uint32_t id = 0;
    std::string ignored;
    read_header(data, len, &id, &ignored);
    return id;
}

Decoded Registry::decode(const char* data, std::size_t len, std::string* json, JsonTokens* tokens) {
    Decoded d;
    if (!read_header(data, len, &d.id, &d.reason)) return d;
    auto it = cache_.find(d.id);
    if (it == cache_.end()) {
        want(d.id);
        d.status = Decoded::kPending;
        return d;
    }
    if (it->second.lru != lru_.begin()) lru_.splice(lru_.begin(), lru_, it->second.lru);
    const Schema& s = *it->second.schema;
    if (!s.refused.empty()) {
        d.reason = s.refused;
        return d;
    }
    const char* body = data + kHeaderBytes;
    std::size_t body_len = len - kHeaderBytes;
    bool ok = false;
    std::string why;
    switch (s.type) {
        case SchemaType::kAvro:
            d.tokens = tokens != nullptr;
            ok = d.tokens ? s.avro->to_tokens(body, body_len, tokens, &why)
                          : s.avro->to_json(body, body_len, json, &why);
            d.name = &s.name;
            d.utf8 = true;
            break;
        case SchemaType::kProtobuf:
            ok = s.protobuf->to_json(body, body_len, json, &why, &d.name);
            break;
        case SchemaType::kJson:
            json->append(body, body_len);
            d.name = &s.name;
            ok = true;
            break;
    }
    if (!ok) {
        d.reason = "schema id " + std::to_string(d.id) + ": " + why;
        return d;
    }
    d.status = Decoded::kOk;
    return d;
}

// ---- the transfers --------------------------------------------------------------------------

Registry::~Registry() {
    for (auto& [id, t] : open_) release(t);
    for (auto& [key, t] : open_subjects_) release(t);
    for (auto& [key, r] : resolving_)
        for (Transfer* t : r->open) release(t);
    if (multi_ != nullptr) curl_multi_cleanup(multi_);
}

void Registry::want(uint32_t id, bool probe) {
    if (!probe) probing_.erase(id);  // a record waits for it now
    if (open_.count(id) != 0 || std::find(queued_.begin(), queued_.end(), id) != queued_.end() ||
        resolving_.count(id_resolution_key(id)) != 0)
        return;
    if (open_.size() + queued_.size() >= kMaxFetches) return;  // asked again after this round
    failures_.erase(id);
    queued_.push_back(id);
    if (probe) probing_.insert(id);
    start_queued();
}

void Registry::start_queued() {
    constexpr std::size_t kParallel = 16;
    while (!queued_.empty() && open_.size() < kParallel) {
        uint32_t id = queued_.front();
        queued_.erase(queued_.begin());
        if (config_.url.empty() || !config_.invalid.empty()) {
            failures_[id] =
                config_.url.empty() ? "eventbox.schema_registry_url is empty" : config_.invalid;
            probing_.erase(id);
            continue;
        }
        Transfer* t = start("/schemas/ids/" + std::to_string(id));
        t->id = id;
        open_[id] = t;
    }
}

Registry::Transfer* Registry::start(const std::string& path) {
    auto* t = new Transfer();
    t->limit = config_.max_schema_text * 2 + 65536;
    t->easy = curl_easy_init();
    std::string url = config_.url + path;
    curl_easy_setopt(t->easy, CURLOPT_URL, url.c_str());
    curl_easy_setopt(t->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(t->easy, CURLOPT_TIMEOUT_MS, config_.timeout_ms);
    curl_easy_setopt(t->easy, CURLOPT_CONNECTTIMEOUT_MS, config_.timeout_ms);
    curl_easy_setopt(t->easy, CURLOPT_WRITEFUNCTION, &Transfer::on_data);
    curl_easy_setopt(t->easy, CURLOPT_WRITEDATA, t);
    curl_easy_setopt(t->easy, CURLOPT_ERRORBUFFER, t->error);
    curl_easy_setopt(t->easy, CURLOPT_PRIVATE, reinterpret_cast<char*>(t));
    curl_easy_setopt(t->easy, CURLOPT_PROTOCOLS_STR, "http,https");
    if (!config_.user_info.empty()) {
        curl_easy_setopt(t->easy, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
        curl_easy_setopt(t->easy, CURLOPT_USERPWD, config_.user_info.c_str());
    }
    curl_multi_add_handle(multi_, t->easy);
    return t;
}

// ---- subjects (the relay) -------------------------------------------------------------------

std::string Registry::subject_path(const std::string& subject, int version) const {
    char* escaped = curl_easy_escape(nullptr, subject.c_str(), static_cast<int>(subject.size()));
    std::string path = "/subjects/" + std::string(escaped ? escaped : "") + "/versions/" +
                       (version > 0 ? std::to_string(version) : std::string("latest"));
    curl_free(escaped);
    return path;
}

void Registry::want_subject(const std::string& key, const std::string& subject, int version) {
    if (open_subjects_.count(key) != 0 || resolving_.count(key) != 0) return;
    subject_failures_.erase(key);
    if (config_.url.empty() || !config_.invalid.empty()) {
        subject_failures_[key] =
            config_.url.empty() ? "eventbox.schema_registry_url is empty" : config_.invalid;
        return;
    }
    Transfer* t = start(subject_path(subject, version));
    t->subject_key = key;
    open_subjects_[key] = t;
}

Encoded Registry::encode(const std::string& subject, int version, const char* json, std::size_t len,
                         std::string* out, int64_t now_ms) {
    Encoded e;
    subject_key_.assign(subject).append("@").append(std::to_string(version));
    const std::string& key = subject_key_;
    auto it = subjects_.find(key);
    if (it == subjects_.end()) {
        auto failed = subject_failures_.find(key);
        if (failed != subject_failures_.end() && open_subjects_.count(key) == 0) {
            e.status = Encoded::kFailed;
            e.reason = failed->second;
            subject_failures_.erase(failed);  // asked again at the next attempt
            return e;
        }
        want_subject(key, subject, version);
        e.status = Encoded::kPending;
        return e;
    }
    if (version == 0 && now_ms - it->second.fetched_ms > kLatestTtlMs)
        want_subject(key, subject, version);  // meanwhile the cached version serves
    const Schema& s = *it->second.schema;
    if (!s.refused.empty()) {
        e.reason = s.refused;
        if (now_ms - it->second.fetched_ms > kLatestTtlMs) subjects_.erase(it);
        return e;
    }
    uint32_t id = it->second.id;
    out->push_back(static_cast<char>(kMagicByte));
    for (int shift = 24; shift >= 0; shift -= 8) out->push_back(static_cast<char>(id >> shift));
    std::string why;
    bool ok = false;
    switch (s.type) {
        case SchemaType::kAvro:
            ok = s.avro->from_json(std::string_view(json, len), out, &why);
            break;
        case SchemaType::kProtobuf:
            ok = s.protobuf->from_json(std::string(json, len), out, &why);
            break;
        case SchemaType::kJson:
            out->append(json, len);
            ok = true;
            break;
    }
    if (!ok) {
        e.payload_refused = true;
        e.reason = "subject \"" + subject + "\" (schema id " + std::to_string(id) +
                   ") refuses the payload: " + why;
        return e;
    }
    e.status = Encoded::kOk;
    return e;
}

void Registry::perform(int64_t now_ms) {
    now_ms_ = now_ms;
    if (!busy()) return;
    int running = 0;
    curl_multi_perform(multi_, &running);
    int left = 0;
    while (CURLMsg* m = curl_multi_info_read(multi_, &left)) {
        if (m->msg != CURLMSG_DONE) continue;
        char* t = nullptr;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &t);
        if (t != nullptr) finish(reinterpret_cast<Transfer*>(t), m->data.result);
    }
    start_queued();
}

void Registry::finish_subject(Transfer* t, int curl_code, long status) {
    const std::string& key = t->subject_key;
    std::string subject = key.substr(0, key.rfind('@'));
    std::string version = key.substr(key.rfind('@') + 1);
    std::string what =
        "subject \"" + subject + "\" version " + (version == "0" ? "latest" : version);
    if (curl_code == CURLE_OK && status == 200) {
        nlohmann::json j = nlohmann::json::parse(t->body, nullptr, false);
        SubjectEntry entry;
        entry.fetched_ms = now_ms_;
        if (j.is_object() && j.contains("id") && j["id"].is_number_unsigned()) {
            if (needs_references(t->body)) {
                resolve(j["id"].get<uint32_t>(), key, std::move(t->body));
                open_subjects_.erase(key);
                release(t);
                return;
            }
            entry.id = j["id"].get<uint32_t>();
            entry.schema = parse_response(entry.id, t->body, config_.max_schema_text);
        } else {
            entry.schema = refused(SchemaType::kAvro, what + ": the registry's answer has no id");
        }
        subjects_[key] = std::move(entry);
    } else if (curl_code == CURLE_OK && status == 404) {
        SubjectEntry entry;
        entry.fetched_ms = now_ms_;
        entry.schema =
            refused(SchemaType::kAvro, what + " is not in the schema registry " + shown_url_);
        subjects_[key] = std::move(entry);
    } else if (subjects_.count(key) == 0) {  // a refresh that failed keeps the cached version
        subject_failures_[key] =
            "schema registry " + shown_url_ + ", " + what + ": " + t->failure(curl_code, status);
    }
    std::string done = key;  // `key` is the transfer's
    release(t);
    open_subjects_.erase(done);
}

void Registry::finish(Transfer* t, int curl_code) {
    long status = 0;
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
    if (t->resolution != nullptr) {
        finish_reference(t, curl_code, status);
        return;
    }
    if (!t->subject_key.empty()) {
        finish_subject(t, curl_code, status);
        return;
    }
    std::string where = "schema registry " + shown_url_ + ", schema id " + std::to_string(t->id);
    if (curl_code != CURLE_OK) {
        if (curl_code == CURLE_WRITE_ERROR)
            put(t->id, refused(SchemaType::kAvro, "schema id " + std::to_string(t->id) +
                                                      ": the registry's answer is too large"));
        else
            failures_[t->id] = where + ": " + t->failure(curl_code, status);
    } else if (status == 200 && needs_references(t->body)) {
        resolve(t->id, "", std::move(t->body));
    } else if (status == 200) {
        put(t->id, parse_response(t->id, t->body, config_.max_schema_text));
    } else if (status == 404) {
        put(t->id, refused(SchemaType::kAvro, "schema id " + std::to_string(t->id) +
                                                  " is not in the schema registry " + shown_url_));
    } else {
        failures_[t->id] = where + ": HTTP status " + std::to_string(status);
    }
    open_.erase(t->id);
    probing_.erase(t->id);
    release(t);
}

void Registry::release(Transfer* t) {
    curl_multi_remove_handle(multi_, t->easy);
    curl_easy_cleanup(t->easy);
    delete t;
}

}  // namespace eventbox::registry
