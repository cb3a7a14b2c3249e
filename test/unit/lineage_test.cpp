// Lineage headers of messages sent from handlers (src/outbox/lineage.cpp).
#include "outbox/lineage.hpp"

#include <gtest/gtest.h>

#include <string>

namespace eventbox::outbox {
namespace {

const unsigned char kSpan[8] = {0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7};
const bool kNone[3] = {false, false, false};

// The W3C Trace Context specification's own example header.
constexpr const char* kExample = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

TEST(Traceparent, ParsesValidHeaders) {
    auto t = parse_traceparent(kExample);
    ASSERT_TRUE(t);
    EXPECT_EQ(t->trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    EXPECT_EQ(t->flags, "01");
    // A later version may carry more fields after a '-'.
    EXPECT_TRUE(parse_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what"));
    EXPECT_TRUE(parse_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"));
}

TEST(Traceparent, RefusesInvalidHeaders) {
    const char* bad[] = {
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",       // no flags
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",  // v00 with more
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",    // upper case
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",    // zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",    // zero parent id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // forbidden version
        "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",   // later version, no '-'
        "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
    };
    for (const char* h : bad) EXPECT_FALSE(parse_traceparent(h)) << h;
}

TEST(Traceparent, ChildKeepsTraceAndFlagsWithNewParent) {
    TraceContext parent{"4bf92f3577b34da6a3ce929d0e0e4736", "01"};
    const unsigned char span[8] = {0xde, 0xad, 0xbe, 0xef, 0x01, 0x02, 0x03, 0x04};
    EXPECT_EQ(child_traceparent(parent, span),
              "00-4bf92f3577b34da6a3ce929d0e0e4736-deadbeef01020304-01");
    const unsigned char zero[8] = {};
    EXPECT_EQ(child_traceparent(parent, zero),
              "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000001-01");
    EXPECT_TRUE(parse_traceparent(child_traceparent(parent, zero)));
}

TEST(LineageHeaders, FromAMessageWithoutLineage) {
    auto h = lineage_headers(Incoming{"m-1", std::nullopt, std::nullopt}, kSpan, kNone);
    ASSERT_EQ(h.size(), 2u);
    EXPECT_EQ(h[0], std::make_pair(std::string("causation_id"), std::string("m-1")));
    EXPECT_EQ(h[1], std::make_pair(std::string("correlation_id"), std::string("m-1")));
}

TEST(LineageHeaders, CarriesCorrelationAndTrace) {
    auto h = lineage_headers(
        Incoming{"m-2", std::string_view("corr-0"), std::string_view(kExample)}, kSpan, kNone);
    ASSERT_EQ(h.size(), 3u);
    EXPECT_EQ(h[0].second, "m-2");
    EXPECT_EQ(h[1].second, "corr-0");
    EXPECT_EQ(h[2].first, "traceparent");
    EXPECT_EQ(h[2].second, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    // An invalid incoming traceparent starts nothing; an empty correlation id is not one.
    h = lineage_headers(Incoming{"m-3", std::string_view(""), std::string_view("garbage")}, kSpan,
                        kNone);
    ASSERT_EQ(h.size(), 2u);
    EXPECT_EQ(h[1].second, "m-3");
}

TEST(LineageHeaders, CallerSetHeadersWin) {
    const bool has_causation_and_trace[3] = {true, false, true};
    auto h = lineage_headers(Incoming{"m-4", std::nullopt, std::string_view(kExample)}, kSpan,
                             has_causation_and_trace);
    ASSERT_EQ(h.size(), 1u);
    EXPECT_EQ(h[0].first, "correlation_id");
    const bool all[3] = {true, true, true};
    EXPECT_TRUE(
        lineage_headers(Incoming{"m-4", std::nullopt, std::string_view(kExample)}, kSpan, all)
            .empty());
}

// Values no header could carry are left out rather than failing the send.
TEST(LineageHeaders, UnsendableValuesAreLeftOut) {
    auto h = lineage_headers(Incoming{"line\nbreak", std::nullopt, std::nullopt}, kSpan, kNone);
    EXPECT_TRUE(h.empty());
    h = lineage_headers(Incoming{"m-5", std::string_view("bad\r"), std::nullopt}, kSpan, kNone);
    ASSERT_EQ(h.size(), 2u);
    EXPECT_EQ(h[1].second, "m-5");
}

}  // namespace
}  // namespace eventbox::outbox
