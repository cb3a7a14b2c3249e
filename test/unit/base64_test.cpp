// Unit tests for the shared base64 (core/base64.hpp).
#include "core/base64.hpp"

#include <gtest/gtest.h>

#include <string>

namespace eventbox {
namespace {

TEST(Base64, EncodesRfc4648TestVectors) {
    // RFC 4648 section 10.
    EXPECT_EQ(base64(""), "");
    EXPECT_EQ(base64("f"), "Zg==");
    EXPECT_EQ(base64("fo"), "Zm8=");
    EXPECT_EQ(base64("foo"), "Zm9v");
    EXPECT_EQ(base64("foob"), "Zm9vYg==");
    EXPECT_EQ(base64("fooba"), "Zm9vYmE=");
    EXPECT_EQ(base64("foobar"), "Zm9vYmFy");
    EXPECT_EQ(base64(std::string("\x00\xff\xfe", 3)), "AP/+");
}

TEST(Base64, AppendsAfterWhatIsThere) {
    std::string out = "\"";
    append_base64("hello", &out);
    out += "\"";
    EXPECT_EQ(out, "\"aGVsbG8=\"");
}

TEST(Base64, RoundTripsEveryByteAndLength) {
    std::string all;
    for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
    for (std::size_t n = 0; n <= all.size(); n += 7) {
        std::string back;
        ASSERT_TRUE(decode_base64(base64(all.substr(0, n)), &back)) << n;
        EXPECT_EQ(back, all.substr(0, n));
    }
}

TEST(Base64, DecodesWithOrWithoutPadding) {
    std::string out;
    ASSERT_TRUE(decode_base64("Zm9vYg==", &out));
    EXPECT_EQ(out, "foob");
    ASSERT_TRUE(decode_base64("Zm9vYg", &out));
    EXPECT_EQ(out, "foob");
    ASSERT_TRUE(decode_base64("AP8=", &out));
    EXPECT_EQ(out, std::string("\x00\xff", 2));
    ASSERT_TRUE(decode_base64("", &out));
    EXPECT_EQ(out, "");
}

TEST(Base64, RefusesWhatIsNotBase64) {
    std::string out;
    EXPECT_FALSE(decode_base64("Zm9v!", &out));      // outside the alphabet
    EXPECT_FALSE(decode_base64("Zm9-", &out));       // base64url is not the standard alphabet
    EXPECT_FALSE(decode_base64("Zm9vY", &out));      // a lone character in the last group
    EXPECT_FALSE(decode_base64("Zm=9", &out));       // '=' before the end
    EXPECT_FALSE(decode_base64("Zm9vYg=", &out));    // padding that does not complete the group
    EXPECT_FALSE(decode_base64("Zg===", &out));      // too much padding
    EXPECT_FALSE(decode_base64("Zm9v Yg==", &out));  // whitespace
}

TEST(Base64, DecodesIntoABufferOfTheBound) {
    std::string text = base64("hello, world");
    std::string buffer(base64_decoded_bound(text.size()), '\0');
    long n = decode_base64(text, buffer.data());
    ASSERT_EQ(n, 12);
    EXPECT_EQ(buffer.substr(0, 12), "hello, world");
    EXPECT_EQ(decode_base64("a!==", buffer.data()), -1);
}

}  // namespace
}  // namespace eventbox
