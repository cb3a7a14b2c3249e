// Protobuf records as JSON text (see registry/protobuf_json.hpp).
#include "registry/protobuf_json.hpp"

#include <google/protobuf/compiler/parser.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <map>

#include "core/error.hpp"

namespace eventbox::registry {

namespace pb = google::protobuf;

namespace {

// Collects the parser's and the pool's first error.
class Errors : public pb::io::ErrorCollector, public pb::DescriptorPool::ErrorCollector {
  public:
    void AddError(int line, int column, const std::string& message) override {
        if (first.empty())
            first = "line " + std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " +
                    message;
    }
    void AddError(const std::string& filename, const std::string& element, const pb::Message*,
                  ErrorLocation, const std::string& message) override {
        if (first.empty()) first = filename + " " + element + ": " + message;
    }
    std::string first;
};

// libprotobuf logs some refusals (invalid UTF-8 in a string field) to stderr, which is the
// server log: they are reported as the record's reason instead.
void quiet_log(pb::LogLevel, const char*, int, const std::string&) {}

uint64_t read_varint(const unsigned char* p, std::size_t len, std::size_t* pos, bool* ok) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*pos >= len) break;
        unsigned char b = p[(*pos)++];
        v |= static_cast<uint64_t>(b & 0x7f) << shift;
        if ((b & 0x80) == 0) return v;
    }
    *ok = false;
    return 0;
}

int64_t unzigzag(uint64_t v) {
    return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
}

}  // namespace

std::size_t read_message_indexes(const char* data, std::size_t len, std::vector<int>* indexes) {
    const auto* p = reinterpret_cast<const unsigned char*>(data);
    std::size_t pos = 0;
    bool ok = true;
    indexes->clear();
    int64_t count = unzigzag(read_varint(p, len, &pos, &ok));
    if (!ok || count < 0 || count > 100) return 0;
    if (count == 0) {
        indexes->push_back(0);
        return pos;
    }
    for (int64_t i = 0; i < count; ++i) {
        int64_t index = unzigzag(read_varint(p, len, &pos, &ok));
        if (!ok || index < 0 || index > 1000000) return 0;
        indexes->push_back(static_cast<int>(index));
    }
    return pos;
}

// The schema's own file in the pool (a reference's is its import path).
constexpr const char* kMainFile = "registry_schema.proto";
// How deep imports may nest (the registry's references are bounded before, in
// registry/references.hpp; this bounds what a caller passes).
constexpr std::size_t kMaxImportDepth = 32;

struct ProtobufSchema::Impl {
    pb::DescriptorPool pool;
    const pb::FileDescriptor* file = nullptr;
    pb::DynamicMessageFactory factory{&pool};
    std::map<const pb::Descriptor*, std::unique_ptr<pb::Message>> messages;
    std::map<const pb::Descriptor*, std::string> names;

    // Adds a well-known type's file (and its imports) from libprotobuf's own pool.
    bool add_well_known(const std::string& name) {
        if (pool.FindFileByName(name) != nullptr) return true;
        const pb::FileDescriptor* f = pb::DescriptorPool::generated_pool()->FindFileByName(name);
        if (f == nullptr || name.rfind("google/protobuf/", 0) != 0) return false;
        for (int i = 0; i < f->dependency_count(); ++i)
            if (!add_well_known(f->dependency(i)->name())) return false;
        pb::FileDescriptorProto proto;
        f->CopyTo(&proto);
        return pool.BuildFile(proto) != nullptr;
    }

    const pb::FileDescriptor* build(pb::FileDescriptorProto& proto, const Imports& imports,
                                    std::vector<std::string>* path);

    const pb::Descriptor* at(const std::vector<int>& indexes) const {
        const pb::Descriptor* d = nullptr;
        for (std::size_t k = 0; k < indexes.size(); ++k) {
            int i = indexes[k];
            if (k == 0) {
                if (i >= file->message_type_count()) return nullptr;
                d = file->message_type(i);
            } else {
                if (i >= d->nested_type_count()) return nullptr;
                d = d->nested_type(i);
            }
        }
        return d;
    }
};

namespace {

// Parses one .proto text into `proto` (named `name`). Throws eventbox::Error.
void parse_proto(const std::string& text, const std::string& name, pb::FileDescriptorProto* proto) {
    Errors errors;
    pb::io::ArrayInputStream input(text.data(), static_cast<int>(text.size()));
    pb::io::Tokenizer tokenizer(&input, &errors);
    pb::compiler::Parser parser;
    parser.RecordErrorsTo(&errors);
    if (!parser.Parse(&tokenizer, proto))
        throw Error(sqlstate::kInvalidParameterValue,
                    (name == kMainFile ? std::string("Protobuf schema")
                                       : "Protobuf reference \"" + name + "\"") +
                        " does not parse: " + errors.first);
    proto->set_name(name);
}

}  // namespace

