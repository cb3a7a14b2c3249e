// The exact representation of a record's headers (src/inbox/raw_headers.cpp).
#include "inbox/raw_headers.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace eventbox::inbox {
namespace {

std::string write(const std::vector<KafkaHeader>& headers) {
    std::string out(raw_headers_size(headers.data(), headers.size()), '\0');
    write_raw_headers(headers.data(), headers.size(), out.data());
    return out;
}

TEST(RawHeaders, KeepsOrderRepeatsNullsEmptyAndBinaryValues) {
    std::string binary("\x00\xff\xfe", 3);
    std::vector<KafkaHeader> in = {
        {"trace", "t-1", 3},
        {"trace", "t-2", 3},                   // a repeated name
        {"nothing", nullptr, 0},               // a null value
        {"empty", "", 0},                      // an empty one, not null
        {"bin", binary.data(), binary.size()}  // bytes that are not UTF-8
    };
    std::string bytes = write(in);
    EXPECT_EQ(bytes.size(), 5 * 8 + 5 + 5 + 7 + 5 + 3 + 3 + 3 + 0 + 3);
    EXPECT_EQ(count_raw_headers(bytes), 5);
    std::string_view rest = bytes;
    RawHeader h;
    for (const KafkaHeader& want : in) {
        ASSERT_TRUE(next_raw_header(&rest, &h));
        EXPECT_EQ(h.name, want.name);
        if (want.value == nullptr) {
            EXPECT_EQ(h.value, nullptr);
        } else {
            ASSERT_NE(h.value, nullptr);
            EXPECT_EQ(std::string(h.value, h.value_len), std::string(want.value, want.value_len));
        }
    }
    EXPECT_TRUE(rest.empty());
    EXPECT_FALSE(next_raw_header(&rest, &h));
}

TEST(RawHeaders, FormatIsLengthPrefixedBigEndian) {
    std::vector<KafkaHeader> in = {{"a", "xy", 2}, {"b", nullptr, 0}};
    EXPECT_EQ(write(in), std::string("\0\0\0\1a\0\0\0\2xy\0\0\0\1b\xff\xff\xff\xff", 20));
    EXPECT_EQ(write({}), "");
    EXPECT_EQ(count_raw_headers(""), 0);
}

TEST(RawHeaders, TruncatedOrMalformedBytesAreRefused) {
    std::string bytes = write({{"name", "value", 5}});
    for (std::size_t cut = 1; cut < bytes.size(); ++cut)
        EXPECT_EQ(count_raw_headers(std::string_view(bytes).substr(0, cut)), -1) << cut;
    // A length beyond the bytes.
    EXPECT_EQ(count_raw_headers(std::string("\0\0\1\0ab", 6)), -1);
    std::string_view rest = "xyz";
    RawHeader h;
    EXPECT_FALSE(next_raw_header(&rest, &h));
    EXPECT_EQ(rest, "xyz");  // nothing read
}

}  // namespace
}  // namespace eventbox::inbox
