// Standard base64 (see core/base64.hpp).
#include "core/base64.hpp"

#include <cstdint>

namespace eventbox {

namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// The 6-bit value of base64 character `c`, or -1.
int sextet(char c) noexcept {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

}  // namespace

void append_base64(std::string_view bytes, std::string* out) {
    const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
    std::size_t len = bytes.size();
    std::size_t at = out->size();
    out->resize(at + 4 * ((len + 2) / 3));
    char* p = out->data() + at;
    std::size_t i = 0;
    for (; i + 3 <= len; i += 3) {
        uint32_t w = (uint32_t{data[i]} << 16) | (uint32_t{data[i + 1]} << 8) | data[i + 2];
        *p++ = kAlphabet[w >> 18];
        *p++ = kAlphabet[(w >> 12) & 63];
        *p++ = kAlphabet[(w >> 6) & 63];
        *p++ = kAlphabet[w & 63];
    }
    if (len - i == 1) {
        uint32_t w = uint32_t{data[i]} << 16;
        *p++ = kAlphabet[w >> 18];
        *p++ = kAlphabet[(w >> 12) & 63];
        *p++ = '=';
        *p++ = '=';
    } else if (len - i == 2) {
        uint32_t w = (uint32_t{data[i]} << 16) | (uint32_t{data[i + 1]} << 8);
        *p++ = kAlphabet[w >> 18];
        *p++ = kAlphabet[(w >> 12) & 63];
        *p++ = kAlphabet[(w >> 6) & 63];
        *p++ = '=';
    }
}

std::string base64(std::string_view bytes) {
    std::string out;
    append_base64(bytes, &out);
    return out;
}

long decode_base64(std::string_view text, char* out) noexcept {
    std::size_t data_len = text.size();
    while (data_len > 0 && text[data_len - 1] == '=') --data_len;
    std::size_t pad = text.size() - data_len;
    // A lone character carries fewer than 8 bits; padding, when present, completes the group.
    if (data_len % 4 == 1) return -1;
    if (pad > 0 && (pad > 2 || text.size() % 4 != 0)) return -1;
    char* p = out;
    uint32_t buffer = 0;
    int bits = 0;
    for (std::size_t i = 0; i < data_len; ++i) {
        int v = sextet(text[i]);
        if (v < 0) return -1;
        buffer = (buffer << 6) | static_cast<uint32_t>(v);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            *p++ = static_cast<char>((buffer >> bits) & 0xff);
        }
    }
    return static_cast<long>(p - out);
}

bool decode_base64(std::string_view text, std::string* out) {
    out->resize(base64_decoded_bound(text.size()));
    long n = decode_base64(text, out->data());
    if (n < 0) return false;
    out->resize(static_cast<std::size_t>(n));
    return true;
}

}  // namespace eventbox
