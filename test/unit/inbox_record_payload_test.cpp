// Classification of Kafka records for the inbox (src/inbox/record.cpp), continued from
// inbox_record_test.cpp: what is stored as unparsable and what as JSON
// (docs/reference/bad-input.md), agreement with jsonb, UTF-8 validation, reuse of a row's buffers,
// fingerprints, change events.
#include "inbox/record.hpp"

#include "inbox/fingerprint.hpp"
#include "inbox_record_rec.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace eventbox::inbox {
namespace {

// ---- unparsable values --------------------------------------------------------------------

TEST(Unparsable, NullValueIsATombstone) {
    Classified c = Rec().tombstone().classify();
    EXPECT_FALSE(c.parsable);
    EXPECT_TRUE(c.raw_null);
    EXPECT_EQ(c.raw_len, 0u);
    EXPECT_EQ(c.note, "null value (tombstone)");
    EXPECT_TRUE(c.transport_id);
}

TEST(Unparsable, EmptyValue) {
    Classified c = Rec().value("").classify();
    EXPECT_FALSE(c.parsable);
    EXPECT_FALSE(c.raw_null);
    EXPECT_EQ(c.raw_len, 0u);
    EXPECT_EQ(c.note, "empty value");
}

TEST(Unparsable, OversizedValueKeepsTheFirstMaxBytesAndANote) {
    Options o;
    o.max_message_bytes = 10;
    Classified c = Rec().value(R"({"a":"123456"})").classify(o);  // 14 bytes of valid JSON
    EXPECT_FALSE(c.parsable);
    EXPECT_FALSE(c.raw_null);
    EXPECT_EQ(c.raw_len, 10u);
    EXPECT_EQ(c.note,
              "value of 14 bytes exceeds eventbox.max_message_bytes (10); raw_payload holds the "
              "first 10 bytes");
    EXPECT_TRUE(c.transport_id);
}

TEST(Unparsable, OversizedBeatsEveryOtherReason) {
    Options o;
    o.max_message_bytes = 2;
    Classified c = Rec().value("\xff\xff\xff").classify(o);
    EXPECT_EQ(c.raw_len, 2u);
    EXPECT_EQ(c.note.rfind("value of 3 bytes exceeds eventbox.max_message_bytes (2)", 0), 0u)
        << c.note;
}

TEST(Unparsable, ValueOfExactlyMaxBytesIsKept) {
    Options o;
    o.max_message_bytes = 14;
    Classified c = Rec().value(R"({"a":"123456"})").classify(o);
    EXPECT_TRUE(c.parsable);
    EXPECT_EQ(c.raw_len, 0u);
    EXPECT_EQ(c.note, "");
}

TEST(Unparsable, DefaultMaximumIsOneMillionBytes) {
    EXPECT_EQ(Options().max_message_bytes, 1000000u);
    std::string big = "\"" + std::string(1000000 - 2, 'x') + "\"";
    EXPECT_TRUE(Rec().value(big).classify().parsable);
    Classified c = Rec().value(big + " ").classify();
    EXPECT_FALSE(c.parsable);
    EXPECT_EQ(c.raw_len, 1000000u);
}

TEST(Unparsable, InvalidUtf8) {
    expect_unparsable("\xff", 1, "value is not valid UTF-8");
    expect_unparsable("{\"a\":\"\xc3\x28\"}", 10, "value is not valid UTF-8");
    expect_unparsable("\"\xed\xa0\x80\"", 5, "value is not valid UTF-8");  // surrogate
    expect_unparsable("\"\xc0\xaf\"", 4, "value is not valid UTF-8");      // overlong
    expect_unparsable(std::string("{}\0", 3), 3, "value is not valid UTF-8");
}

TEST(Unparsable, InvalidJson) {
    const std::vector<std::string> values = {"{",
                                             "}",
                                             "not json",
                                             "{'a':1}",
                                             "{\"a\":1,}",
                                             "[1,]",
                                             "{} x",
                                             "{}{}",
                                             "[1] [2]",
                                             "NaN",
                                             "Infinity",
                                             "-",
                                             "01",
                                             "1.",
                                             ".5",
                                             "+1",
                                             "0x10",
                                             "tru",
                                             "\"unterminated",
                                             "\"a\tb\"",
                                             "{\"a\"}",
                                             "{1:2}",
                                             "// c\n{}",
                                             "\"\\x41\"",
                                             "\"\\ud800\"",
                                             "\"\\udc00x\"",
                                             " ",
                                             "\n\t\r "};
    for (const std::string& v : values) expect_unparsable(v, v.size(), "value is not valid JSON");
}

TEST(Unparsable, EscapedNulCannotBeStoredInJsonb) {
    const std::string note = "value is not valid JSON: \\u0000 cannot be stored in jsonb";
    expect_unparsable(R"({"a":"\u0000"})", 14, note);
    expect_unparsable(R"(["x\u0000y"])", 12, note);
    expect_unparsable(R"({"\u0000":1})", 12, note);
}

TEST(Parsable, NumericRangeIsLeftToJsonbIn) {
    // Syntactically valid numbers pass the scan whatever their size: whether numeric can hold
    // them ('1e131072'::jsonb fails, '1e131071' does not) is for jsonb_in to say, and the ingest
    // worker stores a refused value as unparsable with jsonb's message (integration tests).
    for (const std::string v :
         {"1e1000000", "[1E+1000000]", "{\"n\":1e-1000000}", "1e99999999999999999999"}) {
        Classified c = Rec().value(v).classify();
        EXPECT_TRUE(c.parsable) << v;
    }
}

// ---- parsable values ----------------------------------------------------------------------

TEST(Parsable, ScalarsAndContainers) {
    for (const char* v :
         {"{}", "[]", "0", "-0", "42", "-1.25e-3", "1E2", "\"s\"", "\"\"", "null", "true", "false",
          "18446744073709551616", "123456789012345678901234567890.123456789"}) {
        expect_parsable(v);
    }
}

TEST(Parsable, NumbersWithinTheDoubleRange) {
    for (const char* v : {"1e308", "-1.7976931348623157e308", "1e-400", "1e-1000", "[2.5e-1000]",
                          "{\"n\":-1E-0001000}", "0.000000000000000000000000000000000000001"}) {
        expect_parsable(v);
    }
}

TEST(Parsable, SurroundingWhitespace) {
    expect_parsable(" {\"a\": 1} ");
    expect_parsable("\n\t\r[1, 2]\r\n");
}

TEST(Parsable, NestedDocuments) {
    expect_parsable(R"({"a":{"b":[1,{"c":[true,null,"x"]}]},"d":[[[[]]]],"e":{}})");
    std::string deep = std::string(200, '[') + std::string(200, ']');
    expect_parsable(deep);
}

TEST(Parsable, Unicode) {
    expect_parsable("{\"name\":\"caf\xc3\xa9 \xe6\xb3\xa8\xe6\x96\x87 \xf0\x9f\x98\x80\"}");
    expect_parsable(R"({"e":"caf\u00e9","smile":"\ud83d\ude00","nbsp":"\u00A0"})");
    expect_parsable("{\"caf\xc3\xa9\":1}");
    expect_parsable(R"(["\u0001","\u001f","\"\\\/\b\f\n\r\t"])");
}

