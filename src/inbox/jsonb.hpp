// jsonb values of inbox rows, built the way jsonb_in would build them from the same JSON text
// but without writing or parsing text again: the headers object from its members, a payload
// from the JSON scanner's tokens (jsonb_in itself where the tokens might not give the same
// value). PostgreSQL-side; results are palloc'd in the current memory context.
#pragma once

extern "C" {
#include "postgres.h"
}

#include <cstddef>
#include <string>

#include "inbox/record.hpp"

namespace eventbox::inbox {

// The headers object of `row`. Raises a PostgreSQL ERROR only where jsonb_in would (a string
// beyond jsonb's size limit).
Datum headers_jsonb(const Classified& row);

// The payload of a parsable `row` whose value is [data, data+len) (len 0: the row's tokens
// only, a decoded Avro value, whose text is written from them where jsonb_in must build it).
// False, with the reason in `note`, when jsonb refuses it (a number numeric cannot hold, ...):
// the row is then unparsable.
bool payload_jsonb(const Classified& row, const char* data, std::size_t len, Datum* out,
                   std::string* note);

// JSON text [data, data+len) as jsonb by jsonb_in (a decoded key). False, with the reason in
// `note`, when jsonb refuses it.
bool text_jsonb(const char* data, std::size_t len, Datum* out, std::string* note);

}  // namespace eventbox::inbox
