// The exact representation of a record's headers (see inbox/raw_headers.hpp).
#include "inbox/raw_headers.hpp"

#include <cstdint>
#include <cstring>

namespace eventbox::inbox {

namespace {

constexpr uint32_t kNullValue = 0xFFFFFFFFu;

char* put_u32(uint32_t v, char* p) noexcept {
    *p++ = static_cast<char>(v >> 24);
    *p++ = static_cast<char>(v >> 16);
    *p++ = static_cast<char>(v >> 8);
    *p++ = static_cast<char>(v);
    return p;
}

bool get_u32(std::string_view* rest, uint32_t* v) noexcept {
    if (rest->size() < 4) return false;
    const auto* b = reinterpret_cast<const unsigned char*>(rest->data());
    *v = (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
    rest->remove_prefix(4);
    return true;
}

}  // namespace

std::size_t raw_headers_size(const KafkaHeader* headers, std::size_t n) noexcept {
    std::size_t size = 0;
    for (std::size_t i = 0; i < n; ++i)
        size +=
            8 + headers[i].name.size() + (headers[i].value != nullptr ? headers[i].value_len : 0);
    return size;
}

void write_raw_headers(const KafkaHeader* headers, std::size_t n, char* out) noexcept {
    for (std::size_t i = 0; i < n; ++i) {
        const KafkaHeader& h = headers[i];
        out = put_u32(static_cast<uint32_t>(h.name.size()), out);
        if (!h.name.empty()) memcpy(out, h.name.data(), h.name.size());
        out += h.name.size();
        if (h.value == nullptr) {
            out = put_u32(kNullValue, out);
            continue;
        }
        out = put_u32(static_cast<uint32_t>(h.value_len), out);
        if (h.value_len > 0) memcpy(out, h.value, h.value_len);
        out += h.value_len;
    }
}

bool next_raw_header(std::string_view* rest, RawHeader* header) noexcept {
    std::string_view r = *rest;
    uint32_t name_len = 0, value_len = 0;
    if (!get_u32(&r, &name_len) || r.size() < name_len) return false;
    std::string_view name = r.substr(0, name_len);
    r.remove_prefix(name_len);
    if (!get_u32(&r, &value_len)) return false;
    if (value_len == kNullValue) {
        header->value = nullptr;
        header->value_len = 0;
    } else {
        if (r.size() < value_len) return false;
        header->value = r.data();
        header->value_len = value_len;
        r.remove_prefix(value_len);
    }
    header->name = name;
    *rest = r;
    return true;
}

long count_raw_headers(std::string_view bytes) noexcept {
    long n = 0;
    RawHeader h;
    while (!bytes.empty()) {
        if (!next_raw_header(&bytes, &h)) return -1;
        ++n;
    }
    return n;
}

}  // namespace eventbox::inbox
