// Protobuf data of the Schema Registry's wire format as JSON text: the registry's .proto text is
// parsed (compiler::Parser) into a descriptor pool, the record's message-indexes select the
// message type, a dynamic message reads the bytes and libprotobuf's JSON mapping writes them
// (docs/guide/formats.md). Imports are the registry's references (their .proto texts, fetched
// by registry/registry.cpp) or Google's well-known types (from libprotobuf's own descriptors).
// Pure C++.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace eventbox::registry {

class ProtobufSchema {
  public:
    // The imported files: (import path, .proto text), the registry's references.
    using Imports = std::vector<std::pair<std::string, std::string>>;

    // Throws eventbox::Error (22023) when the text or an imported one does not parse or build,
    // or imports a file that is neither in `imports` nor one of Google's well-known types, or
    // the imports form a cycle.
    ProtobufSchema(const std::string& text, const Imports& imports);
    ~ProtobufSchema();
    ProtobufSchema(const ProtobufSchema&) = delete;
    ProtobufSchema& operator=(const ProtobufSchema&) = delete;

    // Reads the message-indexes and the message after them from [data, data+len) and appends its
    // JSON to `out`; `name` gets the message type's full name. False with the reason in `error`.
    bool to_json(const char* data, std::size_t len, std::string* out, std::string* error,
                 const std::string** name) const;

    // Appends the message-indexes of the schema's first message type ([0]: one 0 byte) and that
    // message read from the JSON text `json` (libprotobuf's JSON parser: .proto or JSON field
    // names, unknown fields refused), serialized deterministically. False with the reason.
    bool from_json(const std::string& json, std::string* out, std::string* error) const;

    // The message type at `indexes` (for the tests): its full name, or "" when there is none.
    std::string message_name(const std::vector<int>& indexes) const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// Reads the Confluent message-indexes (zigzag varints: a count, then that many indexes; a
// single 0 byte means [0]) from [data, data+len); returns the bytes read, 0 when malformed.
std::size_t read_message_indexes(const char* data, std::size_t len, std::vector<int>* indexes);

}  // namespace eventbox::registry