TEST(Parsable, DuplicateKeysLastOneCounts) {
    Classified c =
        Rec().value(R"({"type":"a","type":"b","id":1,"id":2})").classify(with_field("id"));
    EXPECT_TRUE(c.parsable);
    EXPECT_EQ(c.event_type, std::optional<std::string>("b"));
    EXPECT_EQ(c.message_id, "2");
}

TEST(Parsable, DeeplyNestedValueDoesNotCrash) {
    // A classification must never bring the worker down, whatever the record holds.
    std::string deep = std::string(400000, '[') + std::string(400000, ']');
    Classified c = Rec().value(deep).classify();
    EXPECT_EQ(c.event_type, std::nullopt);
    EXPECT_TRUE(c.transport_id);
}

// ---- where classify disagrees with jsonb --------------------------------------------------
// Checked against PostgreSQL 15.20 (SELECT '<value>'::jsonb): classify must call a value
// parsable exactly when jsonb_in accepts it, or the payload of a good record is left NULL.

TEST(JsonbAgreement, EscapedBackslashFollowedByU0000IsStorable) {
    // SELECT '{"a":"\\u0000"}'::jsonb  ->  {"a": "\\u0000"}: a backslash and "u0000", no NUL.
    expect_parsable(R"({"a":"\\u0000"})");
    expect_parsable(R"(["\\\\u0000"])");
}

