// Shared state of the eventbox workers: one slot per worker (for eventbox.workers and wake-ups)
// and, per backend, the xid of its transaction that last drew an outbox id (for the relay's
// late-commit rechecks).
#pragma once

extern "C" {
#include "postgres.h"

#include "datatype/timestamp.h"
}

#include <cstdint>
#include <vector>

#include "workers/database_list.hpp"

namespace eventbox::shmem {

enum class Role : int { kSupervisor = 0, kRelay = 1, kIngest = 2, kHandler = 3 };
inline constexpr int kMaxIngestWorkers = 8;
inline constexpr int kMaxHandlerWorkers = 12;
// Every database eventbox.database lists has a group of worker slots of its own: its workers
// claim, wake and show (eventbox.workers) only the slots of their database's group.
inline constexpr int kMaxDatabases = worker::kMaxDatabases;

// Registers the shared memory request and startup hooks; called from _PG_init.
void install_hooks();
// True when the library was preloaded and the shared state exists.
bool available();

// Gives group `group` (its position in eventbox.database) to `database` (the launcher, before
// it starts that database's supervisor).
void set_database(int group, Oid database);
// The group of `database`; -1 when eventbox.database does not list it (or its supervisor has not
// been started yet).
int database_group(Oid database);

// Claims the slot of `role` (plus `index` for ingest and handler workers) for this process,
// released automatically at exit.
// Also sets eventbox.worker_role (pg/guc.hpp) for the process.
void attach_worker(Role role, int index = 0);
void set_state(const char* state);
void count_messages(uint64 n);
void count_duplicates(uint64 n);     // records already in the inbox (ingest)
void count_transport_ids(uint64 n);  // records identified by topic/partition/offset (ingest)
void record_error(const char* message);
// Messages the running ingest and handler workers counted (count_messages()) since they started:
// a value that moved means they have been working since it was last read.
uint64 inflow_messages();

// The wake-ups below reach the workers of the calling process's database (none when
// eventbox.database does not list it).
// Sets the relay's latch, if a relay is running.
void wake_relay();
// Sets the latches of all running handler workers.
void wake_handlers();
// Announces committed subscription, handler or message-operation changes: bumps the generation
// and wakes the ingest and handler workers.
void subscriptions_changed();
uint64 subscriptions_generation();
// Counts the statements that drop or alter the extension or its schema (bumped while they hold
// the schema lock exclusively): a worker that finds it moved since its last transaction checks
// which install it serves, even when it did not have to wait for the lock.
void schema_changing();
uint64 schema_changes();

// Wake-ups that take effect when the current transaction commits (dropped on abort and on
// PREPARE): the relay for messages sent in it, the workers for configuration changed in it.
void wake_relay_at_commit();
void subscriptions_changed_at_commit();
// Inbox rows that may wait again below offsets a handler worker already passed (a requeue, a
// record stored again at a lower offset): announced by inbox_requeued_at_commit(), which bumps
// the generation once before the transaction's commit makes it visible and once after. A worker
// that reads the generation before and after a read knows whether such a change could have
// become visible in between; `in_flight` counts the transactions between their two bumps.
// `changes` moves with the generation except at the periodic drop (inbox_generation_bump()):
// what a quiet subscription waits for (handlers/quiet.hpp).
struct InboxGeneration {
    uint64 generation;
    uint32 in_flight;
    uint64 changes;
};
void inbox_requeued_at_commit();
InboxGeneration inbox_generation();
// Moves the generation without a change (the handler workers' periodic drop of their marks).
void inbox_generation_bump();
// Inbox rows stored for the handlers, by subscription: the ingest worker counts each batch that
// stored some, after its commit (inbox_stored()); a handler worker whose pass found nothing to
// do in a subscription passes over it while its count, the inbox generation and the
// subscriptions' generation stay (handlers/quiet.hpp). The counts live in a fixed table by hash
// of database and name: subscriptions that share a slot only make each other looked at.
void inbox_stored(const char* subscription);
uint64 inbox_stored_count(const char* subscription);
// The handler workers' live-range marks, shared (a lane goes from worker to worker): each
// holds for the generation it was derived under; share_lane_mark() raises a lane's mark of that
// generation or replaces an older one; shared_lane_mark() returns -1 unless the lane has one
// of `generation`.
void share_lane_mark(const char* subscription, const char* topic, int32 partition,
                     uint64 generation, int64 mark);
int64 shared_lane_mark(const char* subscription, const char* topic, int32 partition,
                       uint64 generation);

// Notes left by handler workers terminated because a handler ran past eventbox.handler_timeout
// and ignored its cancel (handlers/handler_call.cpp): the pass that settles the claim of that
// lane takes the note, and the attempt's error names the timeout rather than a crash. A few are
// kept (a new one replaces the oldest); a crash restart loses them with the rest of shared
// memory, and a claim settled without a note reads as a crash.
struct HandlerTimeoutNote {
    Oid database;
    char subscription[NAMEDATALEN];
    char topic[256];
    int32 partition;
    uint64 message_hash;  // of the message id: hash_bytes_extended(id, length, 0)
    int32 attempts;       // the message's attempts before the attempt the termination cut short
    int timeout_ms;       // eventbox.handler_timeout when it fired
};
// Leaves `note` (called while the terminated backend exits, before it releases its locks).
void leave_handler_timeout_note(const HandlerTimeoutNote& note);
// Takes (removes) the note left in this database for lane (subscription, topic, partition).
bool take_handler_timeout_note(const char* subscription, const char* topic, int32 partition,
                               HandlerTimeoutNote* out);

// Sets the supervisor's latch when the current transaction commits (an extension was created,
// updated or dropped).
void wake_supervisor_at_commit();

// A worker's slot as eventbox.workers() shows it (the slots of the caller's database).
struct WorkerInfo {
    pid_t pid;
    const char* role;  // "supervisor", "relay", "ingest" or "handler"
    char state[32];
    TimestampTz last_activity;
    TimestampTz started_at;
    uint64 messages;
    uint64 errors;
    char last_error[256];  // "" when none
    uint64 duplicates;
    uint64 transport_ids;
};
// The number of worker slots, and a copy of slot `slot` (0 <= slot < worker_slots()); false
// when no worker holds it.
int worker_slots();
bool read_worker(int slot, WorkerInfo* out);

// Publishes the current top-level xid as an outbox writer (before an outbox id is drawn).
void publish_outbox_writer(TransactionId xid);
// Xids of all backends' latest outbox-writing transactions (some may have finished).
void outbox_writers(std::vector<uint32_t>& out);

}  // namespace eventbox::shmem
