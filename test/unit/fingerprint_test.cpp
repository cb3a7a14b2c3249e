// RFC 8785 canonical JSON and record fingerprints (src/inbox/fingerprint.cpp), against the
// RFC's own examples.
#include "inbox/fingerprint.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace eventbox::inbox {
namespace {

std::string canonical(std::string_view json) {
    std::string out, error;
    EXPECT_TRUE(canonicalize_json(json, &out, &error)) << json << ": " << error;
    return out;
}

bool refused(std::string_view json) {
    std::string out, error;
    bool ok = canonicalize_json(json, &out, &error);
    if (!ok) {
        EXPECT_FALSE(error.empty());
    }
    return !ok;
}

double from_bits(uint64_t bits) {
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return d;
}

// RFC 8785 Appendix B: IEEE 754 doubles and their ECMAScript serialization.
TEST(EcmascriptNumber, Rfc8785AppendixB) {
    struct Case {
        uint64_t bits;
        const char* want;
    };
    const Case cases[] = {
        {0x0000000000000000, "0"},
        {0x8000000000000000, "0"},  // minus zero
        {0x0000000000000001, "5e-324"},
        {0x8000000000000001, "-5e-324"},
        {0x7fefffffffffffff, "1.7976931348623157e+308"},
        {0xffefffffffffffff, "-1.7976931348623157e+308"},
        {0x4340000000000000, "9007199254740992"},
        {0xc340000000000000, "-9007199254740992"},
        {0x4430000000000000, "295147905179352830000"},
        {0x44b52d02c7e14af5, "9.999999999999997e+22"},
        {0x44b52d02c7e14af6, "1e+23"},
        {0x44b52d02c7e14af7, "1.0000000000000001e+23"},
        {0x444b1ae4d6e2ef4e, "999999999999999700000"},
        {0x444b1ae4d6e2ef4f, "999999999999999900000"},
        {0x444b1ae4d6e2ef50, "1e+21"},
        {0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
        {0x3eb0c6f7a0b5ed8d, "0.000001"},
        {0x41b3de4355555553, "333333333.3333332"},
        {0x41b3de4355555554, "333333333.33333325"},
        {0x41b3de4355555555, "333333333.3333333"},
        {0x41b3de4355555556, "333333333.3333334"},
        {0x41b3de4355555557, "333333333.33333343"},
        {0xbecbf647612f3696, "-0.0000033333333333333333"},
        {0x43143ff3c1cb0959, "1424953923781206.2"},  // round to even
    };
    for (const Case& c : cases)
        EXPECT_EQ(ecmascript_number(from_bits(c.bits)), c.want) << std::hex << c.bits;
}

// Appendix B's NaN and Infinity have no JSON form: an error, as the RFC requires.
TEST(EcmascriptNumber, NanAndInfinityAreErrors) {
    EXPECT_THROW(ecmascript_number(from_bits(0x7fffffffffffffff)), std::invalid_argument);
    EXPECT_THROW(ecmascript_number(from_bits(0x7ff0000000000000)), std::invalid_argument);
    EXPECT_THROW(ecmascript_number(-std::numeric_limits<double>::infinity()),
                 std::invalid_argument);
}

// The plain/exponential boundaries of Number::toString.
TEST(EcmascriptNumber, NotationBoundaries) {
    EXPECT_EQ(ecmascript_number(1), "1");
    EXPECT_EQ(ecmascript_number(-42), "-42");
    EXPECT_EQ(ecmascript_number(1e20), "100000000000000000000");
    EXPECT_EQ(ecmascript_number(1e21), "1e+21");
    EXPECT_EQ(ecmascript_number(1.5e21), "1.5e+21");
    EXPECT_EQ(ecmascript_number(123.456), "123.456");
    EXPECT_EQ(ecmascript_number(1e-6), "0.000001");
    EXPECT_EQ(ecmascript_number(1e-7), "1e-7");
    EXPECT_EQ(ecmascript_number(1.25e-7), "1.25e-7");
    EXPECT_EQ(ecmascript_number(0.1), "0.1");
    EXPECT_EQ(ecmascript_number(0.1 + 0.2), "0.30000000000000004");
}

// RFC 8785 section 3.2.4: the example of the whole transformation.
TEST(CanonicalizeJson, Rfc8785Example) {
    const char* input = R"({
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
})";
    EXPECT_EQ(canonical(input),
              "{\"literals\":[null,true,false],"
              "\"numbers\":[333333333.3333333,1e+30,4.5,0.002,1e-27],"
              "\"string\":\"\xE2\x82\xAC$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}");
}

