// Avro values written straight into the JSON scanner's tokens (registry/avro_json.hpp,
// registry/json_text.hpp): for a corpus of schemas and records, the text is what the walker that
// wrote JSON text wrote before the tokens (the expected texts below were printed by it), the
// tokens are exactly those scan_json() makes of that text, the top-level fields the same, and
// every refusal the same.
#include "registry/avro_json.hpp"

#include "inbox/record.hpp"
#include "messages/json_scan.hpp"
#include "registry/json_text.hpp"
#include "registry/registry.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace eventbox::registry {
namespace {

struct Case {
    const char* schema;
    const char* hex;   // the record's Avro binary
    bool ok;           // decoded, else refused
    const char* text;  // the JSON text, or the refusal (its start for Avro C's own)
};

// Written with a small Avro encoder of their own: nested unions, maps and arrays, strings with
// escapes and non-ASCII, NaN, infinities, -0, extremes of float and double, decimals (bytes and
// fixed; positive, negative, zero, scales 0-4), dates, times and timestamps (before 1970, year 1
// and 9999), durations, fixed, bytes, enums, a union of logical types, nesting beyond 64; refused:
// a non-UTF-8 string, a non-UTF-8 map key, a NUL, a union branch and an enum symbol out of range,
// truncated data, trailing bytes, a map with a repeated key (Avro C keeps one entry).
const char* const kSchema0 =
    R"({"type": "record", "name": "N", "namespace": "t", "fields": [{"name": "u", "type": ["null", {"type": "record", "name": "In", "fields": [{"name": "m", "type": {"type": "map", "values": ["null", "long", {"type": "array", "items": "string"}]}}]}, {"type": "map", "values": "double"}]}, {"name": "a", "type": {"type": "array", "items": ["null", "string", "double"]}}]})";
const char* const kSchema1 =
    R"({"type": "record", "name": "Fl", "fields": [{"name": "f", "type": "float"}, {"name": "d", "type": "double"}]})";
const char* const kSchema2 =
    R"({"type": "record", "name": "Lg", "namespace": "x.y", "fields": [{"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 2}}, {"name": "dec0", "type": {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 0}}, {"name": "fdec", "type": {"type": "fixed", "name": "FD", "size": 8, "logicalType": "decimal", "precision": 18, "scale": 4}}, {"name": "date", "type": {"type": "int", "logicalType": "date"}}, {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}}, {"name": "tu", "type": {"type": "long", "logicalType": "time-micros"}}, {"name": "tsm", "type": {"type": "long", "logicalType": "timestamp-millis"}}, {"name": "tsu", "type": {"type": "long", "logicalType": "timestamp-micros"}}, {"name": "ltm", "type": {"type": "long", "logicalType": "local-timestamp-millis"}}, {"name": "ltu", "type": {"type": "long", "logicalType": "local-timestamp-micros"}}, {"name": "dur", "type": {"type": "fixed", "name": "Dur", "size": 12, "logicalType": "duration"}}, {"name": "fx", "type": {"type": "fixed", "name": "Fx", "size": 3}}, {"name": "b", "type": "bytes"}, {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["RED", "GREEN"]}}, {"name": "ou", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}, {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 3}]}]})";
const char* const kSchema3 =
    R"({"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": "long"}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}})";
const char* const kSchema4 = R"("string")";
const char* const kSchema5 = R"("long")";
const char* const kSchema6 = R"("int")";
const char* const kSchema7 = R"("boolean")";
const char* const kSchema8 = R"("null")";
const char* const kSchema9 = R"({"type": "map", "values": "string"})";
const char* const kSchema10 =
    R"({"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}, {"name": "type", "type": "string"}, {"name": "n", "type": "double"}, {"name": "o", "type": {"type": "map", "values": "long"}}, {"name": "b", "type": "boolean"}]})";

