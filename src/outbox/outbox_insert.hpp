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

// The rotated tables: eventbox.outbox_rows_0 .. _2, each with its outbox_acks_N
// (docs/design/outbox-rotation.md).
inline constexpr int kTables = 3;

// The inbox message whose handler sends (see eventbox_e2e_seconds in docs/reference/metrics.md).
struct Cause {
    text* subscription;
    TimestampTz received_at;
};

// Stores the row in the open rotated table (eventbox.outbox_rows_N, docs/design/
// outbox-rotation.md) with the columns' defaults (id from the sequence, now()), and `cause`
// (nullable) in cause_subscription and cause_received_at. Returns false, storing nothing, when
// that table is not the plain table this code knows (triggers, rules, indexes or columns it
// does not know): `owner` is then the table's owner and `cause_columns` whether it has the cause
// columns, for the caller's SQL path (an INSERT into the eventbox.outbox view, whose trigger
// inserts into the same table). So it does in a schema older than 0.6.0 (a live upgrade, before
// ALTER EXTENSION ... UPDATE), where eventbox.outbox is still the table. Unique violations (a
// duplicate message_id) raise 23505 as an INSERT does.
// `given_id`: the caller chose message_id (it is then looked for in the other rotated tables too).
bool insert_row(pg_uuid_t* message_id, bool given_id, text* topic, text* key, bytea* payload,
                Jsonb* headers, const Cause* cause, Oid* owner, bool* cause_columns);

// message_id is unique per rotated table (a unique index each); this finds a row of it that the
// caller just wrote into table `open` in the other tables too, and raises 23505 when one is there.
// The row is written first and the others looked for after, with a dirty snapshot that also sees
// rows of writers still running, whose outcome it waits for: of two writers of one id into two
// tables, the one that looks last sees the other's row (when both look at once, each waits for
// the other and the deadlock detector ends one of them), as an exclusion constraint does. It
// takes no lock per id: a transaction may write any number of rows (a lock per id filled the
// lock table at about 6,000 ids in one transaction).
void check_message_id_elsewhere(pg_uuid_t* message_id, int open);

// The number (0..2) of the open rotated table, read under a snapshot taken after the caller's
// xid was assigned (call it after next_id() or publishing the xid).
int open_table();

// The next outbox id (eventbox.outbox.id's default): publishes the writer's xid first, so the
// relay can tell when a gap below its cursor is settled.
int64 next_id(bool check_permissions);

}  // namespace eventbox::outbox
