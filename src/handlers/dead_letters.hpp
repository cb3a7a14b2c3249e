// The failure workflow of a subscription (docs/design/handlers.md): errors that are not retried
// (non_retryable), dead messages that hold back the later messages of their key (on_dead
// 'block_key'), and the dead-letter topic that dead and unparsable messages are sent to
// through the outbox, in the transaction that marks them. PostgreSQL side; its statements are
// kept plans run through worker::exec_kept (bounded by a lane's blocks or an id list).
#pragma once

extern "C" {
#include "postgres.h"
}

namespace eventbox::handlers::dead_letters {

// A subscription's failure options, as a handler pass reads them. Trivially destructible; the
// codes are palloc'd.
struct Policy {
    bool block_key;     // on_dead = 'block_key'
    bool has_topic;     // dead_letter_topic is set
    const char* codes;  // non_retryable, comma-separated ("" for none)
};

// Reads the options of `subscription` into `*policy` (their strings in `keep`) and makes them
// the current pass's policy. Defaults ('continue', no topic, no codes) when it is gone.
void load(Datum subscription, MemoryContext keep, Policy* policy);

// Whether an attempt that failed with `error` ("SQLSTATE: message") goes dead at once.
bool refuses(const Policy& policy, const char* error);

// Adds to keys[0 .. *n) (reallocated in the current memory context) the keys of lane
// (topic, partition) that a dead message holds back, or whose blocking message waits for a
// retry; forgets the blocks whose message was processed, skipped or deleted.
void add_blocked_keys(Datum subscription, Datum topic, int32 partition, Datum** keys, int* n);

// In the transaction that marked them dead: the current pass's policy blocks their keys and
// sends them to the dead-letter topic. `ids` is a text[] of message ids; only rows now 'dead'
// are taken.
void after_dead(Datum subscription, Datum ids);

// Ingest: in the transaction that stored them, sends the rows of `ids` (text[]) that the
// (sub)transaction `writer` inserted as 'unparsable' to the subscription's dead-letter topic, if
// it has one. `writer` is the xid the rows carry as xmin: a batch inserted in a subtransaction
// carries the subtransaction's, not the top-level one's. A row stored before (a replay) has an
// older xmin and is not sent twice.
void after_unparsable(Datum subscription, Datum ids, TransactionId writer);

}  // namespace eventbox::handlers::dead_letters