const Case kCases[] = {
    {kSchema0, "0000", true, "{\"u\":null,\"a\":[]}"},
    {kSchema0,
     "02060278000279020d027a040402610a62225c0a01000012000212c3a9e29883f09f988004000000000000f87f040"
     "00000000000f07f04000000000000f0ff040000000000000080049c7500883ce4377e040100000000000000049a99"
     "99999999b93f00",
     true,
     "{\"u\":{\"m\":{\"x\":null,\"y\":-7,\"z\":[\"a\",\"b\\\"\\\\\\n\\u0001\"]}},\"a\":[null,"
     "\"\xc3\xa9\xe2\x98\x83\xf0\x9f\x98\x80\",\"NaN\",\"Infinity\",\"-Infinity\",-0,1."
     "0000000000000001e+300,4.9406564584124654e-324,0.10000000000000001]}"},
    {kSchema0, "0404066bc3a9000000000000f83f0000000000000000400002020000", true,
     "{\"u\":{\"k\xc3\xa9\":1.5,\"\":2},\"a\":[\"\"]}"},
    {kSchema0, "0200020204fffe00", false, "Avro string is not valid UTF-8"},
    {kSchema0, "040204c328000000000000f03f0000", false, "Avro map key is not valid UTF-8"},
    {kSchema0, "020002020661006200", false, "Avro string is not valid UTF-8"},
    {kSchema0, "0a00", false, "Avro data does not match its schema"},
    {kSchema0, "020202780000", false, "Avro data does not match its schema"},
    {kSchema0, "000000", false, "Avro data has 1 bytes after its value"},
    {kSchema1, "0000c07f000000000000f87f", true, "{\"f\":\"NaN\",\"d\":\"NaN\"}"},
    {kSchema1, "0000807f000000000000f0ff", true, "{\"f\":\"Infinity\",\"d\":\"-Infinity\"}"},
    {kSchema1, "cdcccc3d9a9999999999b93f", true, "{\"f\":0.100000001,\"d\":0.10000000000000001}"},
    {kSchema1, "9976967e59f3f8c21f6ea581", true, "{\"f\":9.99999968e+37,\"d\":-1e-300}"},
    {kSchema1, "0000008000000054346f9d41", true, "{\"f\":-0,\"d\":123456789}"},
    {kSchema1, "000040400000000000004043", true, "{\"f\":3,\"d\":9007199254740992}"},
    {kSchema2, "0430390200ffffffffffffffff0000000000000001000000020000000300000000ff10000000", true,
     "{\"dec\":\"123.45\",\"dec0\":\"0\",\"fdec\":\"-0.0001\",\"date\":\"1970-01-01\",\"tm\":\"00:"
     "00:00.000\",\"tu\":\"00:00:00.000000\",\"tsm\":\"1970-01-01T00:00:00.000Z\",\"tsu\":\"1970-"
     "01-01T00:00:00.000000Z\",\"ltm\":\"1970-01-01T00:00:00.000\",\"ltu\":\"1970-01-01T00:00:00."
     "000000\",\"dur\":{\"months\":1,\"days\":2,\"milliseconds\":3},\"fx\":\"AP8Q\",\"b\":\"\","
     "\"e\":\"RED\",\"ou\":null}"},
    {kSchema2,
     "02fb1afe7116f0093c8c1f11b1c0f52e0000000005f5e0fff3e457feefb252feffbadd83050101f6a1abfef962808"
     "9818283898506ffffffff00000000070000006162638004000102030405060708090a0b0c0d0e0f10111213141516"
     "1718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f40414243444"
     "5464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f70717273"
     "7475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9fa0a1a"
     "2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0"
     "d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfef"
     "f0202ffdfe6a2e2a01c",
     true,
     "{\"dec\":\"-0.05\",\"dec0\":\"-123456789012345678901234567890\",\"fdec\":\"9999.9999\","
     "\"date\":\"0001-01-01\",\"tm\":\"23:59:59.999\",\"tu\":\"23:59:59.999999\",\"tsm\":\"1969-12-"
     "31T23:59:59.999Z\",\"tsu\":\"1969-12-31T23:59:59.999999Z\",\"ltm\":\"2023-11-14T22:13:20."
     "123\",\"ltu\":\"2023-11-14T22:13:20.123456\",\"dur\":{\"months\":4294967295,\"days\":0,"
     "\"milliseconds\":7},\"fx\":\"YWJj\",\"b\":"
     "\"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+"
     "P0BBQkNERUZHSElKS0xNTk9QUVJTVFVWV1hZWltcXV5fYGFiY2RlZmdoaWprbG1ub3BxcnN0dXZ3eHl6e3x9fn+"
     "AgYKDhIWGh4iJiouMjY6PkJGSk5SVlpeYmZqbnJ2en6ChoqOkpaanqKmqq6ytrq+wsbKztLW2t7i5uru8vb6/"
     "wMHCw8TFxsfIycrLzM3Oz9DR0tPU1dbX2Nna29zd3t/g4eLj5OXm5+jp6uvs7e7v8PHy8/T19vf4+fr7/P3+/"
     "w==\",\"e\":\"GREEN\",\"ou\":\"0001-01-01T00:00:00.000Z\"}"},
    {kSchema2,
     "02010207016345785d8a0000c082e6020202feeffea1fa9d73ffffddf2dfffdfdc010000000000000000000000000"
     "00001020302ff020404fa24",
     true,
     "{\"dec\":\"0.01\",\"dec0\":\"7\",\"fdec\":\"10000000000000.0000\",\"date\":\"9999-12-31\","
     "\"tm\":\"00:00:00.001\",\"tu\":\"00:00:00.000001\",\"tsm\":\"9999-12-31T23:59:59.999Z\","
     "\"tsu\":\"0001-01-01T00:00:00.000000Z\",\"ltm\":\"1970-01-01T00:00:00.000\",\"ltu\":\"1970-"
     "01-01T00:00:00.000000\",\"dur\":{\"months\":0,\"days\":0,\"milliseconds\":0},\"fx\":\"AQID\","
     "\"b\":\"/w==\",\"e\":\"GREEN\",\"ou\":\"-1.500\"}"},
    {kSchema2, "02000200000000000000000000000000000000000000000000000000000000616263000400", false,
     "Avro enum symbol 2 out of range"},
    {kSchema3,
     "020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020"
     "202020202020202020202020202020202020202020202020a00000000000000000000000000000000000000000000"
     "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
     "000",
     true,
     "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[5]]]]]]]]]]]]]]]]]]]]]]"
     "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"},
    {kSchema4, "1a746f7020e280a8206c6576656c", true, "\"top \xe2\x80\xa8 level\""},
    {kSchema5, "ffffffffffffffffff01", true, "-9223372036854775808"},
    {kSchema6, "feffffff0f", true, "2147483647"},
    {kSchema7, "01", true, "true"},
    {kSchema8, "", true, "null"},
    {kSchema9, "0608747970650454310469640278087479706504543200", false,
     "Avro data has 8 bytes after its value"},
    {kSchema10, "5406457674000000000000f03f02046964020000", true,
     "{\"id\":42,\"type\":\"Evt\",\"n\":1,\"o\":{\"id\":1},\"b\":false}"},
};

