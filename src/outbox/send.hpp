// eventbox.send(): a message validated at call time and stored in the outbox in the caller's
// transaction (or, while a handler runs in a replay, backfill or dry run, kept aside as the run
// says); the relay is woken when that transaction commits. PostgreSQL side.
#pragma once

extern "C" {
#include "postgres.h"

#include "fmgr.h"
}

namespace eventbox::outbox {

// The body of every send() overload, given its payload as the bytes to store (NULL: a
// tombstone; `json`: the payload was jsonb); `sixth`: the overloads taking publish_in_replay as
// their sixth argument. Returns the message id. Throws eventbox::Error: call it through
// pg::call_cpp().
Datum send_message(FunctionCallInfo fcinfo, bytea* payload, bool json, bool sixth);

// Throws 25006 (read-only transaction, with a hint naming a standby) when the transaction cannot
// write, as a plain INSERT would be refused: `function` names the caller in the message.
void require_writable(const char* function);

}  // namespace eventbox::outbox
