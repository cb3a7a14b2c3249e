// JSON text and tokens of the registry formats (see registry/json_text.hpp).
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

bool TokenWriter::text(JsonTokens::Kind kind, const char* s, std::size_t len, bool check) {
    if (check && !inbox::valid_utf8(s, len)) return false;
    std::size_t offset = t_->text.size();
    t_->text.append(s, len);
    t_->text.push_back('\0');
    t_->tokens.push_back(JsonTokens::Token{kind, offset, len});
    return true;
}

namespace {

bool is_integer(std::string_view number) {
    return number.find_first_of(".eE") == std::string_view::npos;
}

}  // namespace

std::vector<std::optional<std::string>> top_fields(const JsonTokens& tokens,
                                                   const std::vector<std::string_view>& fields) {
    std::vector<std::optional<std::string>> values(fields.size());
    if (tokens.tokens.empty() || tokens.tokens[0].kind != JsonTokens::kBeginObject) return values;
    std::size_t level = 0;
    int field = -1;  // the requested field whose value comes next
    for (const JsonTokens::Token& t : tokens.tokens) {
        bool top_value = level == 1 && field >= 0;
        switch (t.kind) {
            case JsonTokens::kBeginObject:
            case JsonTokens::kBeginArray:
                // scan_json() gives such a member "" (neither an id nor a type)
                if (top_value) values[field].emplace();
                ++level;
                field = -1;
                continue;
            case JsonTokens::kEndObject:
            case JsonTokens::kEndArray:
                --level;
                continue;
            case JsonTokens::kKey:
                field = -1;
                if (level == 1)
                    for (std::size_t i = 0; i < fields.size(); ++i)
                        if (fields[i] == std::string_view(tokens.at(t), t.len))
                            field = static_cast<int>(i);
                continue;
            case JsonTokens::kString:
            case JsonTokens::kNumber:
                if (top_value) {
                    std::string_view v(tokens.at(t), t.len);
                    if (t.kind == JsonTokens::kString || is_integer(v))
                        values[field].emplace(v);
                    else
                        values[field].reset();
                }
                break;
            default:
                if (top_value) values[field].reset();
                break;
        }
        field = -1;
    }
    return values;
}

void append_tokens_json(const JsonTokens& tokens, std::string* out) {
    bool comma = false;  // a value came before at this level: the next member needs a ','
    for (const JsonTokens::Token& t : tokens.tokens) {
        switch (t.kind) {
            case JsonTokens::kEndObject:
            case JsonTokens::kEndArray:
                out->push_back(t.kind == JsonTokens::kEndObject ? '}' : ']');
                comma = true;
                continue;
            case JsonTokens::kKey:
                if (comma) out->push_back(',');
                messages::append_json_string(*out, std::string_view(tokens.at(t), t.len));
                out->push_back(':');
                comma = false;
                continue;
            default:
                break;
        }
        if (comma) out->push_back(',');
        switch (t.kind) {
            case JsonTokens::kBeginObject:
            case JsonTokens::kBeginArray:
                out->push_back(t.kind == JsonTokens::kBeginObject ? '{' : '[');
                comma = false;
                continue;
            case JsonTokens::kString:
                messages::append_json_string(*out, std::string_view(tokens.at(t), t.len));
                break;
            case JsonTokens::kNumber:
                out->append(tokens.at(t), t.len);
                break;
            case JsonTokens::kTrue:
                out->append("true");
                break;
            case JsonTokens::kFalse:
                out->append("false");
                break;
            default:
                out->append("null");
                break;
        }
        comma = true;
    }
}

}  // namespace eventbox::registry