TEST(JsonbAgreement, NumbersBeyondTheDoubleRangeAreStorable) {
    // numeric has no double range: SELECT '1e309'::jsonb, '-1e309'::jsonb, '1e1000'::jsonb and
    // ('1' || repeat('0', 400))::jsonb all succeed.
    for (const std::string& v :
         {std::string("1e309"), std::string("-1e309"), std::string("1E+1000"),
          std::string("[2.5e1000]"), std::string("{\"n\":1e0001000}"), "1" + std::string(400, '0'),
          "{\"big\":-" + std::string(400, '9') + "}"}) {
        expect_parsable(v);
    }
}

TEST(JsonbAgreement, ExponentsBeyondOneThousandThatNumericAccepts) {
    // SELECT '1e-1001'::jsonb, '1e1001'::jsonb, '1e131071'::jsonb, '1e-16383'::jsonb all succeed.
    for (const char* v : {"1e-1001", "[1e-16383]", "1e1001", "{\"n\":9.9e131071}"}) {
        expect_parsable(v);
    }
}

TEST(JsonbAgreement, ByteOrderMarkIsNotJson) {
    // SELECT E'\xEF\xBB\xBF{}'::jsonb  ->  invalid input syntax for type json.
    Classified c = Rec().value("\xef\xbb\xbf{}").classify();
    EXPECT_FALSE(c.parsable);
    EXPECT_EQ(c.raw_len, 5u);
}

// ---- valid_utf8 ---------------------------------------------------------------------------

TEST(ValidUtf8, EmptyAndAscii) {
    EXPECT_TRUE(valid_utf8("", 0));
    EXPECT_TRUE(valid_utf8(nullptr, 0));
    EXPECT_TRUE(utf8("hello, world ~\x7f"));
    EXPECT_TRUE(utf8("\x01"));
}

TEST(ValidUtf8, NulIsRefused) {
    EXPECT_FALSE(utf8(std::string("\0", 1)));
    EXPECT_FALSE(utf8(std::string("ab\0cd", 5)));
    EXPECT_FALSE(utf8(std::string("\xc3\xa9\0", 3)));
    // The length counts, not the terminator.
    EXPECT_TRUE(valid_utf8("ab\0cd", 2));
}

TEST(ValidUtf8, BoundariesOfEachLength) {
    EXPECT_TRUE(utf8("\xc2\x80"));          // U+0080
    EXPECT_TRUE(utf8("\xdf\xbf"));          // U+07FF
    EXPECT_TRUE(utf8("\xe0\xa0\x80"));      // U+0800
    EXPECT_TRUE(utf8("\xed\x9f\xbf"));      // U+D7FF
    EXPECT_TRUE(utf8("\xee\x80\x80"));      // U+E000
    EXPECT_TRUE(utf8("\xef\xbf\xbd"));      // U+FFFD
    EXPECT_TRUE(utf8("\xef\xbf\xbf"));      // U+FFFF (noncharacter, but valid)
    EXPECT_TRUE(utf8("\xf0\x90\x80\x80"));  // U+10000
    EXPECT_TRUE(utf8("\xf0\x9f\x98\x80"));  // U+1F600
    EXPECT_TRUE(utf8("\xf4\x8f\xbf\xbf"));  // U+10FFFF
    EXPECT_TRUE(utf8("a\xc3\xa9z\xe2\x82\xac\xf0\x9f\x98\x80!"));
}

TEST(ValidUtf8, Overlongs) {
    EXPECT_FALSE(utf8("\xc0\x80"));          // U+0000 in two bytes
    EXPECT_FALSE(utf8("\xc0\xaf"));          // '/'
    EXPECT_FALSE(utf8("\xc1\xbf"));          // U+007F
    EXPECT_FALSE(utf8("\xe0\x80\x80"));      // U+0000 in three bytes
    EXPECT_FALSE(utf8("\xe0\x9f\xbf"));      // U+07FF in three bytes
    EXPECT_FALSE(utf8("\xf0\x80\x80\x80"));  // U+0000 in four bytes
    EXPECT_FALSE(utf8("\xf0\x8f\xbf\xbf"));  // U+FFFF in four bytes
}

