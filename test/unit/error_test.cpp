// eventbox::Error, capture_current_exception() and copy_truncated() (src/core/error.cpp).
#include "core/error.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace eventbox {
namespace {

using test::is_valid_utf8;

// Runs `thrower` and captures what it throws into a report.
template <typename F>
ErrorReport capture(F thrower) {
    ErrorReport report;
    std::memset(&report, 'Z', sizeof report);  // garbage that capture must overwrite or clear
    try {
        thrower();
    } catch (...) {
        capture_current_exception(report);
    }
    return report;
}

TEST(Error, KeepsSqlstateMessageDetailAndHint) {
    Error e("23505", "duplicate", "Key exists.", "Use another id.");
    EXPECT_STREQ(e.sqlstate(), "23505");
    EXPECT_STREQ(e.what(), "duplicate");
    EXPECT_EQ(e.detail(), "Key exists.");
    EXPECT_EQ(e.hint(), "Use another id.");
}

TEST(Error, DetailAndHintDefaultToEmpty) {
    Error e(sqlstate::kInvalidParameterValue, "bad");
    EXPECT_STREQ(e.sqlstate(), "22023");
    EXPECT_EQ(e.detail(), "");
    EXPECT_EQ(e.hint(), "");
}

TEST(Error, MalformedSqlstateBecomesInternalError) {
    for (const char* code :
         {"2202", "220233", "2202a", "abcde", "", "22 23", "22-23", "\0012345"}) {
        Error e(code, "m");
        EXPECT_STREQ(e.sqlstate(), "XX000") << "code '" << code << "'";
    }
    Error null_code(nullptr, "m");
    EXPECT_STREQ(null_code.sqlstate(), "XX000");
}

TEST(Error, IsValidSqlstate) {
    EXPECT_TRUE(is_valid_sqlstate("00000"));
    EXPECT_TRUE(is_valid_sqlstate("22P02"));
    EXPECT_TRUE(is_valid_sqlstate("XX000"));
    EXPECT_TRUE(is_valid_sqlstate("F0000"));
    EXPECT_FALSE(is_valid_sqlstate(nullptr));
    EXPECT_FALSE(is_valid_sqlstate(""));
    EXPECT_FALSE(is_valid_sqlstate("2202"));
    EXPECT_FALSE(is_valid_sqlstate("220231"));
    EXPECT_FALSE(is_valid_sqlstate("22p02"));
    EXPECT_FALSE(is_valid_sqlstate("22 02"));
}

TEST(Error, IsAStdRuntimeError) {
    try {
        throw Error("22023", "as runtime_error");
    } catch (const std::runtime_error& e) {
        EXPECT_STREQ(e.what(), "as runtime_error");
    }
}

TEST(CaptureCurrentException, KeepsEverythingOfAnEventboxError) {
    ErrorReport r = capture([] { throw Error("22023", "bad topic", "Character x.", "Use y."); });
    EXPECT_STREQ(r.sqlstate, "22023");
    EXPECT_STREQ(r.message, "bad topic");
    EXPECT_STREQ(r.detail, "Character x.");
    EXPECT_STREQ(r.hint, "Use y.");
}

TEST(CaptureCurrentException, KeepsSqlstateOfPostgresErrorsCarriedThrough) {
    ErrorReport r = capture([] {
        throw Error("23505", "duplicate key value violates unique constraint \"k\"",
                    "Key (message_id)=(x) already exists.");
    });
    EXPECT_STREQ(r.sqlstate, "23505");
    EXPECT_STREQ(r.detail, "Key (message_id)=(x) already exists.");
    EXPECT_STREQ(r.hint, "");
}

TEST(CaptureCurrentException, EmptyDetailAndHintAreEmptyStrings) {
    ErrorReport r = capture([] { throw Error("54000", "too big"); });
    EXPECT_STREQ(r.detail, "");
    EXPECT_STREQ(r.hint, "");
}

TEST(CaptureCurrentException, MalformedSqlstateIsInternalError) {
    ErrorReport r = capture([] { throw Error("oops!", "m"); });
    EXPECT_STREQ(r.sqlstate, "XX000");
    EXPECT_STREQ(r.message, "m");
}

TEST(CaptureCurrentException, BadAllocIsOutOfMemory) {
    ErrorReport r = capture([] { throw std::bad_alloc(); });
    EXPECT_STREQ(r.sqlstate, "53200");
    EXPECT_STRNE(r.message, "");
    EXPECT_STREQ(r.detail, "");
    EXPECT_STREQ(r.hint, "");
}

TEST(CaptureCurrentException, RealAllocationFailureIsOutOfMemory) {
    ErrorReport r = capture([] {
        std::vector<char> v;
        v.reserve(static_cast<std::size_t>(-1) / 4);  // length_error or bad_alloc
    });
    // std::length_error is a std::exception (XX000); bad_alloc is 53200. Either way: captured.
    EXPECT_TRUE(std::strcmp(r.sqlstate, "53200") == 0 || std::strcmp(r.sqlstate, "XX000") == 0)
        << r.sqlstate;
}

TEST(CaptureCurrentException, DerivedBadAllocIsOutOfMemory) {
    ErrorReport r = capture([] { throw std::bad_array_new_length(); });
    EXPECT_STREQ(r.sqlstate, "53200");
}

TEST(CaptureCurrentException, StdExceptionIsInternalErrorWithItsMessage) {
    ErrorReport r = capture([] { throw std::out_of_range("index 7 out of range"); });
    EXPECT_STREQ(r.sqlstate, "XX000");
    EXPECT_STREQ(r.message, "index 7 out of range");
    EXPECT_STREQ(r.detail, "");
    EXPECT_STREQ(r.hint, "");
}

TEST(CaptureCurrentException, UnknownExceptionIsInternalError) {
    ErrorReport r = capture([] { throw 42; });
    EXPECT_STREQ(r.sqlstate, "XX000");
    EXPECT_STRNE(r.message, "");
    EXPECT_STREQ(r.detail, "");
    EXPECT_STREQ(r.hint, "");

    struct NotAnException {};
    ErrorReport r2 = capture([] { throw NotAnException{}; });
    EXPECT_STREQ(r2.sqlstate, "XX000");
}

TEST(CaptureCurrentException, ReusedReportLosesPreviousDetailAndHint) {
    ErrorReport report;
    try {
        throw Error("22023", "first", "first detail", "first hint");
    } catch (...) {
        capture_current_exception(report);
    }
    try {
        throw std::runtime_error("second");
    } catch (...) {
        capture_current_exception(report);
    }
    EXPECT_STREQ(report.sqlstate, "XX000");
    EXPECT_STREQ(report.message, "second");
    EXPECT_STREQ(report.detail, "");
    EXPECT_STREQ(report.hint, "");
}

TEST(CaptureCurrentException, LongTextsAreTruncatedIntoTheBuffers) {
    std::string message(5000, 'm');
    std::string detail(5000, 'd');
    std::string hint(5000, 'h');
    ErrorReport r = capture([&] { throw Error("22023", message, detail, hint); });
    EXPECT_EQ(std::strlen(r.message), ErrorReport::kMessageMax - 1);
    EXPECT_EQ(std::strlen(r.detail), ErrorReport::kDetailMax - 1);
    EXPECT_EQ(std::strlen(r.hint), ErrorReport::kHintMax - 1);
    EXPECT_EQ(std::string(r.message).substr(ErrorReport::kMessageMax - 4), "...");
    EXPECT_EQ(std::string(r.detail).substr(ErrorReport::kDetailMax - 4), "...");
    EXPECT_EQ(std::string(r.hint).substr(ErrorReport::kHintMax - 4), "...");
}

TEST(CaptureCurrentException, LongUtf8MessageIsCutOnACharacterBoundary) {
    std::string message;
    while (message.size() < 3000) message += "é€😀";
    ErrorReport r = capture([&] { throw Error("22023", message, message, message); });
    EXPECT_TRUE(is_valid_utf8(r.message));
    EXPECT_TRUE(is_valid_utf8(r.detail));
    EXPECT_TRUE(is_valid_utf8(r.hint));
    EXPECT_LT(std::strlen(r.message), ErrorReport::kMessageMax);
}

// ---- copy_truncated ---------------------------------------------------------------------

// Copies into a buffer of `size` bytes surrounded by guard bytes and checks none was touched.
std::string copy_into(std::size_t size, const char* src) {
    constexpr std::size_t kGuard = 16;
    std::vector<char> buf(size + 2 * kGuard, '#');
    copy_truncated(buf.data() + kGuard, size, src);
    for (std::size_t i = 0; i < kGuard; ++i) {
        EXPECT_EQ(buf[i], '#') << "wrote before the buffer (size " << size << ")";
        EXPECT_EQ(buf[kGuard + size + i], '#') << "wrote past the buffer (size " << size << ")";
    }
    if (size == 0) return "<untouched>";
    const char* out = buf.data() + kGuard;
    std::size_t len = strnlen(out, size);
    EXPECT_LT(len, size) << "not NUL-terminated within its size";
    return std::string(out, len);
}

TEST(CopyTruncated, SizeZeroWritesNothing) {
    EXPECT_EQ(copy_into(0, "hello"), "<untouched>");
    EXPECT_EQ(copy_into(0, ""), "<untouched>");
    EXPECT_EQ(copy_into(0, nullptr), "<untouched>");
}

TEST(CopyTruncated, FitsWhole) {
    EXPECT_EQ(copy_into(6, "hello"), "hello");  // exactly fits with its NUL
    EXPECT_EQ(copy_into(100, "hello"), "hello");
    EXPECT_EQ(copy_into(1, ""), "");
}

TEST(CopyTruncated, NullSourceIsEmpty) {
    EXPECT_EQ(copy_into(1, nullptr), "");
    EXPECT_EQ(copy_into(10, nullptr), "");
}

TEST(CopyTruncated, TooSmallForAnyCharacterPlusMarkIsEmpty) {
    for (std::size_t size = 1; size <= 4; ++size) EXPECT_EQ(copy_into(size, "hello"), "") << size;
}

TEST(CopyTruncated, TruncatesWithMark) {
    EXPECT_EQ(copy_into(5, "hello"), "h...");  // one byte short of fitting
    EXPECT_EQ(copy_into(6, "hello world"), "he...");
    EXPECT_EQ(copy_into(11, "hello world"), "hello w...");
    EXPECT_EQ(copy_into(12, "hello world"), "hello world");
}

TEST(CopyTruncated, NeverCutsAUtf8Character) {
    // 2-, 3- and 4-byte characters at every possible cut position.
    const std::string src =
        "ab\xC3\xA9"         // é
        "c\xE2\x82\xAC"      // €
        "d\xF0\x9F\x98\x80"  // 😀
        "e\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80";
    ASSERT_TRUE(is_valid_utf8(src));
    for (std::size_t size = 1; size <= src.size() + 2; ++size) {
        std::string out = copy_into(size, src.c_str());
        EXPECT_TRUE(is_valid_utf8(out)) << "size " << size << ": " << out;
        EXPECT_LT(out.size(), size);
        if (size > src.size()) {
            EXPECT_EQ(out, src);
        } else if (!out.empty()) {
            ASSERT_GE(out.size(), 3u);
            EXPECT_EQ(out.substr(out.size() - 3), "...") << "size " << size;
            std::string kept = out.substr(0, out.size() - 3);
            EXPECT_EQ(src.compare(0, kept.size(), kept), 0) << "size " << size;
            // It keeps as much as fits: at most 3 bytes of a character were dropped.
            EXPECT_GE(kept.size() + 3 + 1 + 3, size) << "size " << size;
        }
    }
}

TEST(CopyTruncated, CutJustBeforeMultibyteCharacter) {
    // "abc" + é + "xyz": a cut after "abc" plus one byte of é must back up to "abc".
    EXPECT_EQ(copy_into(8, "abc\xC3\xA9xyz"), "abc...");
    EXPECT_EQ(copy_into(9, "abc\xC3\xA9xyz"), "abc\xC3\xA9xyz");
    EXPECT_EQ(copy_into(9, "abc\xC3\xA9xyz123"), "abc\xC3\xA9...");
}

TEST(CopyTruncated, AllContinuationBytesDoesNotUnderflow) {
    std::string junk(20, '\x80');
    std::string out = copy_into(10, junk.c_str());
    EXPECT_EQ(out, "...");
}

}  // namespace
}  // namespace eventbox
