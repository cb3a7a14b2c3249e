// Avro data of the Schema Registry's wire format as JSON (and JSON as Avro, for the relay), with
// the mapping of docs/guide/formats.md: Avro C (libavro) parses the writer's schema and reads the
// binary datum; our own walker writes it as the JSON scanner's tokens (messages/json_scan.hpp),
// with the logical types (which Avro C does not know) read from the schema's JSON beside it. The
// ingest builds the payload's jsonb from those tokens; JSON text is written from them where text
// is wanted. Pure C++.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace eventbox {
struct JsonTokens;
}

namespace eventbox::registry {

// One writer's schema, parsed once and used for every record written with it.
class AvroSchema {
  public:
    // Throws eventbox::Error (22023) when Avro C or the JSON parser refuses `json`.
    explicit AvroSchema(std::string_view json);
    ~AvroSchema();
    AvroSchema(const AvroSchema&) = delete;
    AvroSchema& operator=(const AvroSchema&) = delete;

    // The top-level type's full name (namespace.name) when it is named, else "".
    const std::string& full_name() const noexcept;

    // Appends the JSON of the one datum in [data, data+len) to `out`. False, with the reason in
    // `error`, when the bytes are not exactly one datum of this schema (truncated, trailing
    // bytes, a union branch or enum symbol out of range, a string that is not UTF-8).
    bool to_json(const char* data, std::size_t len, std::string* out, std::string* error) const;

    // The same datum as the tokens scan_json() makes of to_json()'s text, appended to `tokens`
    // (whose `depth` it raises to the value's nesting), with no text written and scanned. The
    // same refusals as to_json(); on one, `tokens` holds a part of the value.
    bool to_tokens(const char* data, std::size_t len, JsonTokens* tokens, std::string* error) const;

    // Appends the Avro binary of the JSON text `json` (read with the same mapping, so a decoded
    // payload encodes back to the same bytes; a union takes the first branch that accepts the
    // value). False, with the reason (the value's path) in `error`.
    bool from_json(std::string_view json, std::string* out, std::string* error) const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace eventbox::registry
