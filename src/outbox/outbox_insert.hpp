// send()'s direct write of an outbox row: the heap insert and the index insertions an INSERT
// statement would do, without planning and starting a statement per call.
#pragma once

extern "C" {
#include "postgres.h"

#include "utils/jsonb.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"
}

namespace eventbox::outbox {

// The inbox message whose handler sends (see eventbox_e2e_seconds in docs/reference/metrics.md).
struct Cause {
    text* subscription;
    TimestampTz received_at;
};

// Stores the row with the columns' defaults (id from the sequence, status 'pending', now()),
// and `cause` (nullable) in cause_subscription and cause_received_at when the table has them.
// Returns false, storing nothing, when eventbox.outbox is not the plain table this code knows
// (triggers, rules, columns it does not know): `owner` is then the table's owner and
// `cause_columns` whether the table has the cause columns, for the caller's SQL path. Unique
// violations (a duplicate message_id) raise 23505 as an INSERT does.
bool insert_row(pg_uuid_t* message_id, text* topic, text* key, bytea* payload, Jsonb* headers,
                const Cause* cause, Oid* owner, bool* cause_columns);

// The next outbox id (eventbox.outbox.id's default): publishes the writer's xid first, so the
// relay can tell when a gap below its cursor is settled.
int64 next_id(bool check_permissions);

}  // namespace eventbox::outbox
