// The tree of an Avro schema as our walkers use it (registry/avro_json.cpp decodes with it,
// registry/avro_encode.cpp encodes with it): each type's kind, logical type and children, named
// types resolved. Avro C parses the schema too, but does not expose logical types. Internal to
// src/registry/. Pure C++.
#pragma once

#include <cstddef>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace eventbox::registry::avro {

struct Node {
    enum Logical {
        kNone,
        kDecimal,
        kDate,
        kTimeMillis,
        kTimeMicros,
        kTimestampMillis,
        kTimestampMicros,
        kLocalTimestampMillis,
        kLocalTimestampMicros,
        kDuration
    };
    // The type, for the encoder (the decoder asks Avro C).
    enum Kind {
        kNull,
        kBoolean,
        kInt,
        kLong,
        kFloat,
        kDouble,
        kBytes,
        kString,
        kRecord,
        kEnum,
        kArray,
        kMap,
        kUnion,
        kFixed
    };
    Kind kind = kNull;
    Logical logical = kNone;
    int scale = 0;
    std::size_t size = 0;  // fixed
    std::vector<const Node*> children;
    std::vector<std::string> names;     // record fields; enum symbols
    std::vector<std::string> defaults;  // record fields' defaults as JSON text
    std::vector<bool> has_default;
};

// Builds the node tree of a schema, resolving named types as Avro does (full names; a simple
// name in the enclosing namespace). Throws eventbox::Error (22023) on what it cannot use.
class TreeBuilder {
  public:
    explicit TreeBuilder(std::vector<std::unique_ptr<Node>>* nodes) : nodes_(nodes) {}
    const Node* build(const nlohmann::json& j, const std::string& ns);
    std::string top_name;  // the first named type met at the top

  private:
    Node* make();
    static void set_logical(Node* n, const nlohmann::json& j);
    const Node* named(const nlohmann::json& j, const std::string& t, const std::string& ns);
    const Node* reference(const std::string& name, const std::string& ns);

    std::vector<std::unique_ptr<Node>>* nodes_;
    std::unordered_map<std::string, Node*> by_name_;
    int depth_ = 0;
};

// Appends the Avro binary of the JSON text `json` written with the schema at `root` (the
// mapping of docs/guide/formats.md read back); false with the reason (the value's path).
bool encode(std::string_view json, const Node* root, std::string* out, std::string* error);

}  // namespace eventbox::registry::avro
