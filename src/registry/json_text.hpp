// Small writers of JSON text shared by the registry formats' decoders: strings (checked to be
// UTF-8). Pure C++.
#pragma once

#include <cstddef>
#include <string>

namespace eventbox::registry {

// Appends [s, s+len) as a quoted JSON string; false (nothing sensible appended) when it is not
// valid UTF-8.
bool append_json_string(const char* s, std::size_t len, std::string* out);

}  // namespace eventbox::registry
