// jsonb values of inbox rows built without jsonb_in (see inbox/jsonb.hpp). PostgreSQL-side
// code: no object with a destructor lives on a frame an ERROR can longjmp across; the PostgreSQL
// calls whose failure makes a row unparsable run inside pg_guard(), within call_cpp().
#include "inbox/jsonb.hpp"

extern "C" {
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonb.h"
}

#include <string>

#include "pg/boundary.hpp"
#include "registry/json_text.hpp"

using eventbox::pg::call_cpp;
using eventbox::pg::pg_guard;

namespace eventbox::inbox {

namespace {

// A string's length for a JsonbValue, with jsonb_in's limit and error.
int checked_jsonb_length(std::size_t len) {
    if (len > JENTRY_OFFLENMASK)
        ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
                        errmsg("string too long to represent as jsonb string"),
                        errdetail("Due to an implementation restriction, jsonb strings cannot "
                                  "exceed %d bytes.",
                                  JENTRY_OFFLENMASK)));
    return static_cast<int>(len);
}

// jsonb from JSON text, for C++ code (within call_cpp()); on a PostgreSQL error (input the C++
// checks let through) returns false with the reason in `note`.
bool guarded_jsonb(const char* data, std::size_t len, Datum* out, std::string* note) {
    try {
        *out = pg_guard(
            [&] { return DirectFunctionCall1(jsonb_in, CStringGetDatum(pnstrdup(data, len))); });
        return true;
    } catch (const Error& e) {
        *note = std::string("value rejected by jsonb: ") + e.what();
        return false;
    }
}

// The same from PostgreSQL-side code.
bool to_jsonb(const char* data, std::size_t len, Datum* out, std::string* note) {
    return call_cpp([&] { return guarded_jsonb(data, len, out, note); });
}

// Nesting up to which a payload's jsonb is built from its tokens: jsonb_in's recursive parser
// could meet the stack limit beyond some depth where building from tokens would not.
constexpr std::size_t kMaxTokenDepth = 64;

void push_scalar(JsonbParseState** state, JsonbValue** res, JsonbValue* v) {
    if (*state == nullptr) {
        // A lone scalar, stored as jsonb_in stores it: a one-element raw scalar array.
        JsonbValue array;
        array.type = jbvArray;
        array.val.array.rawScalar = true;
        array.val.array.nElems = 1;
        *res = pushJsonbValue(state, WJB_BEGIN_ARRAY, &array);
        *res = pushJsonbValue(state, WJB_ELEM, v);
        *res = pushJsonbValue(state, WJB_END_ARRAY, nullptr);
    } else {
        *res = pushJsonbValue(state, (*state)->contVal.type == jbvObject ? WJB_VALUE : WJB_ELEM, v);
    }
}

// jsonb from the scanner's tokens of a value: the pushJsonbValue calls jsonb_in makes for the
// same text (numbers through numeric_in, like jsonb_in), without parsing it a second time.
Datum tokens_to_jsonb(const JsonTokens& t) {
    JsonbParseState* state = nullptr;
    JsonbValue* res = nullptr;
    for (const JsonTokens::Token& token : t.tokens) {
        JsonbValue v;
        switch (token.kind) {
            case JsonTokens::kBeginObject:
                res = pushJsonbValue(&state, WJB_BEGIN_OBJECT, nullptr);
                continue;
            case JsonTokens::kEndObject:
                res = pushJsonbValue(&state, WJB_END_OBJECT, nullptr);
                continue;
            case JsonTokens::kBeginArray:
                res = pushJsonbValue(&state, WJB_BEGIN_ARRAY, nullptr);
                continue;
            case JsonTokens::kEndArray:
                res = pushJsonbValue(&state, WJB_END_ARRAY, nullptr);
                continue;
            case JsonTokens::kKey:
            case JsonTokens::kString:
                v.type = jbvString;
                v.val.string.val = const_cast<char*>(t.at(token));
                v.val.string.len = checked_jsonb_length(token.len);
                if (token.kind == JsonTokens::kKey) {
                    res = pushJsonbValue(&state, WJB_KEY, &v);
                    continue;
                }
                break;
            case JsonTokens::kNumber:
                v.type = jbvNumeric;
                v.val.numeric = DatumGetNumeric(
                    DirectFunctionCall3(numeric_in, CStringGetDatum(t.at(token)),
                                        ObjectIdGetDatum(InvalidOid), Int32GetDatum(-1)));
                break;
            case JsonTokens::kTrue:
            case JsonTokens::kFalse:
                v.type = jbvBool;
                v.val.boolean = token.kind == JsonTokens::kTrue;
                break;
            case JsonTokens::kNull:
                v.type = jbvNull;
                break;
        }
        push_scalar(&state, &res, &v);
    }
    if (res == nullptr) elog(ERROR, "eventbox ingest: no tokens for a JSON value");
    return JsonbPGetDatum(JsonbValueToJsonb(res));
}

}  // namespace

// The headers object of `row` as jsonb, built from its members: the value jsonb_in makes of
// the same object as JSON text (pushJsonbValue keeps the last of repeated keys, like jsonb_in),
// without writing and parsing that text.
Datum headers_jsonb(const Classified& row) {
    JsonbParseState* state = nullptr;
    pushJsonbValue(&state, WJB_BEGIN_OBJECT, nullptr);
    for (const HeaderField& field : row.headers) {
        JsonbValue v;
        v.type = jbvString;
        v.val.string.val = const_cast<char*>(field.name.data());
        v.val.string.len = checked_jsonb_length(field.name.size());
        pushJsonbValue(&state, WJB_KEY, &v);
        if (field.value) {
            v.type = jbvString;
            v.val.string.val = const_cast<char*>(field.value->data());
            v.val.string.len = checked_jsonb_length(field.value->size());
        } else {
            v.type = jbvNull;
        }
        pushJsonbValue(&state, WJB_VALUE, &v);
    }
    return JsonbPGetDatum(JsonbValueToJsonb(pushJsonbValue(&state, WJB_END_OBJECT, nullptr)));
}

// The payload of a parsable row as jsonb: from its tokens where they give what jsonb_in gives
// (UTF-8 database, shallow nesting), else by jsonb_in. On a PostgreSQL error (a number numeric
// cannot hold) returns false with the reason in `note`, as to_jsonb does.
bool payload_jsonb(const Classified& row, const char* data, std::size_t len, Datum* out,
                   std::string* note) {
    if (GetDatabaseEncoding() != PG_UTF8 || row.payload.depth > kMaxTokenDepth ||
        row.payload.tokens.empty()) {
        if (len > 0 || row.payload.tokens.empty()) return to_jsonb(data, len, out, note);
        return call_cpp([&] {  // tokens without text (a decoded Avro value): their text
            std::string text;
            registry::append_tokens_json(row.payload, &text);
            return guarded_jsonb(text.data(), text.size(), out, note);
        });
    }
    return call_cpp([&] {
        try {
            *out = pg_guard([&] { return tokens_to_jsonb(row.payload); });
            return true;
        } catch (const Error& e) {
            *note = std::string("value rejected by jsonb: ") + e.what();
            return false;
        }
    });
}

bool text_jsonb(const char* data, std::size_t len, Datum* out, std::string* note) {
    return to_jsonb(data, len, out, note);
}

}  // namespace eventbox::inbox
