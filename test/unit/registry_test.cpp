// The Schema Registry formats (src/registry/): the wire header, Avro data as JSON with the
// mapping of docs/guide/formats.md, Protobuf through its JSON mapping, the registry's answers
// and the bounded cache.
#include "registry/registry.hpp"

#include "core/error.hpp"
#include "inbox/record.hpp"
#include "outbox/relay_formats.hpp"
#include "outbox/send_formats.hpp"
#include "registry/avro_json.hpp"
#include "registry/protobuf_json.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace eventbox::registry {
namespace {

// Avro's zigzag varint of `v`.
std::string avro_long(int64_t v) {
    uint64_t z = (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
    std::string out;
    while (z >= 0x80) {
        out.push_back(static_cast<char>((z & 0x7f) | 0x80));
        z >>= 7;
    }
    out.push_back(static_cast<char>(z));
    return out;
}

std::string avro_string(const std::string& s) {
    return avro_long(static_cast<int64_t>(s.size())) + s;
}

std::string wire(uint32_t id, const std::string& body) {
    std::string out(1, '\0');
    out.push_back(static_cast<char>(id >> 24));
    out.push_back(static_cast<char>(id >> 16));
    out.push_back(static_cast<char>(id >> 8));
    out.push_back(static_cast<char>(id));
    return out + body;
}

std::string decode(const AvroSchema& s, const std::string& data, std::string* error = nullptr) {
    std::string out, why;
    bool ok = s.to_json(data.data(), data.size(), &out, &why);
    if (error != nullptr) *error = why;
    return ok ? out : "ERROR: " + why;
}

const char* kUser = R"({"type":"record","name":"User","namespace":"com.example","fields":[
    {"name":"id","type":"long"},
    {"name":"name","type":"string"},
    {"name":"email","type":["null","string"],"default":null},
    {"name":"kind","type":{"type":"enum","name":"Kind","symbols":["A","B"]}},
    {"name":"tags","type":{"type":"array","items":"string"}},
    {"name":"attrs","type":{"type":"map","values":"int"}},
    {"name":"blob","type":"bytes"},
    {"name":"score","type":"double"},
    {"name":"ok","type":"boolean"}]})";

TEST(RegistryAvro, RecordMapsToAnObjectInFieldOrder) {
    AvroSchema s(kUser);
    EXPECT_EQ(s.full_name(), "com.example.User");
    std::string data = avro_long(42) + avro_string("Ann \"q\"") + avro_long(1) +
                       avro_string("a@x") + avro_long(1) + avro_long(2) + avro_string("t1") +
                       avro_string("t2") + avro_long(0) + avro_long(1) + avro_string("k") +
                       avro_long(7) + avro_long(0) + avro_string(std::string("\x00\xff\x10", 3));
    double score = 1.5;
    data.append(reinterpret_cast<const char*>(&score), 8);
    data.push_back('\1');
    EXPECT_EQ(decode(s, data),
              R"({"id":42,"name":"Ann \"q\"","email":"a@x","kind":"B","tags":["t1","t2"],)"
              R"("attrs":{"k":7},"blob":"AP8Q","score":1.5,"ok":true})");
}

TEST(RegistryAvro, NullUnionBranchIsPlainNull) {
    AvroSchema s(
        R"({"type":"record","name":"R","fields":[{"name":"e","type":["null","string"]}]})");
    EXPECT_EQ(decode(s, avro_long(0)), R"({"e":null})");
}

TEST(RegistryAvro, TruncatedAndTrailingBytesAreRefused) {
    AvroSchema s(kUser);
    std::string error;
    EXPECT_EQ(decode(s, avro_long(42) + avro_long(10) + "abc", &error).rfind("ERROR", 0), 0u);
    AvroSchema n(R"("long")");
    EXPECT_EQ(decode(n, avro_long(5)), "5");
    EXPECT_EQ(decode(n, avro_long(5) + "x", &error).rfind("ERROR", 0), 0u);
    EXPECT_NE(error.find("after its value"), std::string::npos) << error;
}

