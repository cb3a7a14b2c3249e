// RFC 8785 canonical JSON and record fingerprints (see inbox/fingerprint.hpp).
#include "inbox/fingerprint.hpp"
#include "messages/json_scan.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace eventbox::inbox {

namespace {

constexpr char kHex[] = "0123456789abcdef";

void append_utf16(std::u16string& out, uint32_t cp) {
    if (cp < 0x10000) {
        out.push_back(static_cast<char16_t>(cp));
    } else {
        cp -= 0x10000;
        out.push_back(static_cast<char16_t>(0xD800 + (cp >> 10)));
        out.push_back(static_cast<char16_t>(0xDC00 + (cp & 0x3FF)));
    }
}

// One object member: its name's UTF-16 code units (what RFC 8785 sorts by), and its name and
// value in canonical form.
struct Member {
    std::u16string units;
    std::string name;
    std::string value;
};

// A recursive-descent reader that writes the canonical form of what it reads.
class Canonicalizer {
  public:
    explicit Canonicalizer(std::string_view in) : in_(in) {}

    bool document(std::string& out) {
        skip_space();
        if (!value(out, 0)) return false;
        skip_space();
        if (pos_ != in_.size()) return fail("unexpected text after the JSON value");
        return true;
    }

    const std::string& error() const { return error_; }

  private:
    bool fail(const char* what) {
        if (error_.empty()) error_ = std::string(what) + " at byte " + std::to_string(pos_);
        return false;
    }

    void skip_space() {
        while (pos_ < in_.size() &&
               (in_[pos_] == ' ' || in_[pos_] == '\t' || in_[pos_] == '\n' || in_[pos_] == '\r'))
            ++pos_;
    }

    bool literal(std::string_view word, std::string& out) {
        if (in_.substr(pos_, word.size()) != word) return fail("invalid literal");
        pos_ += word.size();
        out += word;
        return true;
    }

    bool value(std::string& out, int depth) {
        if (pos_ >= in_.size()) return fail("unexpected end of input");
        switch (in_[pos_]) {
            case '{':
                return object(out, depth + 1);
            case '[':
                return array(out, depth + 1);
            case '"':
                return string(out, nullptr);
            case 't':
                return literal("true", out);
            case 'f':
                return literal("false", out);
            case 'n':
                return literal("null", out);
            default:
                return number(out);
        }
    }

    bool object(std::string& out, int depth) {
        if (depth > kMaxCanonicalDepth) return fail("nesting too deep");
        ++pos_;  // {
        std::vector<Member> members;
        skip_space();
        if (pos_ < in_.size() && in_[pos_] == '}') {
            ++pos_;
            out += "{}";
            return true;
        }
        for (;;) {
            skip_space();
            if (pos_ >= in_.size() || in_[pos_] != '"') return fail("expected a member name");
            Member m;
            if (!string(m.name, &m.units)) return false;
            skip_space();
            if (pos_ >= in_.size() || in_[pos_] != ':') return fail("expected ':'");
            ++pos_;
            skip_space();
            if (!value(m.value, depth)) return false;
            members.push_back(std::move(m));
            skip_space();
            if (pos_ >= in_.size()) return fail("unexpected end of input");
            if (in_[pos_] == ',') {
                ++pos_;
                continue;
            }
            if (in_[pos_] != '}') return fail("expected ',' or '}'");
            ++pos_;
            break;
        }
        std::sort(members.begin(), members.end(),
                  [](const Member& a, const Member& b) { return a.units < b.units; });
        out.push_back('{');
        for (std::size_t i = 0; i < members.size(); ++i) {
            if (i > 0) {
                if (members[i].units == members[i - 1].units)
                    return fail("member name repeated in an object");
                out.push_back(',');
            }
            out += members[i].name;
            out.push_back(':');
            out += members[i].value;
        }
        out.push_back('}');
        return true;
    }

    bool array(std::string& out, int depth) {
        if (depth > kMaxCanonicalDepth) return fail("nesting too deep");
        ++pos_;  // [
        out.push_back('[');
        skip_space();
        if (pos_ < in_.size() && in_[pos_] == ']') {
            ++pos_;
            out.push_back(']');
            return true;
        }
        for (bool first = true;; first = false) {
            if (!first) out.push_back(',');
            skip_space();
            if (!value(out, depth)) return false;
            skip_space();
            if (pos_ >= in_.size()) return fail("unexpected end of input");
            if (in_[pos_] == ',') {
                ++pos_;
                continue;
            }
            if (in_[pos_] != ']') return fail("expected ',' or ']'");
            ++pos_;
            break;
        }
        out.push_back(']');
        return true;
    }

