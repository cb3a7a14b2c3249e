// Unit tests of the pure parts of the RabbitMQ consumer (amqp/consumer.hpp): a delivery's
// properties read (message_id, type, headers, x-stream-offset) and the headers the inbox's
// rules then see (the message_id property over a header, type as event_type).
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "amqp/consumer.hpp"

namespace eventbox::amqp {
namespace {

amqp_field_value_t utf8(const char* s) {
    amqp_field_value_t v{};
    v.kind = AMQP_FIELD_KIND_UTF8;
    v.value.bytes = amqp_cstring_bytes(s);
    return v;
}

amqp_table_entry_t entry(const char* key, amqp_field_value_t v) {
    amqp_table_entry_t e{};
    e.key = amqp_cstring_bytes(key);
    e.value = v;
    return e;
}

std::optional<std::string> header(const std::vector<inbox::KafkaHeader>& hs, const char* name) {
    for (const auto& h : hs)
        if (h.name == name)
            return h.value ? std::optional<std::string>(std::string(h.value, h.value_len))
                           : std::nullopt;
    return std::string("<absent>");
}

int count(const std::vector<inbox::KafkaHeader>& hs, const char* name) {
    int n = 0;
    for (const auto& h : hs) n += h.name == name ? 1 : 0;
    return n;
}

TEST(AmqpReadProperties, MessageIdTypeContentTypeAndHeaders) {
    amqp_field_value_t num{};
    num.kind = AMQP_FIELD_KIND_I32;
    num.value.i32 = -7;
    amqp_field_value_t yes{};
    yes.kind = AMQP_FIELD_KIND_BOOLEAN;
    yes.value.boolean = 1;
    amqp_field_value_t nothing{};
    nothing.kind = AMQP_FIELD_KIND_VOID;
    amqp_field_value_t table{};
    table.kind = AMQP_FIELD_KIND_TABLE;  // no text form: left out
    amqp_table_entry_t entries[] = {entry("tenant", utf8("acme")), entry("n", num),
                                    entry("flag", yes), entry("gone", nothing),
                                    entry("nested", table)};
    amqp_basic_properties_t p{};
    p._flags = AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG |
               AMQP_BASIC_HEADERS_FLAG;
    p.message_id = amqp_cstring_bytes("m-1");
    p.type = amqp_cstring_bytes("order.placed");
    p.content_type = amqp_cstring_bytes("application/json");
    p.headers.num_entries = 5;
    p.headers.entries = entries;
    Delivery d;
    read_properties(p, d);
    EXPECT_EQ(d.message_id, "m-1");
    EXPECT_EQ(d.type, "order.placed");
    EXPECT_EQ(d.content_type, "application/json");
    EXPECT_EQ(d.stream_offset, -1);
    ASSERT_EQ(d.headers.size(), 4u);
    EXPECT_EQ(d.headers[0].first, "tenant");
    EXPECT_EQ(d.headers[0].second, "acme");
    EXPECT_EQ(d.headers[1].second, "-7");
    EXPECT_EQ(d.headers[2].second, "true");
    EXPECT_EQ(d.headers[3].first, "gone");
    EXPECT_EQ(d.headers[3].second, std::nullopt);
}

TEST(AmqpReadProperties, FlagsUnsetLeaveFieldsEmpty) {
    amqp_basic_properties_t p{};
    p.message_id = amqp_cstring_bytes("ignored: its flag is not set");
    Delivery d;
    read_properties(p, d);
    EXPECT_FALSE(d.message_id);
    EXPECT_FALSE(d.type);
    EXPECT_FALSE(d.content_type);
    EXPECT_TRUE(d.headers.empty());
}

TEST(AmqpReadProperties, StreamOffsetIsNotAHeader) {
    amqp_field_value_t off{};
    off.kind = AMQP_FIELD_KIND_I64;
    off.value.i64 = 123456789012LL;
    amqp_table_entry_t entries[] = {entry("x-stream-offset", off), entry("k", utf8("v"))};
    amqp_basic_properties_t p{};
    p._flags = AMQP_BASIC_HEADERS_FLAG;
    p.headers.num_entries = 2;
    p.headers.entries = entries;
    Delivery d;
    read_properties(p, d);
    EXPECT_EQ(d.stream_offset, 123456789012LL);
    ASSERT_EQ(d.headers.size(), 1u);
    EXPECT_EQ(d.headers[0].first, "k");
}

TEST(AmqpStreamOffset, IntegerKinds) {
    amqp_field_value_t v{};
    v.kind = AMQP_FIELD_KIND_I64;
    v.value.i64 = 0;
    EXPECT_EQ(stream_offset_of(v), 0);
    v.kind = AMQP_FIELD_KIND_U64;
    v.value.u64 = 42;
    EXPECT_EQ(stream_offset_of(v), 42);
    v.value.u64 = static_cast<uint64_t>(INT64_MAX) + 1;  // beyond int64: not an offset
    EXPECT_EQ(stream_offset_of(v), -1);
    v.kind = AMQP_FIELD_KIND_I32;
    v.value.i32 = 7;
    EXPECT_EQ(stream_offset_of(v), 7);
    v.kind = AMQP_FIELD_KIND_U32;
    v.value.u32 = 4000000000u;
    EXPECT_EQ(stream_offset_of(v), 4000000000LL);
    EXPECT_EQ(stream_offset_of(utf8("12")), -1);  // text is not an offset
    amqp_field_value_t none{};
    none.kind = AMQP_FIELD_KIND_VOID;
    EXPECT_EQ(stream_offset_of(none), -1);
}

TEST(AmqpRecordHeaders, MessageIdPropertyWinsOverHeader) {
    Delivery d;
    d.message_id = "from-property";
    d.headers = {{"message_id", std::string("from-header")}, {"tenant", std::string("acme")}};
    std::vector<inbox::KafkaHeader> out;
    record_headers(d, out);
    EXPECT_EQ(count(out, "message_id"), 1);
    EXPECT_EQ(header(out, "message_id"), "from-property");
    EXPECT_EQ(header(out, "tenant"), "acme");
}

TEST(AmqpRecordHeaders, MessageIdHeaderWithoutProperty) {
    Delivery d;
    d.headers = {{"message_id", std::string("from-header")}};
    std::vector<inbox::KafkaHeader> out;
    record_headers(d, out);
    EXPECT_EQ(header(out, "message_id"), "from-header");
}

TEST(AmqpRecordHeaders, TypeBecomesEventTypeUnlessAHeaderGivesOne) {
    Delivery d;
    d.type = "order.placed";
    std::vector<inbox::KafkaHeader> out;
    record_headers(d, out);
    EXPECT_EQ(header(out, "event_type"), "order.placed");
    d.headers = {{"event_type", std::string("order.v2")}};
    record_headers(d, out);
    EXPECT_EQ(count(out, "event_type"), 1);
    EXPECT_EQ(header(out, "event_type"), "order.v2");
}

TEST(AmqpRecordHeaders, NullHeaderValueStaysNull) {
    Delivery d;
    d.headers = {{"gone", std::nullopt}};
    std::vector<inbox::KafkaHeader> out;
    record_headers(d, out);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].value, nullptr);
    EXPECT_EQ(header(out, "message_id"), "<absent>");
}

}  // namespace
}  // namespace eventbox::amqp