TEST(RegistryAvro, LogicalTypes) {
    AvroSchema s(R"({"type":"record","name":"L","fields":[
        {"name":"d","type":{"type":"int","logicalType":"date"}},
        {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
        {"name":"tu","type":{"type":"long","logicalType":"timestamp-micros"}},
        {"name":"lt","type":{"type":"long","logicalType":"local-timestamp-millis"}},
        {"name":"tm","type":{"type":"int","logicalType":"time-millis"}},
        {"name":"dec","type":{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}},
        {"name":"neg","type":{"type":"fixed","name":"F","size":2,"logicalType":"decimal","precision":4,"scale":3}},
        {"name":"u","type":{"type":"string","logicalType":"uuid"}}]})");
    std::string data = avro_long(19000) + avro_long(1700000000123) + avro_long(-1) + avro_long(0) +
                       avro_long(3723004) + avro_string(std::string("\x30\x39", 2)) +
                       std::string("\xff\xfe", 2) +
                       avro_string("6f1c7a2e-0000-4000-8000-000000000000");
    EXPECT_EQ(decode(s, data),
              R"({"d":"2022-01-08","ts":"2023-11-14T22:13:20.123Z",)"
              R"("tu":"1969-12-31T23:59:59.999999Z","lt":"1970-01-01T00:00:00.000",)"
              R"("tm":"01:02:03.004","dec":"123.45","neg":"-0.002",)"
              R"("u":"6f1c7a2e-0000-4000-8000-000000000000"})");
}

TEST(RegistryAvro, RecursiveAndNamedReferences) {
    AvroSchema s(R"({"type":"record","name":"Node","namespace":"n","fields":[
        {"name":"v","type":"int"},{"name":"next","type":["null","Node"]}]})");
    EXPECT_EQ(decode(s, avro_long(1) + avro_long(1) + avro_long(2) + avro_long(0)),
              R"({"v":1,"next":{"v":2,"next":null}})");
    EXPECT_EQ(s.full_name(), "n.Node");
}

TEST(RegistryAvro, BadSchemaThrows) {
    EXPECT_THROW(AvroSchema{R"({"type":"record","name":"X"})"}, Error);
    EXPECT_THROW(AvroSchema{"not json"}, Error);
    EXPECT_THROW(
        AvroSchema{R"({"type":"record","name":"X","fields":[{"name":"a","type":"Missing"}]})"},
        Error);
}

TEST(RegistryAvro, NonUtf8StringIsRefused) {
    AvroSchema s(R"("string")");
    std::string error;
    EXPECT_EQ(decode(s, avro_string("\xff"), &error).rfind("ERROR", 0), 0u);
    EXPECT_NE(error.find("UTF-8"), std::string::npos);
}

// JSON back to Avro: the decoder's output encodes to the bytes it was decoded from.
TEST(RegistryAvroEncode, RoundTripsTheMappingByteForByte) {
    AvroSchema s(kUser);
    std::string data = avro_long(42) + avro_string("Ann") + avro_long(0) + avro_long(0) +
                       avro_long(1) + avro_string("t") + avro_long(0) + avro_long(0) +
                       avro_string(std::string("\x01\x02", 2));
    double score = -2.25;
    data.append(reinterpret_cast<const char*>(&score), 8);
    data.push_back('\0');
    std::string json = decode(s, data), out, error;
    ASSERT_TRUE(s.from_json(json, &out, &error)) << error;
    EXPECT_EQ(out, data);
}

TEST(RegistryAvroEncode, LogicalTypesBackToTheirEncoding) {
    AvroSchema s(R"({"type":"record","name":"L","fields":[
        {"name":"d","type":{"type":"int","logicalType":"date"}},
        {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
        {"name":"dec","type":{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}},
        {"name":"neg","type":{"type":"fixed","name":"F","size":2,"logicalType":"decimal","precision":4,"scale":3}},
        {"name":"u","type":["null","long","string"]}]})");
    std::string data = avro_long(19000) + avro_long(1700000000123) +
                       avro_string(std::string("\x30\x39", 2)) + std::string("\xff\xfe", 2) +
                       avro_long(2) + avro_string("x");
    std::string json = decode(s, data), out, error;
    ASSERT_TRUE(s.from_json(json, &out, &error)) << error;
    EXPECT_EQ(out, data);
    out.clear();
    ASSERT_TRUE(s.from_json(R"({"d":"2022-01-08","ts":"2023-11-14T23:13:20.123+01:00",)"
                            R"("dec":"-0.5","neg":"0","u":7})",
                            &out, &error))
        << error;
    EXPECT_EQ(out, avro_long(19000) + avro_long(1700000000123) +
                       avro_string(std::string("\xce", 1)) + std::string("\0\0", 2) + avro_long(1) +
                       avro_long(7));
}

