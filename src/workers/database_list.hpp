// The databases eventbox.database names (pure C++): a comma-separated list, one supervisor and
// its workers per database (workers/launcher.cpp).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace eventbox::worker {

// At most this many databases are served (shared memory keeps a group of worker slots and a
// block of metric counters per database).
inline constexpr int kMaxDatabases = 8;

// The names in `value`, in order: items separated by commas, blanks around an item ignored.
// Throws eventbox::Error (22023) for an empty item, a name of 64 bytes or more, a name listed
// twice, or more than kMaxDatabases names.
std::vector<std::string> parse_database_list(std::string_view value);

}  // namespace eventbox::worker
