// The references of a schema fetched by the registry client (see registry/registry.hpp and
// registry/references.hpp): the referenced subject versions are fetched with the same
// non-blocking transfers as the schemas, and the schema is cached once they all arrived.
#include <curl/curl.h>

#include <algorithm>

#include "registry/registry.hpp"
#include "registry/transfer.hpp"

namespace eventbox::registry {

void Registry::resolve(uint32_t id, const std::string& subject_key, std::string body) {
    auto r = std::make_unique<Resolution>();
    r->key = subject_key.empty() ? id_resolution_key(id) : subject_key;
    r->id = id;
    r->subject_key = subject_key;
    r->body = std::move(body);
    r->refs.start(r->body, id);
    Resolution* raw = r.get();
    resolving_[raw->key] = std::move(r);
    ask_references(raw);
}

// Starts the fetches of the references found so far (a subject version resolved before is not
// fetched again: it never changes); ends the resolution when none is open. Bounded: each
// reference is wanted once, and at most kMaxReferences of them.
void Registry::ask_references(Resolution* r) {
    bool more = true;
    while (more && r->failed.empty()) {
        more = false;
        for (const std::string& ref : r->refs.take_wanted()) {
            auto known = references_.find(ref);
            if (known != references_.end()) {
                r->refs.arrived(ref, known->second);  // may want its own references
                more = true;
                continue;
            }
            Transfer* t =
                start(subject_path(ReferenceSet::subject_of(ref), ReferenceSet::version_of(ref)));
            t->resolution = r;
            t->ref_key = ref;
            r->open.push_back(t);
        }
    }
    if (r->open.empty()) resolved(r);
}

void Registry::keep_reference(const std::string& key, const std::string& body) {
    if (ReferenceSet::version_of(key) <= 0) return;  // "latest" moves
    std::size_t bytes = key.size() + body.size();
    if (references_.size() >= kMaxKeptReferences ||
        reference_bytes_ + bytes > config_.max_bytes / 4) {
        references_.clear();  // crude but bounded: they are fetched again when used
        reference_bytes_ = 0;
    }
    if (references_.emplace(key, body).second) reference_bytes_ += bytes;
}

void Registry::finish_reference(Transfer* t, int curl_code, long status) {
    Resolution* r = t->resolution;
    if (curl_code == CURLE_OK && status == 200) {
        keep_reference(t->ref_key, t->body);
        r->refs.arrived(t->ref_key, t->body);
    } else if (curl_code == CURLE_OK && status == 404) {
        r->refs.missing(t->ref_key, shown_url_);
    } else if (curl_code == CURLE_WRITE_ERROR) {
        r->refs.refuse(ReferenceSet::describe(t->ref_key) + ": the registry's answer is too large");
    } else if (r->failed.empty()) {
        r->failed = "schema registry " + shown_url_ + ", reference " +
                    ReferenceSet::describe(t->ref_key) + " of schema id " + std::to_string(r->id) +
                    ": " + t->failure(curl_code, status);
    }
    r->open.erase(std::find(r->open.begin(), r->open.end(), t));
    release(t);
    ask_references(r);
}

// Caches the schema (or its refusal) once its references arrived, or records the failure.
void Registry::resolved(Resolution* r) {
    std::unique_ptr<Schema> schema;
    if (r->failed.empty()) {
        std::vector<Reference> refs = r->refs.ordered();
        if (!r->refs.refused().empty()) {
            schema = std::make_unique<Schema>();
            schema->type = r->refs.type() == "PROTOBUF" ? SchemaType::kProtobuf : SchemaType::kAvro;
            schema->refused = "schema id " + std::to_string(r->id) + ": " + r->refs.refused();
            schema->bytes = 256 + schema->refused.size();
        } else {
            schema = parse_response(r->id, r->body, config_.max_schema_text, &refs);
        }
    }
    if (r->subject_key.empty()) {
        if (schema) {
            put(r->id, std::move(schema));
        } else {
            failures_[r->id] = r->failed;
        }
    } else if (schema) {
        SubjectEntry entry;
        entry.id = r->id;
        entry.schema = std::move(schema);
        entry.fetched_ms = now_ms_;
        subjects_[r->subject_key] = std::move(entry);
    } else if (subjects_.count(r->subject_key) == 0) {
        subject_failures_[r->subject_key] = r->failed;
    }
    std::string key = r->key;
    resolving_.erase(key);
}

}  // namespace eventbox::registry
