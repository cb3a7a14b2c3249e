// The references of a schema being resolved (see registry/references.hpp).
#include "registry/references.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace eventbox::registry {

namespace {

std::string type_of(const nlohmann::json& j) {
    auto t = j.find("schemaType");
    return t != j.end() && t->is_string() ? t->get<std::string>() : std::string("AVRO");
}

}  // namespace

bool needs_references(std::string_view body) {
    nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    if (!j.is_object()) return false;
    auto refs = j.find("references");
    return refs != j.end() && refs->is_array() && !refs->empty() && type_of(j) != "JSON";
}

std::string ReferenceSet::subject_of(const std::string& key) {
    return key.substr(0, key.rfind('@'));
}

int ReferenceSet::version_of(const std::string& key) {
    return std::atoi(key.c_str() + key.rfind('@') + 1);
}

std::string ReferenceSet::describe(const std::string& key) {
    int version = version_of(key);
    return "subject \"" + subject_of(key) + "\" version " +
           (version > 0 ? std::to_string(version) : std::string("latest"));
}

void ReferenceSet::start(std::string_view root_body, uint32_t root_id) {
    root_id_ = root_id;
    nlohmann::json j = nlohmann::json::parse(root_body, nullptr, false);
    if (!j.is_object()) return;
    type_ = type_of(j);
    add_children("", 0, root_body, &roots_);
}

// Reads the references of `body` (at `depth`) into `children`, wanting the new ones.
void ReferenceSet::add_children(const std::string& parent, int depth, std::string_view body,
                                std::vector<std::pair<std::string, std::string>>* children) {
    nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    auto refs = j.is_object() ? j.find("references") : j.end();
    if (!j.is_object() || refs == j.end() || !refs->is_array()) return;
    for (const auto& r : *refs) {
        if (!refused_.empty()) return;
        if (!r.is_object() || !r.contains("subject") || !r["subject"].is_string()) {
            refused_ = "a reference of " + (parent.empty() ? "the schema" : describe(parent)) +
                       " has no subject";
            return;
        }
        std::string name = r.value("name", std::string());
        int version = r.contains("version") && r["version"].is_number_integer()
                          ? std::max(0, r["version"].get<int>())
                          : 0;
        std::string key = r["subject"].get<std::string>() + "@" + std::to_string(version);
        children->emplace_back(name, key);
        if (nodes_.count(key) != 0) continue;
        if (depth + 1 > kMaxReferenceDepth) {
            refused_ = "reference \"" + name + "\" (" + describe(key) + ") is nested deeper than " +
                       std::to_string(kMaxReferenceDepth) + " references";
            return;
        }
        if (nodes_.size() >= kMaxReferences) {
            refused_ = "the schema has more than " + std::to_string(kMaxReferences) +
                       " references (at all depths)";
            return;
        }
        Node& node = nodes_[key];
        node.name = name;
        node.depth = depth + 1;
        wanted_.push_back(key);
    }
}

std::vector<std::string> ReferenceSet::take_wanted() {
    std::vector<std::string> out;
    if (refused_.empty()) out.swap(wanted_);
    wanted_.clear();
    return out;
}

void ReferenceSet::arrived(const std::string& key, std::string_view body) {
    auto it = nodes_.find(key);
    if (it == nodes_.end() || !refused_.empty()) return;
    Node& node = it->second;
    nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    if (!j.is_object() || !j.contains("schema") || !j["schema"].is_string()) {
        refused_ = "reference \"" + node.name + "\" (" + describe(key) +
                   "): the registry's answer has no schema";
        return;
    }
    if (type_of(j) != type_) {
        refused_ = "reference \"" + node.name + "\" (" + describe(key) + ") is a " + type_of(j) +
                   " schema, not " + type_;
        return;
    }
    node.arrived = true;
    node.text = j["schema"].get<std::string>();
    if (j.contains("id") && j["id"].is_number_unsigned()) node.id = j["id"].get<uint32_t>();
    add_children(key, node.depth, body, &node.children);  // a std::map: `node` stays valid
}

void ReferenceSet::missing(const std::string& key, const std::string& registry) {
    auto it = nodes_.find(key);
    if (it == nodes_.end() || !refused_.empty()) return;
    refused_ = "reference \"" + it->second.name + "\" (" + describe(key) +
               ") is not in the schema registry " + registry;
}

bool ReferenceSet::visit(const std::string& key, const std::string& name,
                         std::vector<std::string>* path, std::map<std::string, int>* state,
                         std::vector<Reference>* out) {
    Node& node = nodes_[key];
    int& s = (*state)[key];
    if (s == 1 || (root_id_ != 0 && node.id == root_id_)) {
        std::string cycle = "references form a cycle: the schema";
        for (const std::string& k : *path) cycle += " -> " + describe(k);
        refused_ = cycle + " -> " + describe(key);
        return false;
    }
    if (s == 0) {
        s = 1;
        path->push_back(key);
        for (const auto& [child_name, child] : node.children)
            if (!visit(child, child_name, path, state, out)) return false;
        path->pop_back();
        s = 2;
    }
    bool named =
        std::any_of(out->begin(), out->end(), [&](const Reference& r) { return r.name == name; });
    if (!named) out->push_back(Reference{name, node.text});
    return true;
}

std::vector<Reference> ReferenceSet::ordered() {
    std::vector<Reference> out;
    if (!refused_.empty()) return out;
    for (const auto& [key, node] : nodes_)
        if (!node.arrived) {
            refused_ = "reference \"" + node.name + "\" (" + describe(key) + ") was not fetched";
            return out;
        }
    std::map<std::string, int> state;
    std::vector<std::string> path;
    for (const auto& [name, key] : roots_)
        if (!visit(key, name, &path, &state, &out)) return {};
    return out;
}

}  // namespace eventbox::registry