TEST(RegistryAvroEncode, RefusalsNameThePath) {
    AvroSchema s(kUser);
    std::string out, error;
    EXPECT_FALSE(s.from_json(R"({"id":"x"})", &out, &error));
    EXPECT_NE(error.find("$.id"), std::string::npos) << error;
    EXPECT_FALSE(s.from_json(R"({"id":1,"name":"a","kind":"Z","tags":[],"attrs":{},)"
                             R"("blob":"","score":1,"ok":true})",
                             &out, &error));
    EXPECT_NE(error.find("$.kind"), std::string::npos) << error;
    EXPECT_FALSE(s.from_json(R"({"id":1,"name":"a","kind":"A","tags":[],"attrs":{},)"
                             R"("blob":"","score":1,"ok":true,"extra":1})",
                             &out, &error));
    EXPECT_NE(error.find("$.extra"), std::string::npos) << error;
    out.clear();
    EXPECT_TRUE(s.from_json(R"({"id":1,"name":"a","kind":"A","tags":[],"attrs":{},)"
                            R"("blob":"","score":1,"ok":true})",
                            &out, &error))
        << error;  // email: its default
    EXPECT_FALSE(s.from_json("not json", &out, &error));
}

// key_format 'registry' in the inbox's classification (src/inbox/record.cpp): the key decoded,
// a key whose schema is not cached makes the record wait, a bad key makes it unparsable.
TEST(RegistryKeys, DecodedWaitingOrUnparsable) {
    Registry r(Config{});
    r.put(3, Registry::parse_response(3, R"({"schema":"\"string\""})", 1 << 20));
    inbox::Options options;
    options.registry = &r;
    options.registry_keys = true;
    std::string value = R"({"a":1})", key = wire(3, avro_string("k-1"));
    inbox::Record rec;
    rec.topic = "t";
    rec.value = value.data();
    rec.value_len = value.size();
    rec.key = key.data();
    rec.key_len = key.size();
    inbox::Classified c = inbox::classify(rec, options);
    EXPECT_TRUE(c.parsable);
    EXPECT_TRUE(c.key_decoded_ok);
    EXPECT_EQ(c.key_decoded, "\"k-1\"");
    std::string unknown = wire(4, avro_string("x"));
    rec.key = unknown.data();
    rec.key_len = unknown.size();
    c = inbox::classify(rec, options);
    EXPECT_TRUE(c.pending);
    EXPECT_EQ(c.pending_id, 4u);
    std::string plain = "k-2";
    rec.key = plain.data();
    rec.key_len = plain.size();
    c = inbox::classify(rec, options);
    EXPECT_FALSE(c.parsable);
    EXPECT_EQ(c.raw_len, value.size());
    EXPECT_EQ(c.note.rfind("key: value does not start with the Schema Registry magic byte", 0), 0u)
        << c.note;
    rec.key = nullptr;
    rec.key_len = 0;
    c = inbox::classify(rec, options);
    EXPECT_TRUE(c.parsable);
    EXPECT_FALSE(c.key_decoded_ok);
}

