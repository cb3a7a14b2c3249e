// What the HTTP side reads and writes as text: response verdicts, Retry-After, header tokens,
// UTF-8 and JSON checks (see outbox/http_text.hpp). Pure C++.
#include "outbox/http_text.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <ctime>

#include "messages/json_scan.hpp"
#include "messages/message_rules.hpp"

namespace eventbox::http {

namespace {

bool is_tchar(unsigned char c) {
    if (std::isalnum(c)) return true;
    switch (c) {
        case '!':
        case '#':
        case '$':
        case '&':
        case '\'':
        case '*':
        case '+':
        case '-':
        case '.':
        case '^':
        case '_':
        case '`':
        case '|':
        case '~':
            return true;
        default:
            return false;
    }
}

bool valid_utf8(const unsigned char* s, std::size_t n) {
    std::size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            ++i;
            continue;
        }
        std::size_t len;
        uint32_t cp;
        if ((c & 0xE0) == 0xC0)
            len = 2, cp = c & 0x1F;
        else if ((c & 0xF0) == 0xE0)
            len = 3, cp = c & 0x0F;
        else if ((c & 0xF8) == 0xF0)
            len = 4, cp = c & 0x07;
        else
            return false;
        if (i + len > n) return false;
        for (std::size_t k = 1; k < len; ++k) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
            cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += len;
    }
    return true;
}

}  // namespace

Verdict classify(int status) {
    if (status >= 200 && status < 300) return Verdict::kDelivered;
    if (status == 408 || status == 429 || status >= 500) return Verdict::kTransient;
    return Verdict::kPermanent;
}

int64_t parse_retry_after(std::string_view value, int64_t now_epoch_s) {
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t'))
        value.remove_prefix(1);
    while (!value.empty() && std::isspace(static_cast<unsigned char>(value.back())))
        value.remove_suffix(1);
    if (value.empty()) return -1;
    if (std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        if (value.size() > 9) return kMaxRetryAfterMs;
        int64_t seconds = std::stoll(std::string(value));
        return std::min(seconds * 1000, kMaxRetryAfterMs);
    }
    std::string date(value);
    time_t when = curl_getdate(date.c_str(), nullptr);
    if (when == static_cast<time_t>(-1)) return -1;
    int64_t delay = (static_cast<int64_t>(when) - now_epoch_s) * 1000;
    return std::clamp<int64_t>(delay, 0, kMaxRetryAfterMs);
}

std::string header_token(std::string_view name) {
    static const char hex[] = "0123456789ABCDEF";
    std::string out;
    out.reserve(name.size());
    for (unsigned char c : name) {
        if (is_tchar(c)) {
            out.push_back(static_cast<char>(c));
        } else {
            out.push_back('%');
            out.push_back(hex[c >> 4]);
            out.push_back(hex[c & 15]);
        }
    }
    return out;
}

bool is_json(const char* payload, std::size_t len) {
    if (payload == nullptr || len == 0) return false;
    if (!valid_utf8(reinterpret_cast<const unsigned char*>(payload), len)) return false;
    return inbox::scan_json(std::string_view(payload, len), {}).valid;
}

bool is_utf8(std::string_view text) {
    return valid_utf8(reinterpret_cast<const unsigned char*>(text.data()), text.size());
}

std::string describe_response(int status, std::string_view body) {
    std::string out = "HTTP " + std::to_string(status);
    if (!body.empty()) out += ": " + printable(body, kBodyExcerpt);
    return out;
}

}  // namespace eventbox::http
