// Avro schemas as node trees (see registry/avro_tree.hpp).
#include "registry/avro_tree.hpp"

#include "core/error.hpp"

namespace eventbox::registry::avro {

namespace {

Node::Kind primitive_kind(const std::string& name) {
    static const std::unordered_map<std::string, Node::Kind> kinds = {
        {"null", Node::kNull},   {"boolean", Node::kBoolean}, {"int", Node::kInt},
        {"long", Node::kLong},   {"float", Node::kFloat},     {"double", Node::kDouble},
        {"bytes", Node::kBytes}, {"string", Node::kString}};
    return kinds.at(name);
}

Node::Logical logical_of(const nlohmann::json& j) {
    auto it = j.find("logicalType");
    if (it == j.end() || !it->is_string()) return Node::kNone;
    static const std::unordered_map<std::string, Node::Logical> names = {
        {"decimal", Node::kDecimal},
        {"date", Node::kDate},
        {"time-millis", Node::kTimeMillis},
        {"time-micros", Node::kTimeMicros},
        {"timestamp-millis", Node::kTimestampMillis},
        {"timestamp-micros", Node::kTimestampMicros},
        {"local-timestamp-millis", Node::kLocalTimestampMillis},
        {"local-timestamp-micros", Node::kLocalTimestampMicros},
        {"duration", Node::kDuration}};
    auto found = names.find(it->get<std::string>());
    return found == names.end() ? Node::kNone : found->second;
}

bool is_primitive(const std::string& name) {
    return name == "null" || name == "boolean" || name == "int" || name == "long" ||
           name == "float" || name == "double" || name == "bytes" || name == "string";
}

}  // namespace

const Node* TreeBuilder::build(const nlohmann::json& j, const std::string& ns) {
    if (j.is_string()) return reference(j.get<std::string>(), ns);
    if (j.is_array()) {
        Node* n = make();
        n->kind = Node::kUnion;
        for (const auto& branch : j) n->children.push_back(build(branch, ns));
        return n;
    }
    if (!j.is_object() || !j.contains("type"))
        throw Error(sqlstate::kInvalidParameterValue, "Avro schema has a malformed type");
    const nlohmann::json& type = j["type"];
    if (!type.is_string()) return build(type, ns);
    std::string t = type.get<std::string>();
    if (t == "record" || t == "error" || t == "enum" || t == "fixed") return named(j, t, ns);
    Node* n = make();
    if (t == "array") {
        n->kind = Node::kArray;
        n->children.push_back(build(j.at("items"), ns));
    } else if (t == "map") {
        n->kind = Node::kMap;
        n->children.push_back(build(j.at("values"), ns));
    } else if (is_primitive(t)) {
        n->kind = primitive_kind(t);
        set_logical(n, j);
    } else {
        return reference(t, ns);
    }
    return n;
}

Node* TreeBuilder::make() {
    nodes_->push_back(std::make_unique<Node>());
    return nodes_->back().get();
}

void TreeBuilder::set_logical(Node* n, const nlohmann::json& j) {
    n->logical = logical_of(j);
    if (n->logical == Node::kDecimal) {
        auto scale = j.find("scale");
        n->scale = scale != j.end() && scale->is_number_integer() ? scale->get<int>() : 0;
        if (n->scale < 0 || n->scale > 1000)
            throw Error(sqlstate::kInvalidParameterValue, "Avro decimal has a bad scale");
    }
}

const Node* TreeBuilder::named(const nlohmann::json& j, const std::string& t,
                               const std::string& ns) {
    std::string name = j.at("name").get<std::string>();
    std::string space = ns;
    auto n_it = j.find("namespace");
    if (n_it != j.end() && n_it->is_string()) space = n_it->get<std::string>();
    std::string full =
        name.find('.') != std::string::npos || space.empty() ? name : space + "." + name;
    std::string inner = full.substr(0, full.rfind('.') == std::string::npos ? 0 : full.rfind('.'));
    Node* n = make();
    if (top_name.empty() && depth_ == 0) top_name = full;
    by_name_[full] = n;  // before the fields: a record may refer to itself
    if (t == "record" || t == "error") {
        n->kind = Node::kRecord;
        ++depth_;
        for (const auto& field : j.at("fields")) {
            n->children.push_back(build(field.at("type"), inner));
            n->names.push_back(field.at("name").get<std::string>());
            auto d = field.find("default");
            n->has_default.push_back(d != field.end());
            n->defaults.push_back(d != field.end() ? d->dump() : std::string());
        }
        --depth_;
    } else if (t == "fixed") {
        n->kind = Node::kFixed;
        n->size = j.at("size").get<std::size_t>();
        set_logical(n, j);
    } else {
        n->kind = Node::kEnum;
        for (const auto& symbol : j.at("symbols")) n->names.push_back(symbol.get<std::string>());
    }
    return n;
}

const Node* TreeBuilder::reference(const std::string& name, const std::string& ns) {
    if (is_primitive(name)) {
        Node* n = make();
        n->kind = primitive_kind(name);
        return n;
    }
    auto it = by_name_.find(name);
    if (it == by_name_.end() && !ns.empty()) it = by_name_.find(ns + "." + name);
    if (it == by_name_.end())
        throw Error(sqlstate::kInvalidParameterValue,
                    "Avro schema refers to an unknown type \"" + name + "\"",
                    "A type defined in another subject's schema needs a reference to that "
                    "subject in the registry (the schema's references).");
    return it->second;
}

}  // namespace eventbox::registry::avro