// A Debezium change event in Avro (the envelope's shape from Debezium's PostgreSQL connector
// documentation) under message_id_rule 'debezium': the envelope is read from the decoded record,
// the row from the decoded key, so the same change written again at another offset, or with
// another schema id of the same shape, gets the same message id.
TEST(RegistryCdc, DebeziumEnvelopeReadFromTheDecodedRecord) {
    const char* value_schema = R"({"type":"record","name":"Envelope",
      "namespace":"dbserver1.inventory.customers","fields":[
      {"name":"before","type":["null",{"type":"record","name":"Value","fields":[
        {"name":"id","type":"int"},{"name":"email","type":"string"}]}],"default":null},
      {"name":"after","type":["null","Value"],"default":null},
      {"name":"source","type":{"type":"record","name":"Source",
        "namespace":"io.debezium.connector.postgresql","fields":[
        {"name":"version","type":"string"},{"name":"connector","type":"string"},
        {"name":"name","type":"string"},{"name":"ts_ms","type":"long"},
        {"name":"db","type":"string"},{"name":"schema","type":"string"},
        {"name":"table","type":"string"},
        {"name":"txId","type":["null","long"],"default":null},
        {"name":"lsn","type":["null","long"],"default":null}]}},
      {"name":"op","type":"string"},
      {"name":"ts_ms","type":["null","long"],"default":null}]})";
    const char* key_schema = R"({"type":"record","name":"Key",
      "namespace":"dbserver1.inventory.customers","fields":[{"name":"id","type":"int"}]})";
    auto response = [](const char* schema) { return nlohmann::json{{"schema", schema}}.dump(); };
    Registry r(Config{});
    r.put(11, Registry::parse_response(11, response(value_schema), 1 << 20));
    r.put(12, Registry::parse_response(12, response(key_schema), 1 << 20));
    r.put(13, Registry::parse_response(13, response(value_schema), 1 << 20));
    AvroSchema envelope(value_schema), key_type(key_schema);
    std::string value, key, error;
    ASSERT_TRUE(envelope.from_json(
        R"({"before":null,"after":{"id":1004,"email":"annek@noanswer.org"},)"
        R"("source":{"version":"2.5.0.Final","connector":"postgresql","name":"dbserver1",)"
        R"("ts_ms":1559033904863,"db":"postgres","schema":"inventory","table":"customers",)"
        R"("txId":555,"lsn":24023128},"op":"c","ts_ms":1559033904863})",
        &value, &error))
        << error;
    ASSERT_TRUE(key_type.from_json(R"({"id":1004})", &key, &error)) << error;
    std::string value_wire = wire(11, value), key_wire = wire(12, key);
    inbox::Options options;
    options.registry = &r;
    options.registry_values = true;
    options.registry_keys = true;
    options.id_rule = inbox::IdRule::kDebezium;
    inbox::Record rec;
    rec.topic = "dbserver1.inventory.customers";
    rec.value = value_wire.data();
    rec.value_len = value_wire.size();
    rec.key = key_wire.data();
    rec.key_len = key_wire.size();
    rec.offset = 7;
    inbox::Classified c = inbox::classify(rec, options);
    ASSERT_TRUE(c.parsable) << c.note;
    ASSERT_TRUE(c.event_type.has_value());
    EXPECT_EQ(*c.event_type, "create");
    EXPECT_FALSE(c.transport_id);
    EXPECT_EQ(c.message_id.rfind("postgresql:dbserver1:postgres.inventory.customers:"
                                 "lsn=24023128,txId=555:c:",
                                 0),
              0u)
        << c.message_id;
    // Replayed at another offset, written with another id of the same schema: the same id.
    std::string again = wire(13, value);
    rec.value = again.data();
    rec.value_len = again.size();
    rec.offset = 900;
    inbox::Classified replay = inbox::classify(rec, options);
    EXPECT_EQ(replay.message_id, c.message_id);
    // The tombstone after a delete is not stored.
    rec.value = nullptr;
    rec.value_len = 0;
    EXPECT_TRUE(inbox::classify(rec, options).skip);
}