// RFC 8785 section 3.2.3: members sorted by their names' UTF-16 code units, so that U+1F600
// (a surrogate pair, 0xD83D...) sorts before U+FB33, unlike by code points or UTF-8 bytes.
TEST(CanonicalizeJson, Rfc8785SortingExample) {
    const char* input = R"({
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
})";
    EXPECT_EQ(canonical(input),
              "{\"\\r\":\"Carriage Return\","
              "\"1\":\"One\","
              "\"\xC2\x80\":\"Control\","
              "\"\xC3\xB6\":\"Latin Small Letter O With Diaeresis\","
              "\"\xE2\x82\xAC\":\"Euro Sign\","
              "\"\xF0\x9F\x98\x80\":\"Emoji: Grinning Face\","
              "\"\xEF\xAC\xB3\":\"Hebrew Letter Dalet With Dagesh\"}");
}

// Nested structures are canonicalized at every level; arrays keep their order.
TEST(CanonicalizeJson, NestedAndWhitespace) {
    EXPECT_EQ(canonical(" { \"b\" : [ 3 , {\"z\":1,\"a\":2} ] ,\n\t\"a\" : { } , \"c\":[] } "),
              R"({"a":{},"b":[3,{"a":2,"z":1}],"c":[]})");
    EXPECT_EQ(canonical("\"x\""), "\"x\"");
    EXPECT_EQ(canonical("-0"), "0");
    EXPECT_EQ(canonical("1e-400"), "0");  // below the smallest double: zero, as JSON.parse
    EXPECT_EQ(canonical("[1.0, 10e0, 0.1e1, 100e-2]"), "[1,10,1,1]");
    // Escapes RFC 8785 keeps, and characters it writes as they are.
    EXPECT_EQ(canonical("\"\\u0001\\u001f\\b\\f\\t\\u007f\\u00e9/\""),
              "\"\\u0001\\u001f\\b\\f\\t\x7f\xC3\xA9/\"");
}

// Two producers' spellings of one event get one fingerprint; another event gets another.
TEST(Fingerprint, SameEventSameId) {
    std::string scratch;
    std::string a = fingerprint(R"({"id": 42, "total": 99.50, "items": ["x", "y"]})", &scratch);
    std::string b = fingerprint("{\"items\":[\"x\",\"y\"],\"total\":99.5,\"id\":4.2e1}", &scratch);
    std::string c = fingerprint(R"({"id": 42, "total": 99.51, "items": ["x", "y"]})", &scratch);
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
    EXPECT_EQ(a.size(), 64u);
    EXPECT_EQ(a, sha256_hex(R"({"id":42,"items":["x","y"],"total":99.5})"));
    // Values that are not JSON are hashed as the bytes they are.
    EXPECT_EQ(fingerprint("not json", &scratch), sha256_hex("not json"));
    EXPECT_EQ(fingerprint(std::string("\xff\x00", 2), &scratch),
              sha256_hex(std::string("\xff\x00", 2)));
}

TEST(Fingerprint, Sha256KnownAnswers) {
    EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    EXPECT_EQ(sha256_hex("abc"),
              "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

// What is not I-JSON is refused (and then fingerprinted as raw bytes).
TEST(CanonicalizeJson, RefusesWhatIsNotIJson) {
    EXPECT_TRUE(refused(""));
    EXPECT_TRUE(refused("{"));
    EXPECT_TRUE(refused("{\"a\":1,}"));
    EXPECT_TRUE(refused("[1 2]"));
    EXPECT_TRUE(refused("01"));
    EXPECT_TRUE(refused("1."));
    EXPECT_TRUE(refused("+1"));
    EXPECT_TRUE(refused("NaN"));
    EXPECT_TRUE(refused("1e400"));                    // beyond the double range
    EXPECT_TRUE(refused("{\"a\":1,\"a\":2}"));        // a repeated name
    EXPECT_TRUE(refused("{\"\\u0061\":1,\"a\":2}"));  // the same name, spelled otherwise
    EXPECT_TRUE(refused("\"\\ud800\""));              // lone high surrogate
    EXPECT_TRUE(refused("\"\\udc00\""));              // lone low surrogate
    EXPECT_TRUE(refused("\"\\ud800\\u0041\""));       // high surrogate, then no low one
    EXPECT_TRUE(refused("\"a\x01\""));                // raw control character
    EXPECT_TRUE(refused("\"\xc3\x28\""));             // invalid UTF-8
    EXPECT_TRUE(refused("\"\xed\xa0\x80\""));         // an encoded surrogate
    EXPECT_TRUE(refused("\"\xc0\xaf\""));             // overlong
    EXPECT_TRUE(refused("\"\\x\""));
    EXPECT_TRUE(refused("tru"));
    EXPECT_TRUE(refused("1 2"));
    EXPECT_TRUE(refused(std::string(kMaxCanonicalDepth + 1, '[') +
                        std::string(kMaxCanonicalDepth + 1, ']')));
    std::string out, error;
    EXPECT_TRUE(canonicalize_json(
        std::string(kMaxCanonicalDepth, '[') + std::string(kMaxCanonicalDepth, ']'), &out, &error))
        << error;
}

}  // namespace
}  // namespace eventbox::inbox
