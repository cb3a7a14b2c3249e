// Avro schemas with references as one self-contained schema (see registry/avro_refs.hpp).
#include "registry/avro_refs.hpp"

#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

#include "core/error.hpp"

namespace eventbox::registry::avro {

namespace {

using nlohmann::json;

constexpr int kMaxNesting = 200;

bool is_primitive(const std::string& name) {
    return name == "null" || name == "boolean" || name == "int" || name == "long" ||
           name == "float" || name == "double" || name == "bytes" || name == "string";
}

bool is_named_kind(const std::string& t) {
    return t == "record" || t == "error" || t == "enum" || t == "fixed";
}

bool is_type_keyword(const std::string& t) {
    return is_primitive(t) || is_named_kind(t) || t == "array" || t == "map";
}

void too_deep() {
    throw Error(sqlstate::kInvalidParameterValue,
                "Avro schema nests types deeper than " + std::to_string(kMaxNesting));
}

// The full name of a definition `j` in the enclosing namespace `ns`.
std::string full_name(const json& j, const std::string& ns) {
    auto name = j.find("name");
    if (name == j.end() || !name->is_string()) return "";
    std::string n = name->get<std::string>();
    if (n.find('.') != std::string::npos) return n;
    std::string space = ns;
    auto s = j.find("namespace");
    if (s != j.end() && s->is_string()) space = s->get<std::string>();
    return space.empty() ? n : space + "." + n;
}

std::string namespace_of(const std::string& full) {
    std::size_t dot = full.rfind('.');
    return dot == std::string::npos ? std::string() : full.substr(0, dot);
}

// The one traversal of an Avro schema the steps below share: unions' branches, a named type's
// fields, an array's items, a map's values, bounded by kMaxNesting. `Json` is `json` or
// `const json`; the visitor is told of
// - each named type (record, error, enum, fixed): `named(j, ns, depth, &inner)` returns whether
//   its fields are walked, and sets the namespace `inner` they are in;
// - each type name used (a bare string, or an object's "type" that is not a keyword):
//   `used(name, ns, depth)`.
template <typename Json, typename Visitor>
void walk(Json& j, const std::string& ns, int depth, Visitor& v) {
    if (depth > kMaxNesting) too_deep();
    if (j.is_string()) return v.used(j, ns, depth);
    if (j.is_array()) {
        for (auto& branch : j) walk(branch, ns, depth + 1, v);
        return;
    }
    if (!j.is_object()) return;
    auto type = j.find("type");
    if (type == j.end()) return;
    if (!type->is_string()) return walk(*type, ns, depth + 1, v);
    std::string t = type->template get<std::string>();
    if (is_named_kind(t)) {
        std::string inner;
        if (!v.named(j, ns, depth, &inner)) return;
        auto fields = j.find("fields");
        if (fields != j.end() && fields->is_array())
            for (auto& f : *fields) {
                if (!f.is_object()) continue;
                auto field_type = f.find("type");
                if (field_type != f.end()) walk(*field_type, inner, depth + 1, v);
            }
    } else if (t == "array" || t == "map") {
        auto inside = j.find(t == "array" ? "items" : "values");
        if (inside != j.end()) walk(*inside, ns, depth + 1, v);
    } else if (!is_type_keyword(t)) {
        v.used(*type, ns, depth);
    }
}

// Every full name a schema defines, at any depth.
struct NameCollector {
    std::unordered_set<std::string>* names;
    bool named(const json& j, const std::string& ns, int, std::string* inner) {
        std::string full = full_name(j, ns);
        *inner = namespace_of(full);
        names->insert(std::move(full));
        return true;
    }
    void used(const json&, const std::string&, int) {}
};

// Rewrites every definition's name and every reference in full (`names`: all that are defined).
struct FullNameWriter {
    const std::unordered_set<std::string>& names;
    bool named(json& j, const std::string& ns, int, std::string* inner) {
        std::string full = full_name(j, ns);
        j["name"] = full;
        if (full.find('.') == std::string::npos) {
            j["namespace"] = "";  // the null namespace, wherever the type lands
        } else {
            j.erase("namespace");
        }
        *inner = namespace_of(full);
        return true;
    }
    void used(json& j, const std::string& ns, int) {
        std::string name = j.get<std::string>();
        if (is_primitive(name) || name.find('.') != std::string::npos || ns.empty()) return;
        if (names.count(ns + "." + name) != 0 || names.count(name) == 0) j = ns + "." + name;
    }
};

// Every definition of a (full-named) schema, by full name.
struct DefinitionIndex {
    std::unordered_map<std::string, json>* defs;
    bool named(const json& j, const std::string&, int, std::string*) {
        auto name = j.find("name");
        if (name == j.end() || !name->is_string()) return false;
        defs->emplace(name->get<std::string>(), j);
        return true;
    }
    void used(const json&, const std::string&, int) {}
};

// Walks a full-named schema in Avro's order of definition: a reference to a type not defined yet
// that a referenced schema defines gets that definition; a second definition of a type becomes a
// reference to the first.
class Inliner {
  public:
    explicit Inliner(std::unordered_map<std::string, json> available)
        : available_(std::move(available)) {}

    bool named(json& j, const std::string&, int, std::string*) {
        auto name = j.find("name");
        if (name == j.end() || !name->is_string()) return false;
        std::string full = name->get<std::string>();
        if (!defined_.insert(full).second) {
            j = full;
            return false;
        }
        return true;
    }

    void used(json& j, const std::string& ns, int depth) {
        std::string name = j.get<std::string>();
        if (is_primitive(name) || defined_.count(name) != 0) return;
        auto it = available_.find(name);
        if (it == available_.end()) return;
        j = it->second;
        walk(j, ns, depth + 1, *this);
    }

  private:
    std::unordered_map<std::string, json> available_;
    std::unordered_set<std::string> defined_;
};

json parse(const std::string& text, const char* what) {
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded())
        throw Error(sqlstate::kInvalidParameterValue, std::string(what) + " is not valid JSON");
    return j;
}

}  // namespace

std::string inline_references(const std::string& text, const std::vector<std::string>& referenced) {
    json root = parse(text, "Avro schema");
    std::vector<json> refs;
    refs.reserve(referenced.size());
    for (const std::string& r : referenced) refs.push_back(parse(r, "referenced Avro schema"));
    std::unordered_set<std::string> names;
    NameCollector collector{&names};
    walk(static_cast<const json&>(root), "", 0, collector);
    for (const json& r : refs) walk(r, "", 0, collector);
    FullNameWriter writer{names};
    std::unordered_map<std::string, json> available;
    DefinitionIndex index{&available};
    for (json& r : refs) {
        walk(r, "", 0, writer);
        walk(static_cast<const json&>(r), "", 0, index);
    }
    walk(root, "", 0, writer);
    Inliner inliner(std::move(available));
    walk(root, "", 0, inliner);
    return root.dump();
}

}  // namespace eventbox::registry::avro
