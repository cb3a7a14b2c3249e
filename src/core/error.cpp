// Pure C++ error type and the exception -> plain-data capture used at every entry point.
#include "core/error.hpp"

#include <cstring>
#include <new>

namespace eventbox {

bool is_valid_sqlstate(const char* code) {
    if (code == nullptr) return false;
    for (int i = 0; i < 5; ++i) {
        char c = code[i];
        if (!((c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z'))) return false;
    }
    return code[5] == '\0';
}

Error::Error(const char* code, std::string message, std::string detail, std::string hint)
    : std::runtime_error(std::move(message)), detail_(std::move(detail)), hint_(std::move(hint)) {
    std::memcpy(sqlstate_, is_valid_sqlstate(code) ? code : sqlstate::kInternalError, 6);
}

void copy_truncated(char* dst, std::size_t size, const char* src) noexcept {
    if (size == 0) return;
    if (src == nullptr) src = "";
    std::size_t len = std::strlen(src);
    if (len < size) {
        std::memcpy(dst, src, len + 1);
        return;
    }
    static constexpr char kMark[] = "...";
    if (size <= sizeof(kMark)) {
        dst[0] = '\0';
        return;
    }
    std::size_t keep = size - sizeof(kMark);
    // Back up over UTF-8 continuation bytes so a character is never cut in half.
    while (keep > 0 && (static_cast<unsigned char>(src[keep]) & 0xC0) == 0x80) --keep;
    std::memcpy(dst, src, keep);
    std::memcpy(dst + keep, kMark, sizeof(kMark));
}

void capture_current_exception(ErrorReport& out) noexcept {
    out.detail[0] = '\0';
    out.hint[0] = '\0';
    try {
        throw;
    } catch (const Error& e) {
        std::memcpy(out.sqlstate, e.sqlstate(), 6);
        copy_truncated(out.message, sizeof out.message, e.what());
        copy_truncated(out.detail, sizeof out.detail, e.detail().c_str());
        copy_truncated(out.hint, sizeof out.hint, e.hint().c_str());
    } catch (const std::bad_alloc&) {
        std::memcpy(out.sqlstate, sqlstate::kOutOfMemory, 6);
        copy_truncated(out.message, sizeof out.message, "out of memory in pg_eventbox");
    } catch (const std::exception& e) {
        std::memcpy(out.sqlstate, sqlstate::kInternalError, 6);
        copy_truncated(out.message, sizeof out.message, e.what());
    } catch (...) {
        std::memcpy(out.sqlstate, sqlstate::kInternalError, 6);
        copy_truncated(out.message, sizeof out.message, "unknown C++ exception in pg_eventbox");
    }
}

}  // namespace eventbox
