// JSON text writers of the registry formats (see registry/json_text.hpp).
#include "registry/json_text.hpp"

#include "inbox/record.hpp"
#include "messages/json_write.hpp"

namespace eventbox::registry {

bool append_json_string(const char* s, std::size_t len, std::string* out) {
    // valid_utf8() refuses NUL, which JSON can only write as \u0000 and jsonb refuses anyway.
    if (!inbox::valid_utf8(s, len)) return false;
    messages::append_json_string(*out, std::string_view(s, len));
    return true;
}

}  // namespace eventbox::registry
