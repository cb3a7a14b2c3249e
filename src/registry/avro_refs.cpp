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

// Every full name a schema defines, at any depth.
void collect_names(const json& j, const std::string& ns, int depth,
                   std::unordered_set<std::string>* names) {
    if (depth > kMaxNesting) too_deep();
    if (j.is_array()) {
        for (const auto& branch : j) collect_names(branch, ns, depth + 1, names);
        return;
    }
    if (!j.is_object()) return;
    auto type = j.find("type");
    if (type == j.end()) return;
    if (!type->is_string()) return collect_names(*type, ns, depth + 1, names);
    std::string t = type->get<std::string>();
    if (is_named_kind(t)) {
        std::string full = full_name(j, ns);
        names->insert(full);
        auto fields = j.find("fields");
        if (fields != j.end() && fields->is_array())
            for (const auto& f : *fields)
                if (f.is_object() && f.contains("type"))
                    collect_names(f["type"], namespace_of(full), depth + 1, names);
    } else if (t == "array" && j.contains("items")) {
        collect_names(j["items"], ns, depth + 1, names);
    } else if (t == "map" && j.contains("values")) {
        collect_names(j["values"], ns, depth + 1, names);
    }
}

// Rewrites every definition's name and every reference in full (`names`: all that are defined).
void write_full_names(json* j, const std::string& ns, int depth,
                      const std::unordered_set<std::string>& names) {
    if (depth > kMaxNesting) too_deep();
    auto resolve = [&](const std::string& name) {
        if (is_primitive(name) || name.find('.') != std::string::npos || ns.empty()) return name;
        return names.count(ns + "." + name) != 0 || names.count(name) == 0 ? ns + "." + name : name;
    };
    if (j->is_string()) {
        *j = resolve(j->get<std::string>());
        return;
    }
    if (j->is_array()) {
        for (auto& branch : *j) write_full_names(&branch, ns, depth + 1, names);
        return;
    }
    if (!j->is_object() || !j->contains("type")) return;
    json& type = (*j)["type"];
    if (!type.is_string()) return write_full_names(&type, ns, depth + 1, names);
    std::string t = type.get<std::string>();
    if (is_named_kind(t)) {
        std::string full = full_name(*j, ns);
        (*j)["name"] = full;
        if (full.find('.') == std::string::npos) {
            (*j)["namespace"] = "";  // the null namespace, wherever the type lands
        } else {
            j->erase("namespace");
        }
        auto fields = j->find("fields");
        if (fields != j->end() && fields->is_array())
            for (auto& f : *fields)
                if (f.is_object() && f.contains("type"))
                    write_full_names(&f["type"], namespace_of(full), depth + 1, names);
    } else if (t == "array" && j->contains("items")) {
        write_full_names(&(*j)["items"], ns, depth + 1, names);
    } else if (t == "map" && j->contains("values")) {
        write_full_names(&(*j)["values"], ns, depth + 1, names);
    } else if (!is_type_keyword(t)) {
        type = resolve(t);
    }
}

// Every definition of a (full-named) schema, by full name.
void index_definitions(const json& j, int depth, std::unordered_map<std::string, json>* defs) {
    if (depth > kMaxNesting) too_deep();
    if (j.is_array()) {
        for (const auto& branch : j) index_definitions(branch, depth + 1, defs);
        return;
    }
    if (!j.is_object() || !j.contains("type")) return;
    const json& type = j["type"];
    if (!type.is_string()) return index_definitions(type, depth + 1, defs);
    std::string t = type.get<std::string>();
    if (is_named_kind(t) && j.contains("name") && j["name"].is_string()) {
        defs->emplace(j["name"].get<std::string>(), j);
        auto fields = j.find("fields");
        if (fields != j.end() && fields->is_array())
            for (const auto& f : *fields)
                if (f.is_object() && f.contains("type"))
                    index_definitions(f["type"], depth + 1, defs);
    } else if (t == "array" && j.contains("items")) {
        index_definitions(j["items"], depth + 1, defs);
    } else if (t == "map" && j.contains("values")) {
        index_definitions(j["values"], depth + 1, defs);
    }
}

// Walks a full-named schema in Avro's order of definition: a reference to a type not defined yet
// that a referenced schema defines gets that definition; a second definition of a type becomes a
// reference to the first.
class Inliner {
  public:
    explicit Inliner(std::unordered_map<std::string, json> available)
        : available_(std::move(available)) {}

    void walk(json* j, int depth) {
        if (depth > kMaxNesting) too_deep();
        if (j->is_string()) return use(j, depth);
        if (j->is_array()) {
            for (auto& branch : *j) walk(&branch, depth + 1);
            return;
        }
        if (!j->is_object() || !j->contains("type")) return;
        json& type = (*j)["type"];
        if (!type.is_string()) return walk(&type, depth + 1);
        std::string t = type.get<std::string>();
        if (is_named_kind(t)) {
            define(j, depth);
        } else if (t == "array" && j->contains("items")) {
            walk(&(*j)["items"], depth + 1);
        } else if (t == "map" && j->contains("values")) {
            walk(&(*j)["values"], depth + 1);
        } else if (!is_type_keyword(t)) {
            use(&type, depth);
        }
    }

  private:
    void use(json* j, int depth) {
        std::string name = j->get<std::string>();
        if (is_primitive(name) || defined_.count(name) != 0) return;
        auto it = available_.find(name);
        if (it == available_.end()) return;
        *j = it->second;
        walk(j, depth + 1);
    }

    void define(json* j, int depth) {
        auto name = j->find("name");
        if (name == j->end() || !name->is_string()) return;
        std::string full = name->get<std::string>();
        if (!defined_.insert(full).second) {
            *j = full;
            return;
        }
        auto fields = j->find("fields");
        if (fields != j->end() && fields->is_array())
            for (auto& f : *fields)
                if (f.is_object() && f.contains("type")) walk(&f["type"], depth + 1);
    }

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
    collect_names(root, "", 0, &names);
    for (const json& r : refs) collect_names(r, "", 0, &names);
    std::unordered_map<std::string, json> available;
    for (json& r : refs) {
        write_full_names(&r, "", 0, names);
        index_definitions(r, 0, &available);
    }
    write_full_names(&root, "", 0, names);
    Inliner inliner(std::move(available));
    inliner.walk(&root, 0);
    return root.dump();
}

}  // namespace eventbox::registry::avro