// send()'s check (src/outbox/send_formats.cpp): topics found by name; without the schema at
// hand (here: no registry URL, so the subject cannot be fetched) nothing is refused.
TEST(SendFormats, LooksUpTopicsAndPassesWhatItCannotCheck) {
    outbox::FormatCheck check;
    EXPECT_TRUE(check.empty());
    check.configure({{"b", "b-value", 0, "", 0}, {"a", "", 0, "a-key", 2}}, "|", Config{});
    EXPECT_TRUE(check.same_settings("", ""));
    EXPECT_FALSE(check.same_settings("http://r", ""));
    check.configure({{"b", "b-value", 0, "", 0}, {"a", "", 0, "a-key", 2}}, "http://r|x=1",
                    Config{});
    EXPECT_TRUE(check.same_settings("http://r", "x=1"));
    EXPECT_FALSE(check.same_settings("http://r", "x=2"));
    EXPECT_FALSE(check.same_settings("http://r|x", "1"));
    ASSERT_FALSE(check.empty());
    ASSERT_NE(check.format("a"), nullptr);
    EXPECT_EQ(check.format("a")->key_version, 2);
    ASSERT_NE(check.format("b"), nullptr);
    EXPECT_EQ(check.format("b")->value_subject, "b-value");
    EXPECT_EQ(check.format("c"), nullptr);
    EXPECT_EQ(check.format(""), nullptr);
    std::string bad = R"({"id": 1})";
    for (int i = 0; i < 3; ++i) {
        outbox::FormatVerdict v =
            check.check(*check.format("b"), bad.data(), bad.size(), nullptr, 0, 1000 + i);
        EXPECT_FALSE(v.refused) << v.reason;
    }
    check.configure({}, "|", Config{});
    EXPECT_TRUE(check.empty());
}

TEST(RegistryWire, Header) {
    uint32_t id = 0;
    std::string why;
    std::string w = wire(0x01020304, "x");
    EXPECT_TRUE(read_header(w.data(), w.size(), &id, &why));
    EXPECT_EQ(id, 0x01020304u);
    EXPECT_FALSE(read_header("{\"a\":1}", 7, &id, &why));
    EXPECT_NE(why.find("magic byte"), std::string::npos);
    EXPECT_FALSE(read_header("\0\0\0", 3, &id, &why));
    EXPECT_NE(why.find("shorter"), std::string::npos);
}

TEST(RegistryWire, UrlWithoutCredentials) {
    EXPECT_EQ(url_for_messages("http://u:secret@host:8081/x"), "http://host:8081/x");
    EXPECT_EQ(url_for_messages("http://host:8081"), "http://host:8081");
}

TEST(RegistryOptions, KnownKeysAndRefusals) {
    Config c;
    parse_options("basic.auth.user.info=u:p,request.timeout.ms=500,cache.max.schemas=10", &c);
    EXPECT_EQ(c.user_info, "u:p");
    EXPECT_EQ(c.timeout_ms, 500);
    EXPECT_EQ(c.max_schemas, 10u);
    try {
        parse_options("basic.auth.user.info=secret,bogus=secret2", &c);
        FAIL();
    } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()).find("secret"), std::string::npos);
    }
}

TEST(RegistryOptions, ConfigKeepsWhyOptionsAreUnusable) {
    Config good = make_config("http://127.0.0.1:8081", "request.timeout.ms=500");
    EXPECT_EQ(good.url, "http://127.0.0.1:8081");
    EXPECT_EQ(good.timeout_ms, 500);
    EXPECT_TRUE(good.invalid.empty());
    Config bad = make_config("http://127.0.0.1:8081", "basic.auth.user.info=secret,bogus=secret2");
    EXPECT_EQ(bad.url, "http://127.0.0.1:8081");
    EXPECT_NE(bad.invalid.find("bogus"), std::string::npos);
    EXPECT_EQ(bad.invalid.find("secret"), std::string::npos);
}

const char* kProto = R"(syntax = "proto3";
package shop.v1;
import "google/protobuf/timestamp.proto";
message Order {
  string id = 1;
  int64 amount_cents = 2;
  repeated string items = 3;
  google.protobuf.Timestamp at = 4;
  message Line { string sku = 1; }
  Line first = 5;
}
message Refund { string order_id = 1; }
)";

TEST(RegistryProtobuf, MessageIndexes) {
    std::vector<int> ix;
    EXPECT_EQ(read_message_indexes("\0", 1, &ix), 1u);
    EXPECT_EQ(ix, std::vector<int>{0});
    EXPECT_EQ(read_message_indexes("\x04\x02\x00", 3, &ix), 3u);  // [1, 0]
    EXPECT_EQ(ix, (std::vector<int>{1, 0}));
    EXPECT_EQ(read_message_indexes("\x80", 1, &ix), 0u);
}

