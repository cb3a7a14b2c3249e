// Classification of Kafka records for the inbox (src/inbox/record.cpp): message id and event type
// rules (docs/design/guarantees.md) and the headers object; inbox_record_payload_test.cpp goes on
// with the values (docs/reference/bad-input.md).
#include "inbox/record.hpp"

#include "inbox_record_rec.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace eventbox::inbox {
namespace {

// ---- message id ---------------------------------------------------------------------------

// Headers the client could not read: never treated as "no headers" (which would dedupe by the
// transport id and route by the JSON "type" as if nothing happened). The record is kept as
// unparsable with its bytes, a note naming the reason, and its transport identity; a JSON value
// that would have named a type or an id does not.
TEST(UnreadableHeaders, RecordIsUnparsableWithANoteAndItsTransportId) {
    Options o = with_field("id");
    Classified c = Rec()
                       .at("orders", 1, 7)
                       .value(R"({"id":"a-1","type":"OrderCreated"})")
                       .unreadable_headers("Local: Bad message format")
                       .classify(o);
    EXPECT_FALSE(c.parsable);
    EXPECT_EQ(c.raw_len, std::string(R"({"id":"a-1","type":"OrderCreated"})").size());
    EXPECT_EQ(c.message_id, "orders/1/7");
    EXPECT_TRUE(c.transport_id);
    EXPECT_FALSE(c.event_type.has_value());
    EXPECT_EQ(c.note.rfind("headers could not be read (Local: Bad message format)", 0), 0u)
        << c.note;
    EXPECT_TRUE(c.headers.empty());
}

TEST(UnreadableHeaders, KeepsTheValuesOwnNoteAndTombstone) {
    Classified c = Rec().tombstone().unreadable_headers("bad").classify();
    EXPECT_TRUE(c.raw_null);
    EXPECT_NE(c.note.find("headers could not be read (bad)"), std::string::npos);
    EXPECT_NE(c.note.find("null value (tombstone)"), std::string::npos);
    // Reused buffers after such a record classify the next one normally.
    Classified reused;
    Rec().unreadable_headers("bad").classify_into(reused);
    Rec().header("message_id", "m-2").value("{}").classify_into(reused);
    EXPECT_TRUE(reused.parsable);
    EXPECT_EQ(reused.message_id, "m-2");
    EXPECT_EQ(reused.note, "");
}

TEST(MessageId, TransportIdentityWhenNothingNamesTheMessage) {
    Classified c = Rec().at("orders.v1", 3, 1234567890123).value(R"({"id":"x"})").classify();
    EXPECT_EQ(c.message_id, "orders.v1/3/1234567890123");
    EXPECT_TRUE(c.transport_id);
}

TEST(MessageId, TransportIdentityOfOffsetZero) {
    Classified c = Rec().at("t", 0, 0).classify();
    EXPECT_EQ(c.message_id, "t/0/0");
    EXPECT_TRUE(c.transport_id);
}

TEST(MessageId, HeaderMessageId) {
    Classified c = Rec().header("message_id", "m-1").classify();
    EXPECT_EQ(c.message_id, "m-1");
    EXPECT_FALSE(c.transport_id);
}

TEST(MessageId, CloudEventsIdWhenNoMessageIdHeader) {
    Classified c = Rec().header("ce_id", "ce-7").classify();
    EXPECT_EQ(c.message_id, "ce-7");
    EXPECT_FALSE(c.transport_id);
}

TEST(MessageId, MessageIdHeaderBeatsCloudEventsId) {
    EXPECT_EQ(Rec().header("ce_id", "ce-7").header("message_id", "m-1").classify().message_id,
              "m-1");
    EXPECT_EQ(Rec().header("message_id", "m-1").header("ce_id", "ce-7").classify().message_id,
              "m-1");
}

TEST(MessageId, HeadersBeatTheConfiguredField) {
    Options o = with_field("id");
    EXPECT_EQ(Rec().value(R"({"id":"f"})").header("message_id", "m").classify(o).message_id, "m");
    EXPECT_EQ(Rec().value(R"({"id":"f"})").header("ce_id", "c").classify(o).message_id, "c");
}

TEST(MessageId, ConfiguredStringField) {
    Classified c =
        Rec().value(R"({"type":"x","event_id":"e-99"})").classify(with_field("event_id"));
    EXPECT_EQ(c.message_id, "e-99");
    EXPECT_FALSE(c.transport_id);
}

TEST(MessageId, ConfiguredIntegerField) {
    EXPECT_EQ(Rec().value(R"({"id":42})").classify(with_field("id")).message_id, "42");
    EXPECT_EQ(Rec().value(R"({"id":-7})").classify(with_field("id")).message_id, "-7");
    EXPECT_EQ(Rec().value(R"({"id":0})").classify(with_field("id")).message_id, "0");
    EXPECT_EQ(Rec().value(R"({"id":18446744073709551615})").classify(with_field("id")).message_id,
              "18446744073709551615");
    EXPECT_EQ(Rec().value(R"({"id":-9223372036854775808})").classify(with_field("id")).message_id,
              "-9223372036854775808");
}

TEST(MessageId, ConfiguredFieldOfAnotherTypeFallsBackToTransport) {
    for (const char* v : {R"({"id":1.5})", R"({"id":1e3})", R"({"id":true})", R"({"id":null})",
                          R"({"id":{"a":"b"}})", R"({"id":["a"]})"}) {
        Classified c = Rec().at("t", 1, 5).value(v).classify(with_field("id"));
        EXPECT_EQ(c.message_id, "t/1/5") << v;
        EXPECT_TRUE(c.transport_id) << v;
    }
}

TEST(MessageId, ConfiguredFieldIsTopLevelOnly) {
    Classified c =
        Rec().at("t", 1, 5).value(R"({"data":{"id":"inner"}})").classify(with_field("id"));
    EXPECT_EQ(c.message_id, "t/1/5");
    EXPECT_TRUE(c.transport_id);
}

TEST(MessageId, ConfiguredFieldMissingOrDocumentNotAnObject) {
    for (const char* v : {R"({"other":"x"})", R"(["id"])", R"("id")", "42", "null"}) {
        Classified c = Rec().at("t", 1, 5).value(v).classify(with_field("id"));
        EXPECT_EQ(c.message_id, "t/1/5") << v;
        EXPECT_TRUE(c.transport_id) << v;
    }
}

TEST(MessageId, NoConfiguredFieldMeansTheDocumentIsNotLookedAt) {
    Classified c = Rec().at("t", 1, 5).value(R"({"id":"x","message_id":"y"})").classify();
    EXPECT_EQ(c.message_id, "t/1/5");
    EXPECT_TRUE(c.transport_id);
}

TEST(MessageId, ConfiguredFieldIsReadEvenWhenAHeaderGivesTheEventType) {
    Classified c =
        Rec().value(R"({"id":"f-1"})").header("event_type", "T").classify(with_field("id"));
    EXPECT_EQ(c.message_id, "f-1");
    EXPECT_EQ(c.event_type, std::optional<std::string>("T"));
}

TEST(MessageId, ConfiguredFieldIsNotReadFromAnUnparsableValue) {
    Classified c = Rec().at("t", 1, 5).value(R"({"id":"f-1",)").classify(with_field("id"));
    EXPECT_FALSE(c.parsable);
    EXPECT_EQ(c.message_id, "t/1/5");
    EXPECT_TRUE(c.transport_id);
}

TEST(MessageId, HeadersStillNameUnparsableRecords) {
    Classified c = Rec().tombstone().header("message_id", "m-1").classify();
    EXPECT_TRUE(c.raw_null);
    EXPECT_EQ(c.message_id, "m-1");
    EXPECT_FALSE(c.transport_id);
    c = Rec().value("\xff").header("ce_id", "c-1").classify();
    EXPECT_EQ(c.note, "value is not valid UTF-8");
    EXPECT_EQ(c.message_id, "c-1");
}

TEST(MessageId, TheLastUsableMessageIdHeaderWins) {
    EXPECT_EQ(Rec().header("message_id", "a").header("message_id", "b").classify().message_id, "b");
    EXPECT_EQ(Rec().header("message_id", "a").header("message_id", "").classify().message_id, "a");
    EXPECT_EQ(Rec().header("message_id", "a").null_header("message_id").classify().message_id, "a");
    EXPECT_EQ(Rec().header("message_id", "a").header("message_id", "\xff").classify().message_id,
              "a");
}

TEST(MessageId, HeaderNamesAreCaseSensitive) {
    Classified c = Rec().at("t", 0, 1).header("Message_ID", "m").header("CE_ID", "c").classify();
    EXPECT_EQ(c.message_id, "t/0/1");
    EXPECT_TRUE(c.transport_id);
}

TEST(MessageId, EmptyIdsFallBackToTransport) {
    Classified c = Rec().at("t", 0, 1).header("message_id", "").classify();
    EXPECT_EQ(c.message_id, "t/0/1");
    EXPECT_TRUE(c.transport_id);
    c = Rec().at("t", 0, 1).header("ce_id", "").classify();
    EXPECT_EQ(c.message_id, "t/0/1");
    c = Rec().at("t", 0, 1).value(R"({"id":""})").classify(with_field("id"));
    EXPECT_EQ(c.message_id, "t/0/1");
    EXPECT_TRUE(c.transport_id);
}

TEST(MessageId, NullHeaderValuesAreIgnored) {
    Classified c = Rec().at("t", 0, 1).null_header("message_id").null_header("ce_id").classify();
    EXPECT_EQ(c.message_id, "t/0/1");
    EXPECT_TRUE(c.transport_id);
}

TEST(MessageId, AnUnusableMessageIdHeaderGivesWayToCloudEventsId) {
    EXPECT_EQ(Rec().header("message_id", "").header("ce_id", "c").classify().message_id, "c");
    EXPECT_EQ(Rec().header("message_id", "\xc3").header("ce_id", "c").classify().message_id, "c");
    EXPECT_EQ(Rec().null_header("message_id").header("ce_id", "c").classify().message_id, "c");
}

TEST(MessageId, NonUtf8IdsFallBackToTransport) {
    for (const std::string& bad : {std::string("\xff\xfe"), std::string("a\0b", 3),
                                   std::string("\xed\xa0\x80"), std::string("\xc0\xaf")}) {
        Classified c = Rec().at("t", 0, 1).header("message_id", bad).classify();
        EXPECT_EQ(c.message_id, "t/0/1");
        EXPECT_TRUE(c.transport_id);
        c = Rec().at("t", 0, 1).header("ce_id", bad).classify();
        EXPECT_EQ(c.message_id, "t/0/1");
        EXPECT_TRUE(c.transport_id);
    }
}

TEST(MessageId, UnicodeIdsAreKept) {
    EXPECT_EQ(Rec().header("message_id", "caf\xc3\xa9-\xf0\x9f\x98\x80").classify().message_id,
              "caf\xc3\xa9-\xf0\x9f\x98\x80");
    // An escaped field value is decoded to UTF-8.
    EXPECT_EQ(Rec().value(R"({"id":"caf\u00e9"})").classify(with_field("id")).message_id,
              "caf\xc3\xa9");
}

TEST(MessageId, IdsOfUpTo256BytesAreKept) {
    std::string id256(kMaxMessageIdBytes, 'a');
    ASSERT_EQ(id256.size(), 256u);
    EXPECT_EQ(Rec().header("message_id", id256).classify().message_id, id256);
    EXPECT_EQ(Rec().header("ce_id", id256).classify().message_id, id256);
    EXPECT_EQ(Rec().value("{\"id\":\"" + id256 + "\"}").classify(with_field("id")).message_id,
              id256);
    // 256 bytes of two-byte characters: the limit is in bytes.
    std::string wide;
    for (int i = 0; i < 128; ++i) wide += "\xc3\xa9";
    EXPECT_EQ(Rec().header("message_id", wide).classify().message_id, wide);
}

TEST(MessageId, IdsLongerThan256BytesFallBackToTransport) {
    std::string id257(kMaxMessageIdBytes + 1, 'a');
    Classified c = Rec().at("t", 0, 1).header("message_id", id257).classify();
    EXPECT_EQ(c.message_id, "t/0/1");
    EXPECT_TRUE(c.transport_id);
    c = Rec().at("t", 0, 1).header("ce_id", id257).classify();
    EXPECT_EQ(c.message_id, "t/0/1");
    EXPECT_TRUE(c.transport_id);
    c = Rec().at("t", 0, 1).value("{\"id\":\"" + id257 + "\"}").classify(with_field("id"));
    EXPECT_EQ(c.message_id, "t/0/1");
    EXPECT_TRUE(c.transport_id);
    std::string wide;
    for (int i = 0; i < 129; ++i) wide += "\xc3\xa9";  // 129 characters, 258 bytes
    c = Rec().at("t", 0, 1).header("message_id", wide).classify();
    EXPECT_EQ(c.message_id, "t/0/1");
}

// ---- event type ---------------------------------------------------------------------------

TEST(EventType, NoneWhenNothingNamesIt) {
    EXPECT_EQ(Rec().value(R"({"kind":"x"})").classify().event_type, std::nullopt);
    EXPECT_EQ(Rec().value("[1,2]").classify().event_type, std::nullopt);
    EXPECT_EQ(Rec().value(R"("type")").classify().event_type, std::nullopt);
}

TEST(EventType, HeaderEventType) {
    EXPECT_EQ(Rec().header("event_type", "OrderCreated").classify().event_type,
              std::optional<std::string>("OrderCreated"));
}

TEST(EventType, CloudEventsTypeWhenNoEventTypeHeader) {
    EXPECT_EQ(Rec().header("ce_type", "com.example.order").classify().event_type,
              std::optional<std::string>("com.example.order"));
}

TEST(EventType, JsonTypeField) {
    EXPECT_EQ(Rec().value(R"({"type":"OrderCreated","id":1})").classify().event_type,
              std::optional<std::string>("OrderCreated"));
}

TEST(EventType, Precedence) {
    Rec all;
    all.value(R"({"type":"json"})").header("ce_type", "ce").header("event_type", "header");
    EXPECT_EQ(all.classify().event_type, std::optional<std::string>("header"));
    EXPECT_EQ(Rec().value(R"({"type":"json"})").header("ce_type", "ce").classify().event_type,
              std::optional<std::string>("ce"));
    EXPECT_EQ(Rec().value(R"({"type":"json"})").header("event_type", "h").classify().event_type,
              std::optional<std::string>("h"));
}

TEST(EventType, UnusableHeadersGiveWayToTheNextRule) {
    EXPECT_EQ(Rec().value(R"({"type":"json"})").header("event_type", "").classify().event_type,
              std::optional<std::string>("json"));
    EXPECT_EQ(Rec().value(R"({"type":"json"})").header("event_type", "\xff").classify().event_type,
              std::optional<std::string>("json"));
    EXPECT_EQ(Rec().value(R"({"type":"json"})").null_header("ce_type").classify().event_type,
              std::optional<std::string>("json"));
    EXPECT_EQ(Rec().header("event_type", "").header("ce_type", "ce").classify().event_type,
              std::optional<std::string>("ce"));
}

TEST(EventType, EmptyOrNonTextJsonTypeIsNone) {
    for (const char* v : {R"({"type":""})", R"({"type":null})", R"({"type":true})",
                          R"({"type":{"name":"x"}})", R"({"type":["x"]})", R"({"type":1.5})",
                          R"({"data":{"type":"inner"}})", R"([{"type":"x"}])"}) {
        EXPECT_EQ(Rec().value(v).classify().event_type, std::nullopt) << v;
    }
}

TEST(EventType, NotReadFromUnparsableValues) {
    Classified c = Rec().value(R"({"type":"x")").classify();
    EXPECT_FALSE(c.parsable);
    EXPECT_EQ(c.event_type, std::nullopt);
    c = Rec().value(R"({"type":"x"})").header("event_type", "h").classify(Options{"", 5});
    EXPECT_FALSE(c.parsable);
    EXPECT_EQ(c.event_type, std::optional<std::string>("h"));
}

TEST(EventType, UnicodeIsKept) {
    EXPECT_EQ(Rec().value(R"({"type":"Bestellung\u00e4"})").classify().event_type,
              std::optional<std::string>("Bestellung\xc3\xa4"));
    EXPECT_EQ(Rec().header("event_type", "\xe6\xb3\xa8\xe6\x96\x87").classify().event_type,
              std::optional<std::string>("\xe6\xb3\xa8\xe6\x96\x87"));
}

// ---- headers ------------------------------------------------------------------------------

TEST(Headers, NoHeadersIsAnEmptyObject) {
    EXPECT_EQ(headers_json(Rec().classify()), "{}");
}

TEST(Headers, Utf8ValuesAreStrings) {
    Classified c =
        Rec().header("event_type", "OrderCreated").header("trace", "caf\xc3\xa9").classify();
    EXPECT_EQ(headers_json(c), "{\"event_type\":\"OrderCreated\",\"trace\":\"caf\xc3\xa9\"}");
}

TEST(Headers, EmptyValueIsAnEmptyString) {
    EXPECT_EQ(headers_json(Rec().header("a", "").classify()), R"({"a":""})");
}

TEST(Headers, NullValuesAreNull) {
    EXPECT_EQ(headers_json(Rec().null_header("a").header("b", "x").classify()),
              R"({"a":null,"b":"x"})");
}

TEST(Headers, BinaryValuesAreHex) {
    EXPECT_EQ(headers_json(Rec().header("bin", std::string("\x00\x01\xfe\xff", 4)).classify()),
              R"({"bin":"\\x0001feff"})");
    EXPECT_EQ(headers_json(Rec().header("bin", "\xc3").classify()), R"({"bin":"\\xc3"})");
    // NUL is valid UTF-8 but PostgreSQL text cannot hold it.
    EXPECT_EQ(headers_json(Rec().header("nul", std::string("a\0", 2)).classify()),
              R"({"nul":"\\x6100"})");
}

TEST(Headers, BinaryNamesAreHex) {
    EXPECT_EQ(headers_json(Rec().header("\xff\x00", "v").classify()), R"({"\\xff":"v"})");
    EXPECT_EQ(headers_json(Rec().header(std::string("a\0", 2), "v").classify()),
              R"({"\\x6100":"v"})");
}

TEST(Headers, ControlCharactersAndQuotesAreEscaped) {
    EXPECT_EQ(headers_json(Rec().header("q\"", "a\tb\n\\").classify()), R"({"q\"":"a\tb\n\\"})");
    EXPECT_EQ(headers_json(Rec().header("c", "\x01").classify()), R"({"c":"\u0001"})");
}

