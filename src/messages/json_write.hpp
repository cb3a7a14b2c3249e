// Writing JSON text: a string literal. Shared by the metrics endpoint's JSON, the HTTP bulk
// bodies and the registry formats' decoders. Pure C++.
#pragma once

#include <string>
#include <string_view>

namespace eventbox::messages {

// Appends `s` as a quoted JSON string: '"' and '\' escaped, \n, \r and \t by name, the other
// control characters as \u00XX, every other byte as it is (a caller that needs valid UTF-8
// checks it first).
void append_json_string(std::string& out, std::string_view s);

}  // namespace eventbox::messages