std::string unhex(const char* hex) {
    std::string out;
    for (const char* p = hex; p[0] != '\0' && p[1] != '\0'; p += 2)
        out.push_back(static_cast<char>(std::stoi(std::string(p, 2), nullptr, 16)));
    return out;
}

// Kind and bytes of every token, and the depth.
void expect_same_tokens(const JsonTokens& got, const JsonTokens& want, const std::string& what) {
    ASSERT_EQ(got.tokens.size(), want.tokens.size()) << what;
    EXPECT_EQ(got.depth, want.depth) << what;
    for (std::size_t i = 0; i < got.tokens.size(); ++i) {
        const JsonTokens::Token &g = got.tokens[i], &w = want.tokens[i];
        EXPECT_EQ(g.kind, w.kind) << what << " token " << i;
        EXPECT_EQ(std::string(got.at(g), g.len), std::string(want.at(w), w.len))
            << what << " token " << i;
        if (g.len > 0 || w.len > 0) {
            EXPECT_EQ(got.at(g)[g.len], '\0') << what << " token " << i;
        }
    }
}

const std::vector<std::string_view> kFields = {"id", "type"};

TEST(AvroTokens, TextIsTheTextWalkersForTheCorpus) {
    for (const Case& c : kCases) {
        AvroSchema schema(c.schema);
        std::string data = unhex(c.hex), out = "before:", error;
        bool ok = schema.to_json(data.data(), data.size(), &out, &error);
        ASSERT_EQ(ok, c.ok) << c.hex << ": " << error;
        if (ok) {
            EXPECT_EQ(out, std::string("before:") + c.text) << c.hex;
        } else {
            EXPECT_EQ(error.rfind(c.text, 0), 0u) << c.hex << ": " << error;
        }
    }
}

TEST(AvroTokens, TokensAreTheScannersOfTheText) {
    for (const Case& c : kCases) {
        AvroSchema schema(c.schema);
        std::string data = unhex(c.hex), error;
        JsonTokens tokens;
        bool ok = schema.to_tokens(data.data(), data.size(), &tokens, &error);
        ASSERT_EQ(ok, c.ok) << c.hex << ": " << error;
        if (!ok) {
            EXPECT_EQ(error.rfind(c.text, 0), 0u) << c.hex << ": " << error;
            continue;
        }
        JsonTokens scanned;
        JsonScan scan = scan_json(c.text, kFields, &scanned);
        ASSERT_TRUE(scan.valid) << scan.error;
        expect_same_tokens(tokens, scanned, c.hex);
        EXPECT_EQ(top_fields(tokens, kFields), scan.fields) << c.hex;
    }
}

TEST(AvroTokens, TokensAppendToWhatIsThere) {
    AvroSchema schema(kSchema1);  // {"f": float, "d": double}
    std::string data = unhex("0000c07f000000000000f87f"), error;
    JsonTokens tokens;
    ASSERT_TRUE(scan_json("[1]", {}, &tokens).valid);
    tokens.tokens.pop_back();  // as if the array held the record
    ASSERT_TRUE(schema.to_tokens(data.data(), data.size(), &tokens, &error)) << error;
    EXPECT_EQ(tokens.depth, 1u);
    std::string text;
    append_tokens_json(tokens, &text);
    EXPECT_EQ(text, R"([1,{"f":"NaN","d":"NaN"})");
}