    bool hex4(uint32_t* unit) {
        if (in_.size() - pos_ < 4) return fail("truncated \\u escape");
        uint32_t v = 0;
        for (int i = 0; i < 4; ++i) {
            char c = in_[pos_ + i];
            v <<= 4;
            if (c >= '0' && c <= '9')
                v |= static_cast<uint32_t>(c - '0');
            else if (c >= 'a' && c <= 'f')
                v |= static_cast<uint32_t>(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F')
                v |= static_cast<uint32_t>(c - 'A' + 10);
            else
                return fail("invalid \\u escape");
        }
        pos_ += 4;
        *unit = v;
        return true;
    }

    // The next UTF-8 character (well-formed: no overlongs, surrogates or > U+10FFFF).
    bool utf8_char(uint32_t* cp) {
        auto c = static_cast<unsigned char>(in_[pos_]);
        std::size_t n;
        uint32_t v;
        if (c < 0x80)
            n = 0, v = c;
        else if ((c & 0xE0) == 0xC0)
            n = 1, v = c & 0x1F;
        else if ((c & 0xF0) == 0xE0)
            n = 2, v = c & 0x0F;
        else if ((c & 0xF8) == 0xF0)
            n = 3, v = c & 0x07;
        else
            return fail("invalid UTF-8");
        if (in_.size() - pos_ <= n) return fail("invalid UTF-8");
        for (std::size_t k = 1; k <= n; ++k) {
            auto b = static_cast<unsigned char>(in_[pos_ + k]);
            if ((b & 0xC0) != 0x80) return fail("invalid UTF-8");
            v = (v << 6) | (b & 0x3F);
        }
        if ((n == 1 && v < 0x80) || (n == 2 && v < 0x800) || (n == 3 && v < 0x10000) ||
            v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
            return fail("invalid UTF-8");
        pos_ += n + 1;
        *cp = v;
        return true;
    }

    // A string in canonical form (RFC 8785 section 3.2.2.2); its UTF-16 code units into
    // `units` when given.
    bool string(std::string& out, std::u16string* units) {
        ++pos_;  // "
        out.push_back('"');
        for (;;) {
            if (pos_ >= in_.size()) return fail("unterminated string");
            char c = in_[pos_];
            uint32_t cp = 0;
            if (c == '"') {
                ++pos_;
                break;
            }
            if (static_cast<unsigned char>(c) < 0x20) return fail("control character in a string");
            if (c == '\\') {
                if (++pos_ >= in_.size()) return fail("unterminated string");
                char e = in_[pos_++];
                switch (e) {
                    case '"':
                        cp = '"';
                        break;
                    case '\\':
                        cp = '\\';
                        break;
                    case '/':
                        cp = '/';
                        break;
                    case 'b':
                        cp = 0x08;
                        break;
                    case 'f':
                        cp = 0x0C;
                        break;
                    case 'n':
                        cp = 0x0A;
                        break;
                    case 'r':
                        cp = 0x0D;
                        break;
                    case 't':
                        cp = 0x09;
                        break;
                    case 'u': {
                        if (!hex4(&cp)) return false;
                        if (cp >= 0xDC00 && cp <= 0xDFFF) return fail("lone surrogate escape");
                        if (cp >= 0xD800 && cp <= 0xDBFF) {
                            uint32_t low = 0;
                            if (in_.substr(pos_, 2) != "\\u") return fail("lone surrogate escape");
                            pos_ += 2;
                            if (!hex4(&low)) return false;
                            if (low < 0xDC00 || low > 0xDFFF) return fail("lone surrogate escape");
                            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                        }
                        break;
                    }
                    default:
                        return fail("invalid escape");
                }
            } else if (!utf8_char(&cp)) {
                return false;
            }
            if (units) append_utf16(*units, cp);
            switch (cp) {
                case '"':
                    out += "\\\"";
                    break;
                case '\\':
                    out += "\\\\";
                    break;
                case 0x08:
                    out += "\\b";
                    break;
                case 0x09:
                    out += "\\t";
                    break;
                case 0x0A:
                    out += "\\n";
                    break;
                case 0x0C:
                    out += "\\f";
                    break;
                case 0x0D:
                    out += "\\r";
                    break;
                default:
                    if (cp < 0x20) {
                        out += "\\u00";
                        out.push_back(kHex[cp >> 4]);
                        out.push_back(kHex[cp & 15]);
                    } else {
                        append_utf8(out, cp);
                    }
            }
        }
        out.push_back('"');
        return true;
    }

    bool digits() {
        std::size_t start = pos_;
        while (pos_ < in_.size() && in_[pos_] >= '0' && in_[pos_] <= '9') ++pos_;
        return pos_ > start;
    }

    // A number as the double it denotes, printed the ECMAScript way.
    bool number(std::string& out) {
        std::size_t start = pos_;
        if (in_[pos_] == '-') ++pos_;
        if (pos_ >= in_.size()) return fail("invalid number");
        if (in_[pos_] == '0') {
            ++pos_;
        } else if (!digits()) {
            return fail("invalid value");
        }
        if (pos_ < in_.size() && in_[pos_] == '.') {
            ++pos_;
            if (!digits()) return fail("invalid number");
        }
        if (pos_ < in_.size() && (in_[pos_] == 'e' || in_[pos_] == 'E')) {
            ++pos_;
            if (pos_ < in_.size() && (in_[pos_] == '+' || in_[pos_] == '-')) ++pos_;
            if (!digits()) return fail("invalid number");
        }
        std::string_view text = in_.substr(start, pos_ - start);
        double v = 0;
        auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (ec == std::errc::result_out_of_range) {
            // Too small for a double rounds to zero, as JSON.parse does; too large is not I-JSON.
            std::string copy(text);
            v = std::strtod(copy.c_str(), nullptr);
            if (std::isinf(v)) return fail("number out of the IEEE 754 double range");
            v = 0;
        } else if (ec != std::errc() || end != text.data() + text.size()) {
            return fail("invalid number");
        }
        out += ecmascript_number(v);
        return true;
    }

    std::string_view in_;
    std::size_t pos_ = 0;
    std::string error_;
};

}  // namespace

bool canonicalize_json(std::string_view json, std::string* out, std::string* error) {
    out->clear();
    Canonicalizer c(json);
    if (c.document(*out)) return true;
    if (error) *error = c.error();
    return false;
}

std::string ecmascript_number(double value) {
    if (!std::isfinite(value))
        throw std::invalid_argument("NaN and infinities have no JSON representation");
    if (value == 0) return "0";  // -0 too
    char buf[64];
    auto result = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
    std::string_view sci(buf, static_cast<std::size_t>(result.ptr - buf));
    // Shortest round-trip digits as d[.ddd]e<sign><exp>: the digits and the decimal exponent.
    std::string out;
    if (sci[0] == '-') {
        out.push_back('-');
        sci.remove_prefix(1);
    }
    std::size_t e = sci.find('e');
    std::string digits;
    for (char c : sci.substr(0, e))
        if (c != '.') digits.push_back(c);
    int exponent = 0;
    std::string_view exp = sci.substr(e + 1);
    bool negative = exp[0] == '-';
    if (exp[0] == '+' || exp[0] == '-') exp.remove_prefix(1);
    std::from_chars(exp.data(), exp.data() + exp.size(), exponent);
    if (negative) exponent = -exponent;
    int k = static_cast<int>(digits.size());
    int n = exponent + 1;  // the decimal point follows the n-th digit
    if (k <= n && n <= 21) {
        out += digits;
        out.append(static_cast<std::size_t>(n - k), '0');
    } else if (0 < n && n <= 21) {
        out.append(digits, 0, static_cast<std::size_t>(n));
        out.push_back('.');
        out.append(digits, static_cast<std::size_t>(n), std::string::npos);
    } else if (-6 < n && n <= 0) {
        out += "0.";
        out.append(static_cast<std::size_t>(-n), '0');
        out += digits;
    } else {
        out.push_back(digits[0]);
        if (k > 1) {
            out.push_back('.');
            out.append(digits, 1, std::string::npos);
        }
        out.push_back('e');
        out.push_back(n - 1 >= 0 ? '+' : '-');
        out += std::to_string(std::abs(n - 1));
    }
    return out;
}

std::string sha256_hex(std::string_view data) {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr) != 1)
        throw std::runtime_error("SHA-256 failed");
    std::string hex;
    hex.reserve(2 * len);
    for (unsigned int i = 0; i < len; ++i) {
        hex.push_back(kHex[digest[i] >> 4]);
        hex.push_back(kHex[digest[i] & 15]);
    }
    return hex;
}

std::string fingerprint(std::string_view value, std::string* scratch) {
    if (canonicalize_json(value, scratch, nullptr)) return sha256_hex(*scratch);
    return sha256_hex(value);
}

}  // namespace eventbox::inbox
