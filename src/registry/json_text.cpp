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

void append_base64(const unsigned char* data, std::size_t len, std::string* out) {
    static constexpr char kAlphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::size_t i = 0;
    for (; i + 3 <= len; i += 3) {
        uint32_t w = (data[i] << 16) | (data[i + 1] << 8) | data[i + 2];
        out->push_back(kAlphabet[w >> 18]);
        out->push_back(kAlphabet[(w >> 12) & 63]);
        out->push_back(kAlphabet[(w >> 6) & 63]);
        out->push_back(kAlphabet[w & 63]);
    }
    if (len - i == 1) {
        uint32_t w = data[i] << 16;
        out->push_back(kAlphabet[w >> 18]);
        out->push_back(kAlphabet[(w >> 12) & 63]);
        out->append("==");
    } else if (len - i == 2) {
        uint32_t w = (data[i] << 16) | (data[i + 1] << 8);
        out->push_back(kAlphabet[w >> 18]);
        out->push_back(kAlphabet[(w >> 12) & 63]);
        out->push_back(kAlphabet[(w >> 6) & 63]);
        out->push_back('=');
    }
}

}  // namespace eventbox::registry
