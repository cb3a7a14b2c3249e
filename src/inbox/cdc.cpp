// Message ids and event types of change-data-capture records (see inbox/cdc.hpp).
#include "inbox/cdc.hpp"

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "inbox/fingerprint.hpp"

namespace eventbox::inbox {

namespace {

using nlohmann::json;

// Containers nested deeper than this are dropped while parsing: the fields the rules read are
// at depth 4 at most, and a tree of bounded depth is destroyed without deep recursion.
constexpr int kMaxParseDepth = 32;

// The value's JSON, or a discarded value when it is not JSON (or absent).
json parse(const char* data, std::size_t len) {
    if (data == nullptr) return json(json::value_t::discarded);
    json::parser_callback_t shallow = [](int depth, json::parse_event_t, json&) {
        return depth <= kMaxParseDepth;
    };
    return json::parse(data, data + len, shallow, false);
}

// A member of object `j`, or nullptr.
const json* member(const json& j, const char* name) {
    if (!j.is_object()) return nullptr;
    auto it = j.find(name);
    return it == j.end() ? nullptr : &*it;
}

// A scalar as it reads in an id: a string as is, a number or boolean as JSON writes it; ""
// for null, absent or a container.
std::string scalar(const json* j) {
    if (j == nullptr || j->is_null() || j->is_structured()) return "";
    if (j->is_string()) return j->get<std::string>();
    return j->dump();
}

// The row of a change: 32 hex digits of the SHA-256 of the key's canonical JSON (its bytes when
// it is not JSON); without a key, of the row image `image` (the after or before object).
std::string row_of(const ChangeRecord& r, const json* image) {
    std::string scratch;
    if (r.key != nullptr && r.key_len > 0)
        return fingerprint(std::string_view(r.key, r.key_len), &scratch).substr(0, 32);
    std::string text = image != nullptr ? image->dump() : "null";
    return fingerprint(text, &scratch).substr(0, 32);
}

// `id` itself, or "<prefix>:sha256:<hex>" when it is too long to be a message id.
std::string bounded(std::string id, std::string_view prefix) {
    if (id.size() <= kMaxChangeIdBytes) return id;
    return std::string(prefix) + ":sha256:" + sha256_hex(id);
}

// The source fields that say where a connector's change is in its database's log.
const std::vector<const char*>* position_fields(std::string_view connector) {
    static const std::vector<const char*> postgresql{"lsn", "txId"};
    static const std::vector<const char*> mysql{"file", "pos", "row"};
    static const std::vector<const char*> sqlserver{"change_lsn", "commit_lsn", "event_serial_no"};
    if (connector == "postgresql") return &postgresql;
    if (connector == "mysql") return &mysql;
    if (connector == "sqlserver") return &sqlserver;
    return nullptr;
}

std::string debezium_type(std::string_view op) {
    if (op == "c") return "create";
    if (op == "u") return "update";
    if (op == "d") return "delete";
    if (op == "r") return "read";
    if (op == "t") return "truncate";
    if (op == "m") return "message";
    return std::string(op);
}

}  // namespace

ChangeEvent debezium_event(const ChangeRecord& r) {
    ChangeEvent out;
    if (r.value == nullptr) {
        out.kind = ChangeEvent::Kind::kSkip;
        out.skipped = "tombstone";
        return out;
    }
    json value = parse(r.value, r.value_len);
    // With schemas (the JSON converter's default) the event is the envelope's payload.
    const json* event = &value;
    const json* payload = member(value, "payload");
    if (payload != nullptr && payload->is_object() && member(value, "schema") != nullptr)
        event = payload;
    const json* op = member(*event, "op");
    const json* source = member(*event, "source");
    if (op == nullptr || !op->is_string() || source == nullptr || !source->is_object()) return out;
    std::string connector = scalar(member(*source, "connector"));
    const std::vector<const char*>* fields = position_fields(connector);
    if (fields == nullptr) return out;
    std::string position;
    bool any = false;
    for (const char* f : *fields) {
        std::string v = scalar(member(*source, f));
        any = any || !v.empty();
        if (!position.empty()) position += ",";
        position += std::string(f) + "=" + v;
    }
    if (!any) return out;
    std::string table;
    for (const char* part : {"db", "schema", "table"}) {
        std::string v = scalar(member(*source, part));
        if (v.empty()) continue;
        if (!table.empty()) table += ".";
        table += v;
    }
    std::string op_code = op->get<std::string>();
    const json* image = member(*event, op_code == "d" ? "before" : "after");
    out.kind = ChangeEvent::Kind::kEvent;
    out.message_id = bounded(connector + ":" + scalar(member(*source, "name")) + ":" + table + ":" +
                                 position + ":" + op_code + ":" + row_of(r, image),
                             connector);
    out.event_type = debezium_type(op_code);
    return out;
}

ChangeEvent cockroachdb_event(const ChangeRecord& r) {
    ChangeEvent out;
    json value = parse(r.value, r.value_len);
    const json* after = member(value, "after");
    if (after == nullptr) {
        if (member(value, "resolved") != nullptr) {
            out.kind = ChangeEvent::Kind::kSkip;
            out.skipped = "resolved";
        }
        return out;
    }
    std::string updated = scalar(member(value, "updated"));
    if (updated.empty()) return out;
    const json* before = member(value, "before");
    out.kind = ChangeEvent::Kind::kEvent;
    out.message_id =
        bounded("cockroachdb:" + std::string(r.topic) + ":" + updated + ":" + row_of(r, after),
                "cockroachdb");
    if (after->is_null())
        out.event_type = "delete";
    else if (before == nullptr)
        out.event_type = "upsert";
    else
        out.event_type = before->is_null() ? "create" : "update";
    return out;
}

}  // namespace eventbox::inbox
