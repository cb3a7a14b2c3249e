// Parsing of eventbox.database (see workers/database_list.hpp).
#include "workers/database_list.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace eventbox::worker {

namespace {

constexpr std::size_t kMaxNameBytes = 63;  // NAMEDATALEN - 1
constexpr const char* kHint =
    "List database names separated by commas, for example 'app, billing'.";

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

}  // namespace

std::vector<std::string> parse_database_list(std::string_view value) {
    std::vector<std::string> names;
    for (;;) {
        std::size_t comma = value.find(',');
        std::string_view item = trim(value.substr(0, comma));
        if (item.empty())
            throw Error(sqlstate::kInvalidParameterValue, "eventbox.database has an empty name", {},
                        kHint);
        if (item.size() > kMaxNameBytes)
            throw Error(sqlstate::kInvalidParameterValue,
                        "eventbox.database names a database longer than 63 bytes", {}, kHint);
        if (std::find(names.begin(), names.end(), item) != names.end())
            throw Error(sqlstate::kInvalidParameterValue,
                        "eventbox.database names \"" + std::string(item) + "\" twice", {}, kHint);
        names.emplace_back(item);
        if (names.size() > static_cast<std::size_t>(kMaxDatabases))
            throw Error(sqlstate::kProgramLimitExceeded,
                        "eventbox.database names more than 8 databases", {},
                        "Serve the others from another server.");
        if (comma == std::string_view::npos) break;
        value.remove_prefix(comma + 1);
    }
    return names;
}

}  // namespace eventbox::worker