TEST(ValidUtf8, Surrogates) {
    EXPECT_FALSE(utf8("\xed\xa0\x80"));              // U+D800
    EXPECT_FALSE(utf8("\xed\xaf\xbf"));              // U+DBFF
    EXPECT_FALSE(utf8("\xed\xb0\x80"));              // U+DC00
    EXPECT_FALSE(utf8("\xed\xbf\xbf"));              // U+DFFF
    EXPECT_FALSE(utf8("\xed\xa0\xbd\xed\xb8\x80"));  // CESU-8 pair for U+1F600
}

TEST(ValidUtf8, BeyondU10FFFF) {
    EXPECT_FALSE(utf8("\xf4\x90\x80\x80"));  // U+110000
    EXPECT_FALSE(utf8("\xf5\x80\x80\x80"));
    EXPECT_FALSE(utf8("\xf7\xbf\xbf\xbf"));
    EXPECT_FALSE(utf8("\xf8\x88\x80\x80\x80"));      // five-byte form
    EXPECT_FALSE(utf8("\xfc\x84\x80\x80\x80\x80"));  // six-byte form
    EXPECT_FALSE(utf8("\xfe"));
    EXPECT_FALSE(utf8("\xff"));
}

TEST(ValidUtf8, StrayContinuationBytes) {
    EXPECT_FALSE(utf8("\x80"));
    EXPECT_FALSE(utf8("\xbf"));
    EXPECT_FALSE(utf8("a\x80"));
    EXPECT_FALSE(utf8("\xc3\xa9\xa9"));  // one continuation too many
}

TEST(ValidUtf8, TruncatedSequences) {
    EXPECT_FALSE(utf8("\xc3"));
    EXPECT_FALSE(utf8("\xe2\x82"));
    EXPECT_FALSE(utf8("\xe2"));
    EXPECT_FALSE(utf8("\xf0\x9f\x98"));
    EXPECT_FALSE(utf8("\xf0\x9f"));
    EXPECT_FALSE(utf8("abc\xf0"));
    // Truncated, then followed by a byte that is not a continuation.
    EXPECT_FALSE(utf8("\xc3\x41"));
    EXPECT_FALSE(utf8("\xe2\x82\x41"));
    EXPECT_FALSE(utf8("\xf0\x9f\x98\x41"));
    EXPECT_FALSE(utf8("\xe2\xc3\xa9"));
    // The length bounds the check: a sequence cut by `len` is truncated.
    EXPECT_FALSE(valid_utf8("\xc3\xa9", 1));
    EXPECT_FALSE(valid_utf8("\xf0\x9f\x98\x80", 3));
}

TEST(ValidUtf8, EveryPositionOfLongAsciiRuns) {
    // The ASCII fast path reads 8 bytes at a time: a bad byte or a multibyte character must
    // be seen at every offset within and across those words, and at the very end.
    for (std::size_t len : {1u, 7u, 8u, 9u, 15u, 16u, 17u, 40u}) {
        for (std::size_t at = 0; at < len; ++at) {
            std::string base(len, 'a');
            std::string nul = base, high = base, stray = base;
            nul[at] = '\0';
            high[at] = '\xff';
            stray[at] = '\x80';
            EXPECT_FALSE(utf8(nul)) << len << " " << at;
            EXPECT_FALSE(utf8(high)) << len << " " << at;
            EXPECT_FALSE(utf8(stray)) << len << " " << at;
            std::string two = base.substr(0, at) + "\xc3\xa9" + base.substr(at);
            EXPECT_TRUE(utf8(two)) << len << " " << at;
            std::string cut = base.substr(0, at) + "\xc3";
            EXPECT_FALSE(utf8(cut)) << len << " " << at;
            EXPECT_TRUE(utf8(base + "\xf0\x9f\x98\x80" + base));
            // Bytes just below and above the boundaries the word test uses.
            std::string low = base;
            low[at] = '\x01';
            EXPECT_TRUE(utf8(low)) << len << " " << at;
            low[at] = '\x7f';
            EXPECT_TRUE(utf8(low)) << len << " " << at;
        }
    }
}

