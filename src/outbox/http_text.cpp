// What the HTTP side reads and writes as text: response verdicts, Retry-After, header tokens,
// UTF-8 and JSON checks (see outbox/http_text.hpp). Pure C++.
#include "outbox/http_text.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <ctime>

#include "inbox/record.hpp"
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
    if (!inbox::valid_utf8(payload, len)) return false;  // raw NUL: not JSON either
    return inbox::scan_json(std::string_view(payload, len), {}).valid;
}

bool is_utf8(std::string_view text) {
    // NUL is UTF-8 (a JSON string escapes it); inbox::valid_utf8() refuses it for PostgreSQL's
    // text, so the text is checked between its NULs.
    for (std::size_t start = 0;;) {
        std::size_t nul = text.find('\0', start);
        std::size_t end = nul == std::string_view::npos ? text.size() : nul;
        if (!inbox::valid_utf8(text.data() + start, end - start)) return false;
        if (nul == std::string_view::npos) return true;
        start = nul + 1;
    }
}

std::string describe_response(int status, std::string_view body) {
    std::string out = "HTTP " + std::to_string(status);
    if (!body.empty()) out += ": " + printable(body, kBodyExcerpt);
    return out;
}

}  // namespace eventbox::http