// Builds `proto`'s imports (depth first: each file after the files it imports), then `proto`.
const pb::FileDescriptor* ProtobufSchema::Impl::build(pb::FileDescriptorProto& proto,
                                                      const Imports& imports,
                                                      std::vector<std::string>* path) {
    if (path->size() > kMaxImportDepth)
        throw Error(sqlstate::kInvalidParameterValue,
                    "Protobuf imports nest deeper than " + std::to_string(kMaxImportDepth));
    path->push_back(proto.name());
    for (const std::string& dependency : proto.dependency()) {
        if (pool.FindFileByName(dependency) != nullptr) continue;
        auto it = std::find_if(imports.begin(), imports.end(),
                               [&](const auto& i) { return i.first == dependency; });
        if (it == imports.end()) {
            if (add_well_known(dependency)) continue;
            throw Error(sqlstate::kInvalidParameterValue,
                        "Protobuf schema \"" + proto.name() + "\" imports \"" + dependency +
                            "\", which is neither one of the registry's references nor one of "
                            "Google's well-known types");
        }
        if (std::find(path->begin(), path->end(), dependency) != path->end())
            throw Error(sqlstate::kInvalidParameterValue,
                        "Protobuf imports form a cycle through \"" + dependency + "\"");
        pb::FileDescriptorProto imported;
        parse_proto(it->second, dependency, &imported);
        build(imported, imports, path);
    }
    path->pop_back();
    Errors errors;
    const pb::FileDescriptor* file = pool.BuildFileCollectingErrors(proto, &errors);
    if (file == nullptr)
        throw Error(sqlstate::kInvalidParameterValue,
                    (proto.name() == kMainFile ? std::string("Protobuf schema")
                                               : "Protobuf reference \"" + proto.name() + "\"") +
                        " does not build: " + errors.first);
    return file;
}

ProtobufSchema::ProtobufSchema(const std::string& text, const Imports& imports)
    : impl_(std::make_unique<Impl>()) {
    static bool quieted = false;
    if (!quieted) pb::SetLogHandler(quiet_log);
    quieted = true;
    pb::FileDescriptorProto proto;
    parse_proto(text, kMainFile, &proto);
    std::vector<std::string> path;
    impl_->file = impl_->build(proto, imports, &path);
    if (impl_->file->message_type_count() == 0)
        throw Error(sqlstate::kInvalidParameterValue, "Protobuf schema has no message type");
}

ProtobufSchema::~ProtobufSchema() {
    impl_->messages.clear();  // before the factory that made them
}

bool ProtobufSchema::from_json(const std::string& json, std::string* out,
                               std::string* error) const {
    const pb::Descriptor* d = impl_->file->message_type(0);
    std::unique_ptr<pb::Message>& message = impl_->messages[d];
    if (!message) message.reset(impl_->factory.GetPrototype(d)->New());
    message->Clear();
    pb::util::JsonParseOptions options;
    pb::util::Status status = pb::util::JsonStringToMessage(json, message.get(), options);
    if (!status.ok()) {
        *error = "payload is not a " + d->full_name() + ": " + std::string(status.message());
        return false;
    }
    out->push_back('\0');  // message-indexes [0]
    std::string bytes;
    {
        pb::io::StringOutputStream stream(&bytes);
        pb::io::CodedOutputStream coded(&stream);
        coded.SetSerializationDeterministic(true);
        message->SerializeToCodedStream(&coded);
    }
    out->append(bytes);
    return true;
}

std::string ProtobufSchema::message_name(const std::vector<int>& indexes) const {
    const pb::Descriptor* d = impl_->at(indexes);
    return d == nullptr ? std::string() : d->full_name();
}

bool ProtobufSchema::to_json(const char* data, std::size_t len, std::string* out,
                             std::string* error, const std::string** name) const {
    std::vector<int> indexes;
    std::size_t used = read_message_indexes(data, len, &indexes);
    if (used == 0) {
        *error = "Protobuf message-indexes are malformed";
        return false;
    }
    const pb::Descriptor* d = impl_->at(indexes);
    if (d == nullptr) {
        *error = "Protobuf message-indexes name no message type of the schema";
        return false;
    }
    std::unique_ptr<pb::Message>& message = impl_->messages[d];
    if (!message) message.reset(impl_->factory.GetPrototype(d)->New());
    message->Clear();
    if (!message->ParseFromArray(data + used, static_cast<int>(len - used))) {
        *error = "Protobuf data does not parse as " + d->full_name();
        return false;
    }
    pb::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    options.always_print_primitive_fields = true;
    std::string json;
    pb::util::Status status = pb::util::MessageToJsonString(*message, &json, options);
    if (!status.ok()) {
        *error = "Protobuf message has no JSON form: " + std::string(status.message());
        return false;
    }
    out->append(json);
    std::string& kept = impl_->names[d];
    if (kept.empty()) kept = d->full_name();
    *name = &kept;
    return true;
}

}  // namespace eventbox::registry