// ---- reuse (the ingest worker classifies each batch into the rows of the last one) -------

void expect_same(const Classified& a, const Classified& b, const std::string& what) {
    SCOPED_TRACE(what);
    EXPECT_EQ(a.message_id, b.message_id);
    EXPECT_EQ(a.transport_id, b.transport_id);
    EXPECT_EQ(a.event_type, b.event_type);
    EXPECT_EQ(headers_json(a), headers_json(b));
    ASSERT_EQ(a.headers.size(), b.headers.size());
    for (std::size_t i = 0; i < a.headers.size(); ++i) {
        EXPECT_EQ(a.headers[i].name, b.headers[i].name);
        EXPECT_EQ(a.headers[i].value, b.headers[i].value);
    }
    EXPECT_EQ(a.parsable, b.parsable);
    EXPECT_EQ(a.raw_len, b.raw_len);
    EXPECT_EQ(a.raw_null, b.raw_null);
    EXPECT_EQ(a.note, b.note);
    EXPECT_EQ(a.payload.text, b.payload.text);
    EXPECT_EQ(a.payload.depth, b.payload.depth);
    ASSERT_EQ(a.payload.tokens.size(), b.payload.tokens.size());
    for (std::size_t i = 0; i < a.payload.tokens.size(); ++i) {
        EXPECT_EQ(a.payload.tokens[i].kind, b.payload.tokens[i].kind);
        EXPECT_EQ(a.payload.tokens[i].offset, b.payload.tokens[i].offset);
        EXPECT_EQ(a.payload.tokens[i].len, b.payload.tokens[i].len);
    }
}

TEST(Reuse, ARowClassifiedAgainHoldsNothingOfItsLastRecord) {
    std::vector<Rec> records(8);
    records[0]
        .value(R"({"type":"T","id":"j1","deep":[[{"a":1}]]})")
        .header("message_id", "m1")
        .header("event_type", "E")
        .header("x", "1")
        .header("x", "2")
        .null_header("n");
    records[1].tombstone();
    records[2].value("not json").header("ce_id", "c").header("ce_type", "ct");
    records[3].value(R"({"id":"from-field"})").header("\xff", "\xfe");
    records[4].value(std::string(2000, ' ') + "[1,2,3]").null_header("x").header("y", "v");
    records[5].value("");
    records[6].value("\xff\xfe");
    records[7].value(R"("a string")").header("k", "1").header("k", "2").header("k", "3");
    records[3].at("other", 7, 0);
    Options options = with_field("id");
    // Every record into a row that last held every other record.
    for (std::size_t last = 0; last < records.size(); ++last)
        for (std::size_t now = 0; now < records.size(); ++now) {
            Classified row;
            records[last].classify_into(row, options);
            records[now].classify_into(row, options);
            expect_same(row, records[now].classify(options),
                        std::to_string(last) + " then " + std::to_string(now));
        }
}

TEST(Reuse, BuffersALargeRecordGrewAreGivenBack) {
    Classified row;
    Rec big;
    big.value("[\"" + std::string(kKeptBufferBytes * 2, 'x') + "\"]");
    big.classify_into(row);
    ASSERT_TRUE(row.parsable);
    EXPECT_GT(row.payload.text.capacity(), kKeptBufferBytes);
    Rec().value("[1]").classify_into(row);
    EXPECT_LE(row.payload.text.capacity(), kKeptBufferBytes);
    EXPECT_EQ(row.payload.tokens.size(), 3u);
}

// ---- message_id_rule 'fingerprint' ----------------------------------------------------------

Options fingerprint_rule() {
    Options o;
    o.id_rule = IdRule::kFingerprint;
    o.message_id_field = "id";
    return o;
}

