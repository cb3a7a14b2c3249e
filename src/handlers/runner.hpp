// One handler pass for one subscription: the code path shared by the handler workers and
// eventbox.process() (docs/design/guarantees.md, docs/design/architecture.md; how a pass goes:
// docs/design/handlers.md). Its files are listed in handlers/pass_internal.hpp.
#pragma once

extern "C" {
#include "postgres.h"

#include "utils/jsonb.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
}

namespace eventbox::handlers {

// Messages run in one top-level transaction at most (the subtransaction cache limit).
constexpr int kMessagesPerTransaction = 64;
// With batch handlers a transaction holds up to kMessagesPerTransaction subtransactions, a chunk
// each, and at most this many messages: a crash in a call counts the attempts of a transaction's
// messages (docs/design/handlers.md, "Claims").
constexpr int kBatchMessagesPerTransaction = 256;

// Chooses up to `max` messages lane by lane (taking each lane's advisory lock), counts their
// attempts, runs their handlers in subtransactions as the registered roles, and records what
// happened. With `own_transactions` (the workers) the attempt count commits (synchronously)
// before any handler runs, the messages then run in transactions of at most
// kMessagesPerTransaction each, which commit with their outcomes, and lane locks are session
// locks; otherwise (eventbox.process) all of it belongs to the caller's transaction. Returns how
// many messages were handled (processed, ignored, failed or dead); `*next_due_ms` gets the earliest
// retry time of a message it saw waiting (INT64_MAX if none), on PostgreSQL's clock. A worker's
// errors (outside its handlers) carry a CONTEXT line naming the subscription, the lane and the
// pass (worker::WorkContext).
int run_pass(const char* subscription, int max, bool own_transactions, int64* next_due_ms);

// Whether the last run_pass() found a lane of its subscription with work at or above the
// worker's marks (taken or not: locked by another worker, or waiting for a retry), or handled
// something: false means the subscription had nothing to do (handlers/quiet.hpp).
bool last_pass_found_work();

// Releases every lane lock this session holds (after an error in a worker).
void release_lane_locks();

// The eventbox.inbox row (a composite Datum) whose handlers this backend is running, or 0 outside
// a handler call: what eventbox.send() derives its lineage headers from.
Datum current_message();

// The mode of the handler run in progress: "live", "replay" (eventbox.reprocess(); also during
// eventbox.dry_run()) or "backfill"; nullptr outside a handler call.
const char* current_mode();

// During eventbox.dry_run(): records a send() (topic, key, payload, headers) in the message's
// report instead of storing it, and returns true; false otherwise (send() goes on).
bool dry_run_capture(text* topic, text* key, bytea* payload, bool json, Jsonb* headers);

// eventbox.dry_run(): runs the subscription's handlers on up to `max` inbox rows (those of
// `message_ids`, a text[] Datum, when not 0; received at or after `since` when has_since) in the
// caller's transaction, each in a subtransaction rolled back, as the handlers' run_as roles, and
// appends one row per message to `store` (message_id, outcome, sqlstate, error, tables, sends).
void dry_run(const char* subscription, Datum message_ids, bool has_since, TimestampTz since,
             int max, Tuplestorestate* store, TupleDesc desc);

}  // namespace eventbox::handlers
