// The JSON scanner's token stream (src/messages/json_scan.cpp), from which the ingest worker builds
// payload jsonb with the calls jsonb_in makes: tokens, unescaped strings, numbers as written.
#include "messages/json_scan.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace eventbox {
namespace {

// The tokens of `text` as one line: {  }  [  ]  k:<key>  s:<string>  n:<number>  t  f  null.
std::string tokens_of(std::string_view text, std::size_t* depth = nullptr) {
    JsonTokens t;
    JsonScan scan = scan_json(text, {}, &t);
    if (!scan.valid) return "invalid: " + scan.error;
    std::string out;
    for (const JsonTokens::Token& token : t.tokens) {
        if (!out.empty()) out += ' ';
        std::string bytes(t.at(token), token.len);
        switch (token.kind) {
            case JsonTokens::kBeginObject:
                out += '{';
                break;
            case JsonTokens::kEndObject:
                out += '}';
                break;
            case JsonTokens::kBeginArray:
                out += '[';
                break;
            case JsonTokens::kEndArray:
                out += ']';
                break;
            case JsonTokens::kKey:
                out += "k:" + bytes;
                break;
            case JsonTokens::kString:
                out += "s:" + bytes;
                break;
            case JsonTokens::kNumber:
                out += "n:" + bytes;
                break;
            case JsonTokens::kTrue:
                out += 't';
                break;
            case JsonTokens::kFalse:
                out += 'f';
                break;
            case JsonTokens::kNull:
                out += "null";
                break;
        }
        if (token.kind <= JsonTokens::kEndArray || token.kind >= JsonTokens::kTrue)
            EXPECT_EQ(token.len, 0u);
        else
            EXPECT_EQ(t.at(token)[token.len], '\0') << "token text is NUL-terminated";
    }
    if (depth) *depth = t.depth;
    return out;
}

TEST(JsonTokens, ObjectsArraysAndScalars) {
    EXPECT_EQ(tokens_of(R"( {"a": [1, -2.5e+3, true, false, null], "b": {}, "c": []} )"),
              "{ k:a [ n:1 n:-2.5e+3 t f null ] k:b { } k:c [ ] }");
}

TEST(JsonTokens, TopLevelScalars) {
    EXPECT_EQ(tokens_of("\"x\""), "s:x");
    EXPECT_EQ(tokens_of(" -0 "), "n:-0");
    EXPECT_EQ(tokens_of("1E400"), "n:1E400");
    EXPECT_EQ(tokens_of("null"), "null");
}

TEST(JsonTokens, LongRunsEndAtEveryOffset) {
    // Plain runs are skipped 8 bytes at a time: a quote, an escape or a control character must
    // end the run wherever it falls in a word.
    for (std::size_t before = 0; before < 20; ++before) {
        std::string run(before, 'x');
        std::string tail(11, 'y');
        EXPECT_EQ(tokens_of("[\"" + run + "\"]"), "[ s:" + run + " ]") << before;
        EXPECT_EQ(tokens_of("[\"" + run + "\\n" + tail + "\"]"), "[ s:" + run + "\n" + tail + " ]")
            << before;
        EXPECT_EQ(tokens_of("[\"" + run + "\\\"" + tail + "\"]"), "[ s:" + run + "\"" + tail + " ]")
            << before;
        EXPECT_EQ(tokens_of("[\"" + run + "\x1f" + tail + "\"]"),
                  "invalid: control character in a string")
            << before;
        EXPECT_EQ(tokens_of("[\"" + run + "\t" + tail + "\"]"),
                  "invalid: control character in a string")
            << before;
        // Bytes at and around 0x20 and UTF-8 bytes are plain.
        std::string odd = run + " !\x7f\xc3\xa9" + tail;
        EXPECT_EQ(tokens_of("[\"" + odd + "\"]"), "[ s:" + odd + " ]") << before;
        // A run cut short by the end of the text.
        EXPECT_EQ(tokens_of("[\"" + run + tail), "invalid: unterminated string") << before;
    }
}

TEST(JsonTokens, StringsAreUnescaped) {
    EXPECT_EQ(tokens_of(R"(["a\"b\\c\/d\b\f\n\r\t", "\u00e4\u20ac\ud83d\ude80"])"),
              "[ s:a\"b\\c/d\b\f\n\r\t s:\xc3\xa4\xe2\x82\xac\xf0\x9f\x9a\x80 ]");
    EXPECT_EQ(tokens_of(R"({"k\u0041y":"plain run then \n escape"})"),
              "{ k:kAy s:plain run then \n escape }");
    EXPECT_EQ(tokens_of("\"caf\xc3\xa9\""), "s:caf\xc3\xa9");
    EXPECT_EQ(tokens_of(R"("")"), "s:");
}

TEST(JsonTokens, RepeatedKeysAreAllKept) {
    // jsonb keeps the last of repeated keys; the tokens hand all of them over, as the parser does.
    EXPECT_EQ(tokens_of(R"({"a":1,"a":2})"), "{ k:a n:1 k:a n:2 }");
}

TEST(JsonTokens, DepthIsTheDeepestNesting) {
    std::size_t depth = 99;
    tokens_of(R"({"a":[[{"b":[]}]],"c":1})", &depth);
    EXPECT_EQ(depth, 5u);
    tokens_of("1", &depth);
    EXPECT_EQ(depth, 0u);
}

TEST(JsonTokens, NoTokensForInvalidJson) {
    JsonTokens t;
    EXPECT_FALSE(scan_json(R"({"a":[1,2})", {}, &t).valid);
    EXPECT_TRUE(t.tokens.empty());
    EXPECT_TRUE(t.text.empty());
    EXPECT_FALSE(scan_json(R"(["\u0000"])", {}, &t).valid);
    EXPECT_FALSE(scan_json(R"(["\ud800x"])", {}, &t).valid);
    EXPECT_FALSE(scan_json("[\"a\x01\"]", {}, &t).valid);
    EXPECT_TRUE(t.tokens.empty());
}

TEST(JsonTokens, FieldsAreStillRead) {
    JsonTokens t;
    JsonScan scan = scan_json(R"({"id":"x\ty","n":{"id":"inner"},"type":7})", {"id", "type"}, &t);
    ASSERT_TRUE(scan.valid);
    EXPECT_EQ(scan.fields[0], std::optional<std::string>("x\ty"));
    EXPECT_EQ(scan.fields[1], std::optional<std::string>("7"));
    // The same without tokens.
    JsonScan plain = scan_json(R"({"id":"x\ty","n":{"id":"inner"},"type":7})", {"id", "type"});
    EXPECT_EQ(plain.fields, scan.fields);
}

TEST(JsonTokens, ReusedTokensStartEmpty) {
    JsonTokens t;
    ASSERT_TRUE(scan_json("[1,2,3]", {}, &t).valid);
    ASSERT_TRUE(scan_json("\"s\"", {}, &t).valid);
    ASSERT_EQ(t.tokens.size(), 1u);
    EXPECT_EQ(std::string(t.at(t.tokens[0])), "s");
}

}  // namespace
}  // namespace eventbox