// The id is the SHA-256 of the canonical payload whatever the headers and fields say: two
// producers' spellings of one event share it; another payload does not.
TEST(ClassifyFingerprint, IdIsTheCanonicalPayloadsHash) {
    Classified a = Rec()
                       .value(R"({"id": "x1", "total": 1.50, "n": [1, 2]})")
                       .header("message_id", "producer-a-1")
                       .header("ce_id", "c")
                       .classify(fingerprint_rule());
    Classified b = Rec()
                       .value(R"({"n":[1,2],"total":1.5,"id":"x1"})")
                       .at("other", 3, 99)
                       .header("message_id", "producer-b-7")
                       .classify(fingerprint_rule());
    Classified c = Rec()
                       .value(R"({"id": "x1", "total": 1.51, "n": [1, 2]})")
                       .header("message_id", "producer-a-1")
                       .classify(fingerprint_rule());
    EXPECT_EQ(a.message_id, sha256_hex(R"({"id":"x1","n":[1,2],"total":1.5})"));
    EXPECT_EQ(a.message_id, b.message_id);
    EXPECT_NE(a.message_id, c.message_id);
    EXPECT_FALSE(a.transport_id);
    EXPECT_TRUE(a.parsable);
    // The default rule keeps today's chain.
    EXPECT_EQ(Rec().value(R"({"id": "x1"})").header("message_id", "h").classify().message_id, "h");
}

// Values that are not JSON are hashed as their bytes; records without value bytes have nothing
// to fingerprint and keep their transport identity.
TEST(ClassifyFingerprint, RawBytesAndNoValue) {
    Classified raw = Rec().value("not json").classify(fingerprint_rule());
    EXPECT_EQ(raw.message_id, sha256_hex("not json"));
    EXPECT_FALSE(raw.parsable);
    Classified tomb = Rec().tombstone().at("t", 1, 7).classify(fingerprint_rule());
    EXPECT_TRUE(tomb.transport_id);
    EXPECT_EQ(tomb.message_id, "t/1/7");
    Classified empty = Rec().value("").at("t", 1, 8).classify(fingerprint_rule());
    EXPECT_TRUE(empty.transport_id);
    EXPECT_EQ(empty.message_id, "t/1/8");
}

// Unreadable headers do not hide a fingerprint (it does not depend on them).
TEST(ClassifyFingerprint, UnreadableHeadersKeepTheFingerprint) {
    Classified c = Rec()
                       .value(R"({"a": 1})")
                       .unreadable_headers("Local: Bad message format")
                       .classify(fingerprint_rule());
    EXPECT_EQ(c.message_id, sha256_hex(R"({"a":1})"));
    EXPECT_FALSE(c.transport_id);
    EXPECT_FALSE(c.parsable);
    EXPECT_NE(c.note.find("event_type unknown"), std::string::npos);
}

// ---- message_id_rule 'debezium' / 'cockroachdb' ---------------------------------------------

Options rule(IdRule r) {
    Options o;
    o.id_rule = r;
    o.message_id_field = "id";
    return o;
}

const char* const kDebeziumCreate =
    R"({"before":null,"after":{"id":1004,"first_name":"Anne"},)"
    R"("source":{"version":"2.7.0.Final","connector":"postgresql","name":"PostgreSQL_server",)"
    R"("ts_ms":1559033904863,"snapshot":"false","db":"postgres",)"
    R"("sequence":"[\"24023119\",\"24023128\"]","schema":"public","table":"customers",)"
    R"("txId":555,"lsn":24023128,"xmin":null},"op":"c","ts_ms":1559033904863})";

// The change's position and operation decide, whatever the headers and the id field say.
TEST(ClassifyChangeEvents, DebeziumPositionIsTheIdAndOpTheType) {
    Classified c = Rec()
                       .value(kDebeziumCreate)
                       .key(R"({"id":1004})")
                       .header("message_id", "producer-1")
                       .header("event_type", "Other")
                       .classify(rule(IdRule::kDebezium));
    ASSERT_TRUE(c.parsable);
    EXPECT_FALSE(c.skip);
    EXPECT_FALSE(c.transport_id);
    EXPECT_EQ(c.message_id.rfind("postgresql:PostgreSQL_server:postgres.public.customers:"
                                 "lsn=24023128,txId=555:c:",
                                 0),
              0u)
        << c.message_id;
    ASSERT_TRUE(c.event_type);
    EXPECT_EQ(*c.event_type, "create");
}

