// Which handler errors are not retried (subscription option non_retryable): a message whose
// handler raises one of them goes dead at its first attempt. Pure C++.
#pragma once

#include <string_view>

namespace eventbox::handlers {

// The SQLSTATE a handler raises to refuse a message: dead at once, whatever non_retryable says.
constexpr std::string_view kRefusedSqlstate = "QE001";

// The SQLSTATE an attempt's error text starts with ("22P02: invalid input ..."), or an empty
// view when it names none.
std::string_view error_sqlstate(std::string_view error);

// Whether `sqlstate` (5 characters) is listed in `codes`: comma-separated SQLSTATE codes (equal)
// and 2-character classes (its first two characters), in upper case.
bool sqlstate_listed(std::string_view sqlstate, std::string_view codes);

// Whether an attempt that failed with `error` goes dead at once under `codes`.
inline bool not_retryable(std::string_view error, std::string_view codes) {
    std::string_view state = error_sqlstate(error);
    return !state.empty() && (state == kRefusedSqlstate || sqlstate_listed(state, codes));
}

}  // namespace eventbox::handlers
