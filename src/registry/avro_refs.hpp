// Avro schemas with references (the registry's `references`: named types defined in other
// subjects' schemas, docs/guide/formats.md): the referenced schemas' named types are written into
// the referencing schema at their first use, so that Avro C and our tree (registry/avro_tree.hpp)
// parse one self-contained schema. Every name is written in full on the way, so a type keeps its
// namespace wherever it lands. Internal to src/registry/. Pure C++.
#pragma once

#include <string>
#include <vector>

namespace eventbox::registry::avro {

// `text` with the named types it uses from `referenced` (the referenced schemas' texts, in any
// order; a referenced schema may itself use the types of another) written in where first used.
// A name no schema defines is left as it is (the parser then names it). Throws eventbox::Error
// (22023) when a text is not JSON or nests deeper than the parsers' bound.
std::string inline_references(const std::string& text, const std::vector<std::string>& referenced);

}  // namespace eventbox::registry::avro