// A tombstone is skipped under the Debezium rule (and stays unparsable under the others).
TEST(ClassifyChangeEvents, DebeziumTombstoneIsSkipped) {
    Classified c = Rec().tombstone().key(R"({"id":1004})").classify(rule(IdRule::kDebezium));
    EXPECT_TRUE(c.skip);
    EXPECT_EQ(c.skipped, "tombstone");
    Classified d = Rec().tombstone().key(R"({"id":1004})").classify(rule(IdRule::kCockroachDb));
    EXPECT_FALSE(d.skip);
    EXPECT_FALSE(d.parsable);
    EXPECT_TRUE(d.raw_null);
}

// A value that is not a change event gets the default rule: its header, then the id field.
TEST(ClassifyChangeEvents, OtherRecordsGetTheDefaultRule) {
    Classified heartbeat = Rec()
                               .value(R"({"ts_ms":1})")
                               .header("message_id", "hb-1")
                               .classify(rule(IdRule::kDebezium));
    EXPECT_EQ(heartbeat.message_id, "hb-1");
    EXPECT_FALSE(heartbeat.event_type);
    Classified plain =
        Rec().value(R"({"id":"o-7","type":"T"})").classify(rule(IdRule::kCockroachDb));
    EXPECT_EQ(plain.message_id, "o-7");
    ASSERT_TRUE(plain.event_type);
    EXPECT_EQ(*plain.event_type, "T");
    Classified bad = Rec().value("{not json").key("[1]").classify(rule(IdRule::kCockroachDb));
    EXPECT_FALSE(bad.parsable);
    EXPECT_TRUE(bad.transport_id);
}

// CockroachDB: key + updated; a resolved timestamp is skipped.
TEST(ClassifyChangeEvents, CockroachDbKeyAndUpdated) {
    Classified c = Rec()
                       .value(R"({"after": {"id": 1, "name": "Petee H"},)"
                              R"( "updated": "1563898016883227000.0000000000"})")
                       .key("[1]")
                       .at("office_dogs", 0, 5)
                       .classify(rule(IdRule::kCockroachDb));
    EXPECT_EQ(c.message_id.rfind("cockroachdb:office_dogs:1563898016883227000.0000000000:", 0), 0u)
        << c.message_id;
    ASSERT_TRUE(c.event_type);
    EXPECT_EQ(*c.event_type, "upsert");
    Classified r = Rec()
                       .value(R"({"resolved": "1563898016883227000.0000000000"})")
                       .classify(rule(IdRule::kCockroachDb));
    EXPECT_TRUE(r.skip);
    EXPECT_EQ(r.skipped, "resolved");
}

// Headers the client could not read: the change's id still holds (it does not depend on them).
TEST(ClassifyChangeEvents, UnreadableHeadersKeepTheChangeId) {
    Classified ok =
        Rec().value(kDebeziumCreate).key(R"({"id":1004})").classify(rule(IdRule::kDebezium));
    Classified c = Rec()
                       .value(kDebeziumCreate)
                       .key(R"({"id":1004})")
                       .unreadable_headers("Local: Bad message format")
                       .classify(rule(IdRule::kDebezium));
    EXPECT_FALSE(c.parsable);
    EXPECT_FALSE(c.transport_id);
    EXPECT_EQ(c.message_id, ok.message_id);
}

TEST(IdRules, Named) {
    EXPECT_EQ(id_rule_named("default"), IdRule::kDefault);
    EXPECT_EQ(id_rule_named("fingerprint"), IdRule::kFingerprint);
    EXPECT_EQ(id_rule_named("debezium"), IdRule::kDebezium);
    EXPECT_EQ(id_rule_named("cockroachdb"), IdRule::kCockroachDb);
    EXPECT_EQ(id_rule_named("other"), IdRule::kDefault);
}

// The one rule for keeping value bytes: asked for, needed by dead letters, or values not JSON.
TEST(KeepsRaw, AnyReasonKeepsTheBytes) {
    EXPECT_FALSE(keeps_raw(RawNeeds{}));
    EXPECT_TRUE(keeps_raw(RawNeeds{true, false, true}));
    EXPECT_TRUE(keeps_raw(RawNeeds{false, true, true}));
    EXPECT_TRUE(keeps_raw(RawNeeds{false, false, false}));
}

}  // namespace
}  // namespace eventbox::inbox