// append_tokens_json() writes text that scans back into the same tokens; top_fields() reads
// what scan_json() reads, whatever the shape.
TEST(JsonTokensText, RoundTripsAndFields) {
    const char* texts[] = {
        R"({"id":"a\"b\\c\n\t\u0001é","type":"T","n":[1,2.5,-0,1e10,{"id":"inner"}]})",
        R"({"id":1.5,"type":{"a":[]},"x":{}})",
        R"({"id":"x","id":7,"type":null,"type":true})",
        R"({"type":"a","type":[1]})",
        R"({"id":-12,"type":false,"z":"\ud83d\ude00"})",
        R"([{"id":"not top"}])",
        R"("just a string")",
        "12.5e-3",
        "null",
        "{}",
        "[[],[{}],[[[]]]]",
    };
    for (const char* text : texts) {
        JsonTokens first, second;
        JsonScan scan = scan_json(text, kFields, &first);
        ASSERT_TRUE(scan.valid) << text;
        std::string written;
        append_tokens_json(first, &written);
        ASSERT_TRUE(scan_json(written, {}, &second).valid) << written;
        expect_same_tokens(second, first, text);
        EXPECT_EQ(top_fields(first, kFields), scan.fields) << text;
    }
    JsonTokens t;
    ASSERT_TRUE(scan_json(R"({"a" : [ 1 , "b" ] , "c":{"d":null}})", {}, &t).valid);
    std::string written;
    append_tokens_json(t, &written);
    EXPECT_EQ(written, R"({"a":[1,"b"],"c":{"d":null}})");
}

TEST(JsonTokensText, WriterRefusesWhatIsNotUtf8) {
    JsonTokens t;
    TokenWriter w(&t);
    w.begin_object();
    EXPECT_FALSE(w.key("\xc3\x28", 2));
    EXPECT_FALSE(w.string("a\0b", 3));
    EXPECT_FALSE(w.string("\xed\xa0\x80", 3));  // a surrogate
    EXPECT_TRUE(w.key("k", 1));
    EXPECT_TRUE(w.string("\xe2\x98\x83", 3));
    w.end_object();
    EXPECT_EQ(t.tokens.size(), 4u);
    EXPECT_EQ(t.depth, 1u);
}

std::string wire(uint32_t id, const std::string& body) {
    std::string out(1, '\0');
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(id >> shift));
    return out + body;
}

inbox::Record record_of(const std::string& value) {
    inbox::Record rec;
    rec.topic = "t";
    rec.value = value.data();
    rec.value_len = value.size();
    return rec;
}

// classify() of an Avro value: the payload's tokens written by the decoder (no text), the
// message id read from them, the schema's name as the event type; its text only for the CDC
// rules; a value the walker refuses unparsable with the reason and no tokens left.
TEST(AvroTokens, ClassifyTakesTheDecodersTokens) {
    Registry r(Config{});
    r.put(5, Registry::parse_response(5, nlohmann::json{{"schema", kSchema10}}.dump(), 1 << 20));
    r.put(6, Registry::parse_response(6, R"({"schema":"\"string\""})", 1 << 20));
    inbox::Options options;
    options.registry = &r;
    options.registry_values = true;
    options.message_id_field = "id";
    std::string value = wire(5, unhex("5406457674000000000000f03f02046964020000"));
    const char* text = R"({"id":42,"type":"Evt","n":1,"o":{"id":1},"b":false})";
    inbox::Classified c = inbox::classify(record_of(value), options);
    ASSERT_TRUE(c.parsable) << c.note;
    EXPECT_TRUE(c.keep_raw);
    EXPECT_EQ(c.raw_len, value.size());
    EXPECT_TRUE(c.decoded.empty());
    EXPECT_EQ(c.message_id, "42");
    EXPECT_EQ(c.event_type, std::optional<std::string>("R"));
    JsonTokens scanned;
    ASSERT_TRUE(scan_json(text, {}, &scanned).valid);
    expect_same_tokens(c.payload, scanned, "classified");

    options.id_rule = inbox::IdRule::kDebezium;
    c = inbox::classify(record_of(value), options);
    EXPECT_EQ(c.decoded, text);

    options.id_rule = inbox::IdRule::kDefault;
    std::string bad = wire(6, unhex("04fffe"));
    inbox::classify(record_of(bad), options, c);
    EXPECT_FALSE(c.parsable);
    EXPECT_EQ(c.note, "schema id 6: Avro string is not valid UTF-8");
    EXPECT_TRUE(c.payload.tokens.empty());
    EXPECT_TRUE(c.payload.text.empty());
    EXPECT_EQ(c.raw_len, bad.size());
}

}  // namespace
}  // namespace eventbox::registry
