// Non-retryable errors (see handlers/dead_policy.hpp).
#include "handlers/dead_policy.hpp"

namespace eventbox::handlers {

namespace {

bool sqlstate_char(char c) {
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z');
}

}  // namespace

std::string_view error_sqlstate(std::string_view error) {
    if (error.size() < 6 || error[5] != ':') return {};
    for (std::size_t i = 0; i < 5; ++i)
        if (!sqlstate_char(error[i])) return {};
    return error.substr(0, 5);
}

bool sqlstate_listed(std::string_view sqlstate, std::string_view codes) {
    if (sqlstate.size() != 5) return false;
    while (!codes.empty()) {
        std::size_t comma = codes.find(',');
        std::string_view code = codes.substr(0, comma);
        if ((code.size() == 2 && sqlstate.substr(0, 2) == code) ||
            (code.size() == 5 && sqlstate == code))
            return true;
        if (comma == std::string_view::npos) break;
        codes.remove_prefix(comma + 1);
    }
    return false;
}

}  // namespace eventbox::handlers
