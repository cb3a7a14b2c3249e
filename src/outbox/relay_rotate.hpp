// The relay's rotation and truncation of the rotated outbox tables (relay_rotate.cpp;
// docs/design/outbox-rotation.md, "Writing: which table" and "Truncating"). PostgreSQL side,
// internal to the relay.
#pragma once

extern "C" {
#include "postgres.h"

#include "utils/timestamp.h"
}

namespace eventbox::relay_worker {

// In the pass's transaction, after the settled position was stored; at most once a second
// (`now`). Brings each closed table one step closer to empty, in this order: records the next
// xid with a table closed by an earlier transaction (switched_xid), takes its max_id once no
// transaction below that xid runs (prepared ones included), marks it settled once W is above
// max_id and no stored gap reaches into it, truncates it (with its ack rows) once it has been
// settled for eventbox.outbox_retention, when its lock is free at once. Last, opens the next
// table when the open one is older than the rotation period or has reached
// eventbox.outbox_rotation_size, holds rows and the next is empty.
void rotate_outbox(TimestampTz now);

}  // namespace eventbox::relay_worker