TEST(Headers, LastValueOfARepeatedNameWins) {
    EXPECT_EQ(headers_json(Rec().header("k", "1").header("k", "2").classify()), R"({"k":"2"})");
    EXPECT_EQ(headers_json(Rec().header("k", "1").null_header("k").classify()), R"({"k":null})");
}

TEST(Headers, FieldsKeepFirstPositionAndLastValue) {
    Classified c = Rec()
                       .header("k", "1")
                       .header("j", "x")
                       .null_header("k")
                       .header("k", "3")
                       .header("\xff", "v")
                       .classify();
    ASSERT_EQ(c.headers.size(), 3u);
    EXPECT_EQ(c.headers[0].name, "k");
    EXPECT_EQ(c.headers[0].value, std::optional<std::string>("3"));
    EXPECT_EQ(c.headers[1].name, "j");
    EXPECT_EQ(c.headers[2].name, "\\xff");
    EXPECT_EQ(c.headers[2].value, std::optional<std::string>("v"));
    EXPECT_FALSE(Rec().null_header("n").classify().headers[0].value.has_value());
}

TEST(Headers, ManyRepeatedNamesAreMergedByName) {
    Rec r;
    for (int i = 0; i < 5000; ++i) r.header("h" + std::to_string(i % 100), std::to_string(i));
    Classified c = r.classify();
    ASSERT_EQ(c.headers.size(), 100u);
    EXPECT_EQ(c.headers[7].name, "h7");
    EXPECT_EQ(c.headers[7].value, std::optional<std::string>("4907"));
}

TEST(Headers, KeptForUnparsableRecords) {
    EXPECT_EQ(headers_json(Rec().tombstone().header("a", "b").classify()), R"({"a":"b"})");
    EXPECT_EQ(headers_json(Rec().value("not json").header("a", "b").classify()), R"({"a":"b"})");
}

}  // namespace
}  // namespace eventbox::inbox
