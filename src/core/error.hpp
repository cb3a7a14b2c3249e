// Errors raised by pure C++ code, carrying what PostgreSQL needs to report them: a SQLSTATE,
// a message, and an optional detail and hint. Pure C++: never includes postgres.h.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace eventbox {

// Five-character SQLSTATE codes used by pure C++ code (names follow PostgreSQL's errcodes).
namespace sqlstate {
inline constexpr const char* kInvalidParameterValue = "22023";
inline constexpr const char* kInvalidTextRepresentation = "22P02";
inline constexpr const char* kProgramLimitExceeded = "54000";
inline constexpr const char* kConfigFileError = "F0000";
inline constexpr const char* kOutOfMemory = "53200";
inline constexpr const char* kInternalError = "XX000";
}  // namespace sqlstate

// True when `code` is five characters of [0-9A-Z], the shape PostgreSQL accepts.
bool is_valid_sqlstate(const char* code);

class Error : public std::runtime_error {
  public:
    Error(const char* sqlstate, std::string message, std::string detail = {},
          std::string hint = {});

    const char* sqlstate() const noexcept { return sqlstate_; }
    const std::string& detail() const noexcept { return detail_; }
    const std::string& hint() const noexcept { return hint_; }

  private:
    char sqlstate_[6];
    std::string detail_;
    std::string hint_;
};

// A plain-data copy of an exception, safe to keep while leaving C++ scopes and then hand to
// ereport(). Fixed buffers: filling it never allocates, so it cannot throw.
struct ErrorReport {
    static constexpr std::size_t kMessageMax = 1024;
    static constexpr std::size_t kDetailMax = 1024;
    static constexpr std::size_t kHintMax = 512;

    char sqlstate[6];
    char message[kMessageMax];
    char detail[kDetailMax];
    char hint[kHintMax];
};

// Fills `out` from the exception currently being handled. Call only inside a catch block.
// eventbox::Error keeps its SQLSTATE (XX000 if malformed); std::bad_alloc becomes 53200;
// other std::exceptions and unknown exceptions become XX000. Never throws.
void capture_current_exception(ErrorReport& out) noexcept;

// Copies `src` into a fixed buffer of `size` bytes, truncating on a UTF-8 character boundary
// and marking a truncation with "...". Never throws.
void copy_truncated(char* dst, std::size_t size, const char* src) noexcept;

}  // namespace eventbox