TEST(RegistryProtobuf, DecodesByIndexesWithTheJsonMapping) {
    ProtobufSchema s(kProto, {});
    EXPECT_EQ(s.message_name({0}), "shop.v1.Order");
    EXPECT_EQ(s.message_name({0, 0}), "shop.v1.Order.Line");
    EXPECT_EQ(s.message_name({1}), "shop.v1.Refund");
    // Order{id:"o1", amount_cents:250, items:["a"], at:{seconds:1}, first:{sku:"s"}}
    std::string msg = std::string(
        "\x0a\x02o1\x10\xfa\x01\x1a\x01"
        "a\x22\x02\x08\x01\x2a\x03\x0a\x01s");
    std::string out, why;
    const std::string* name = nullptr;
    std::string data = std::string("\0", 1) + msg;
    ASSERT_TRUE(s.to_json(data.data(), data.size(), &out, &why, &name)) << why;
    EXPECT_EQ(*name, "shop.v1.Order");
    EXPECT_EQ(nlohmann::json::parse(out),
              nlohmann::json::parse(R"({"id":"o1","amount_cents":"250","items":["a"],)"
                                    R"("at":"1970-01-01T00:00:01Z","first":{"sku":"s"}})"));
    std::string refund = std::string("\x02\x02\x0a\x02o9", 6);  // indexes [1]
    out.clear();
    ASSERT_TRUE(s.to_json(refund.data(), refund.size(), &out, &why, &name)) << why;
    EXPECT_EQ(out, R"({"order_id":"o9"})");
    EXPECT_EQ(*name, "shop.v1.Refund");
    std::string bad = std::string("\x02\x0a\x0a\x02o9", 6);  // indexes [5]
    EXPECT_FALSE(s.to_json(bad.data(), bad.size(), &out, &why, &name));
    std::string truncated = std::string("\0\x0a\x05o1", 4);
    EXPECT_FALSE(s.to_json(truncated.data(), truncated.size(), &out, &why, &name));
}

TEST(RegistryProtobuf, ForeignImportsAndSyntaxErrorsAreRefused) {
    EXPECT_THROW((ProtobufSchema{"syntax = \"proto3\"; import \"other.proto\"; message A {}", {}}),
                 Error);
    EXPECT_THROW((ProtobufSchema{"message {", {}}), Error);
}

