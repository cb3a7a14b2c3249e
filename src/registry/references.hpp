// The Schema Registry's schema references (`references: [{name, subject, version}]` in a schema's
// answer, docs/guide/formats.md) of one schema being resolved: which subject versions to fetch
// (each once, recursively), what came back, the bounds (kMaxReferenceDepth, kMaxReferences), and
// the referenced texts in an order the parsers can use. The transfers are registry.cpp's; this
// is the bookkeeping, without I/O. Pure C++.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace eventbox::registry {

// How deep references may nest (a reference of a reference of the schema is at depth 2).
inline constexpr int kMaxReferenceDepth = 8;
// How many distinct subject versions one schema may reference, at all depths.
inline constexpr std::size_t kMaxReferences = 32;

// A referenced schema, fetched.
struct Reference {
    std::string name;  // the reference's name (Protobuf: the import path)
    std::string text;  // the referenced schema
};

// Whether a registry answer (of /schemas/ids/{id} or /subjects/{s}/versions/{v}) has references
// that must be fetched to use it: an Avro or Protobuf schema's (a JSON Schema's are not needed).
bool needs_references(std::string_view body);

class ReferenceSet {
  public:
    // Starts from the referencing schema's answer; `root_id` is its id (a reference back to it
    // is a cycle). Every reference must have the schema's type.
    void start(std::string_view root_body, uint32_t root_id);

    // The subject versions to fetch now ("subject@version" keys; version 0: latest), each
    // returned once.
    std::vector<std::string> take_wanted();
    // A fetched reference's answer (HTTP 200), or its absence (404).
    void arrived(const std::string& key, std::string_view body);
    void missing(const std::string& key, const std::string& registry);
    // Any other definitive refusal (an answer too large).
    void refuse(const std::string& why) {
        if (refused_.empty()) refused_ = why;
    }

    // A definitive reason the schema cannot be used ("" while none): a missing reference, a
    // reference of another schema type, too deep, too many, a cycle (found by ordered()).
    const std::string& refused() const noexcept { return refused_; }

    // Once every reference arrived: the referenced texts, each after those it references;
    // empty with refused() set when they form a cycle.
    std::vector<Reference> ordered();

    // The referencing schema's type as its answer names it ("AVRO", "PROTOBUF"), read by start().
    const std::string& type() const noexcept { return type_; }

    // The subject and version of a key, as messages show them.
    static std::string describe(const std::string& key);
    static std::string subject_of(const std::string& key);
    static int version_of(const std::string& key);

  private:
    struct Node {
        std::string name;  // the name it was first referenced by
        int depth = 0;
        bool arrived = false;
        uint32_t id = 0;
        std::string text;
        std::vector<std::pair<std::string, std::string>> children;  // (name, key)
    };
    void add_children(const std::string& parent, int depth, std::string_view body,
                      std::vector<std::pair<std::string, std::string>>* children);
    bool visit(const std::string& key, const std::string& name, std::vector<std::string>* path,
               std::map<std::string, int>* state, std::vector<Reference>* out);

    std::string type_;
    uint32_t root_id_ = 0;
    std::vector<std::pair<std::string, std::string>> roots_;  // the schema's own references
    std::map<std::string, Node> nodes_;
    std::vector<std::string> wanted_;
    std::string refused_;
};

}  // namespace eventbox::registry