TEST(RegistryResponses, TypesAndRefusals) {
    auto avro = Registry::parse_response(1, R"({"schema":"\"string\""})", 1 << 20);
    EXPECT_TRUE(avro->refused.empty());
    EXPECT_EQ(avro->type, SchemaType::kAvro);
    auto json = Registry::parse_response(
        2, R"({"schemaType":"JSON","schema":"{\"title\":\"Order\",\"type\":\"object\"}"})",
        1 << 20);
    EXPECT_EQ(json->type, SchemaType::kJson);
    EXPECT_EQ(json->name, "Order");
    auto bad = Registry::parse_response(3, R"({"schema":"{\"type\":\"nope\"}"})", 1 << 20);
    EXPECT_FALSE(bad->refused.empty());
    auto odd = Registry::parse_response(4, R"({"schemaType":"XML","schema":"x"})", 1 << 20);
    EXPECT_NE(odd->refused.find("unsupported"), std::string::npos);
    auto big = Registry::parse_response(5, R"({"schema":"\"string\""})", 4);
    EXPECT_NE(big->refused.find("exceeds"), std::string::npos);
    // References: a JSON Schema's are not needed (usable), an Avro schema's must be fetched
    // first (registry/references.hpp).
    const char* refs = R"("references":[{"name":"Address","subject":"address","version":1}])";
    auto json_refs = Registry::parse_response(
        6,
        std::string(R"({"schemaType":"JSON","schema":"{\"title\":\"Customer\",)"
                    R"(\"properties\":{\"home\":{\"$ref\":\"Address\"}}}",)") +
            refs + "}",
        1 << 20);
    EXPECT_TRUE(json_refs->refused.empty()) << json_refs->refused;
    EXPECT_EQ(json_refs->name, "Customer");
    auto avro_refs = Registry::parse_response(
        7,
        std::string(R"({"schema":"{\"type\":\"record\",\"name\":\"C\",\"fields\":[]}",)") + refs +
            "}",
        1 << 20);
    EXPECT_NE(avro_refs->refused.find("references were not fetched"), std::string::npos);
}

TEST(RegistryDecode, PendingThenDecodedThenRefused) {
    Registry r(Config{});  // no URL: fetches fail at once, in transport
    std::string w = wire(7, avro_string("hi")), json;
    Decoded d = r.decode(w.data(), w.size(), &json);
    EXPECT_EQ(d.status, Decoded::kPending);
    EXPECT_EQ(d.id, 7u);
    EXPECT_NE(r.failure(7).find("schema_registry_url"), std::string::npos);
    r.put(7, Registry::parse_response(7, R"({"schema":"\"string\""})", 1 << 20));
    d = r.decode(w.data(), w.size(), &json);
    ASSERT_EQ(d.status, Decoded::kOk) << d.reason;
    EXPECT_EQ(json, "\"hi\"");
    r.put(8, Registry::parse_response(8, R"({"schema":"bad"})", 1 << 20));
    std::string w8 = wire(8, "x");
    d = r.decode(w8.data(), w8.size(), &json);
    EXPECT_EQ(d.status, Decoded::kBad);
    EXPECT_NE(d.reason.find("schema id 8"), std::string::npos);
    std::string not_wire = "{}";
    d = r.decode(not_wire.data(), not_wire.size(), &json);
    EXPECT_EQ(d.status, Decoded::kBad);
}

TEST(RegistryCache, BoundedByEntriesButKeepsTheLastRound) {
    Config c;
    c.max_schemas = 300;
    Registry r(c);
    for (uint32_t id = 0; id < 10000; ++id)
        r.put(id, Registry::parse_response(id, R"({"schema":"\"string\""})", 1 << 20));
    EXPECT_EQ(r.cached_count(), 300u);
    EXPECT_TRUE(r.cached(9999));
    EXPECT_FALSE(r.cached(0));
    c.max_schemas = 1;
    Registry small(c);
    for (uint32_t id = 0; id < 1000; ++id)
        small.put(id, Registry::parse_response(id, R"({"schema":"\"string\""})", 1 << 20));
    EXPECT_EQ(small.cached_count(), kMaxFetches);
    EXPECT_TRUE(small.cached(999 - kMaxFetches + 1));
}

}  // namespace
}  // namespace eventbox::registry

namespace eventbox::relay {
namespace {

class Recorder final : public Sink {
  public:
    Produced produce(const Row& row, std::string&) override {
        payloads.emplace_back(row.payload, row.payload_len);
        return Produced::kQueued;
    }
    std::vector<std::string> payloads;
};

Row json_row(const char* topic, const std::string& payload) {
    Row r;
    r.id = 1;
    r.topic = topic;
    r.payload = payload.data();
    r.payload_len = payload.size();
    return r;
}

// Topics without a format pass through; a format's subject is fetched before its rows go (the
// row waits, as kBusy), and a registry that cannot be asked fails the attempt with the reason.
TEST(RelayFormats, PassThroughWaitThenFailWithoutARegistry) {
    Recorder kafka;
    FormatSink sink(kafka, registry::Config{}, {TopicFormat{"avro", "avro-value", 0, "", 0}},
                    [] { return int64_t{0}; });
    std::string payload = R"({"a":1})", error;
    EXPECT_EQ(sink.produce(json_row("plain", payload), error), Produced::kQueued);
    ASSERT_EQ(kafka.payloads.size(), 1u);
    EXPECT_EQ(kafka.payloads[0], payload);
    EXPECT_EQ(sink.produce(json_row("avro", payload), error), Produced::kBusy);
    EXPECT_EQ(sink.produce(json_row("avro", payload), error), Produced::kFailed);
    EXPECT_NE(error.find("schema_registry_url is empty"), std::string::npos) << error;
    EXPECT_EQ(kafka.payloads.size(), 1u);
}

}  // namespace
}  // namespace eventbox::relay
