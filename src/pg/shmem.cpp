// Shared memory of the eventbox workers (see pg/shmem.hpp).
#include "pg/shmem.hpp"

#include "pg/guc.hpp"

extern "C" {
#include "access/twophase.h"
#include "access/xact.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/timestamp.h"
}

#include <cstring>

namespace eventbox::shmem {

namespace {

// Slots of one database's group: the supervisor, the relay, the ingest workers, the handler
// workers. The groups follow each other.
constexpr int kIngestSlots = static_cast<int>(Role::kIngest);
constexpr int kHandlerSlots = kIngestSlots + kMaxIngestWorkers;
constexpr int kSlots = kHandlerSlots + kMaxHandlerWorkers;
constexpr int kAllSlots = kSlots * kMaxDatabases;

// The slot of a worker within its group; -1 when the index is out of range.
int slot_of(Role role, int index) {
    switch (role) {
        case Role::kIngest:
            return index >= 0 && index < kMaxIngestWorkers ? kIngestSlots + index : -1;
        case Role::kHandler:
            return index >= 0 && index < kMaxHandlerWorkers ? kHandlerSlots + index : -1;
        default:
            return static_cast<int>(role);
    }
}
const char* const kRoleNames[] = {"supervisor", "relay", "ingest", "handler"};

struct WorkerSlot {
    pid_t pid;
    int role;
    Latch* latch;
    TimestampTz started_at;
    TimestampTz last_activity;
    uint64 messages;
    uint64 errors;
    uint64 duplicates;
    uint64 transport_ids;
    char state[32];
    char last_error[256];
};

constexpr int kStoredSlots = 1024;

struct Shared {
    slock_t mutex;
    pg_atomic_uint32 databases[kMaxDatabases];  // the Oid of each group (set_database())
    WorkerSlot slots[kAllSlots];
    pg_atomic_uint64 subscriptions_generation;
    pg_atomic_uint64 schema_changes;  // see schema_changing()
    // Changes that can make inbox rows wait again below a handler worker's low-water marks
    // (see inbox_generation()): bumped before such a transaction becomes visible and again
    // after; `inbox_in_flight` counts the transactions between the two bumps.
    pg_atomic_uint64 inbox_generation;
    pg_atomic_uint32 inbox_in_flight;
    pg_atomic_uint64 inbox_changes;         // the generation's moves but the periodic drops
    pg_atomic_uint64 stored[kStoredSlots];  // see inbox_stored()
    int n_writers;
    pg_atomic_uint32 writers[FLEXIBLE_ARRAY_MEMBER];  // indexed by pgprocno
};

Shared* shared = nullptr;
int my_slot = -1;

// The handler workers' shared low-water marks (see share_lane_mark()): open addressing by the
// lane's hash, never deleted (a lane's slot is reused for it); a lane whose names do not fit, or
// that finds no free slot within kLaneMarkProbes, is not shared.
constexpr int kLaneMarkSlots = 4096;
constexpr int kLaneMarkProbes = 64;
struct LaneMarkSlot {
    bool used;
    uint32 hash;
    Oid database;
    int32 partition;
    uint64 generation;
    int64 mark;
    char subscription[NAMEDATALEN];
    char topic[256];
};
struct LaneMarkTable {
    slock_t mutex;
    LaneMarkSlot slots[kLaneMarkSlots];
};
LaneMarkTable* lane_marks = nullptr;

// The handler timeout notes (see leave_handler_timeout_note()): `used` marks a note left and
// not taken; `left` orders them, the smallest replaced first.
constexpr int kTimeoutNotes = 32;
struct TimeoutNoteSlot {
    bool used;
    uint64 left;
    HandlerTimeoutNote note;
};
struct TimeoutNoteTable {
    slock_t mutex;
    uint64 next;
    TimeoutNoteSlot slots[kTimeoutNotes];
};
TimeoutNoteTable* timeout_notes = nullptr;
shmem_request_hook_type prev_request_hook = nullptr;
shmem_startup_hook_type prev_startup_hook = nullptr;

int writer_count() {
    return MaxBackends + NUM_AUXILIARY_PROCS + max_prepared_xacts;
}

Size shared_size() {
    return add_size(offsetof(Shared, writers), mul_size(sizeof(pg_atomic_uint32), writer_count()));
}

void request_hook() {
    if (prev_request_hook) prev_request_hook();
    RequestAddinShmemSpace(shared_size());
    RequestAddinShmemSpace(sizeof(LaneMarkTable));
    RequestAddinShmemSpace(sizeof(TimeoutNoteTable));
}

void startup_hook() {
    if (prev_startup_hook) prev_startup_hook();
    LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
    bool found = false;
    shared = static_cast<Shared*>(ShmemInitStruct("pg_eventbox", shared_size(), &found));
    if (!found) {
        memset(shared, 0, offsetof(Shared, writers));
        SpinLockInit(&shared->mutex);
        for (auto& db : shared->databases) pg_atomic_init_u32(&db, InvalidOid);
        pg_atomic_init_u64(&shared->subscriptions_generation, 1);
        pg_atomic_init_u64(&shared->schema_changes, 0);
        pg_atomic_init_u64(&shared->inbox_generation, 1);
        pg_atomic_init_u32(&shared->inbox_in_flight, 0);
        pg_atomic_init_u64(&shared->inbox_changes, 0);
        for (int i = 0; i < kStoredSlots; ++i) pg_atomic_init_u64(&shared->stored[i], 0);
        shared->n_writers = writer_count();
        for (int i = 0; i < shared->n_writers; ++i) pg_atomic_init_u32(&shared->writers[i], 0);
    }
    lane_marks = static_cast<LaneMarkTable*>(
        ShmemInitStruct("pg_eventbox lane marks", sizeof(LaneMarkTable), &found));
    if (!found) {
        memset(lane_marks, 0, sizeof(LaneMarkTable));
        SpinLockInit(&lane_marks->mutex);
    }
    timeout_notes = static_cast<TimeoutNoteTable*>(
        ShmemInitStruct("pg_eventbox handler timeout notes", sizeof(TimeoutNoteTable), &found));
    if (!found) {
        memset(timeout_notes, 0, sizeof(TimeoutNoteTable));
        SpinLockInit(&timeout_notes->mutex);
    }
    LWLockRelease(AddinShmemInitLock);
}

void detach_worker(int, Datum) {
    if (shared == nullptr || my_slot < 0) return;
    SpinLockAcquire(&shared->mutex);
    // A successor may own the slot already (a worker stopped and started again at once).
    if (shared->slots[my_slot].pid == MyProcPid) {
        shared->slots[my_slot].pid = 0;
        shared->slots[my_slot].latch = nullptr;
    }
    SpinLockRelease(&shared->mutex);
    my_slot = -1;
}

// The first slot of the group of the calling process's database; -1 when it has none.
int my_group_base() {
    if (shared == nullptr) return -1;
    int group = database_group(MyDatabaseId);
    return group < 0 ? -1 : group * kSlots;
}

// Sets the latch in `slot` (an index over all groups), if its worker runs.
void wake_slot(int slot) {
    SpinLockAcquire(&shared->mutex);
    Latch* latch = shared->slots[slot].latch;
    SpinLockRelease(&shared->mutex);
    if (latch != nullptr) SetLatch(latch);
}

}  // namespace

void install_hooks() {
    prev_request_hook = shmem_request_hook;
    shmem_request_hook = request_hook;
    prev_startup_hook = shmem_startup_hook;
    shmem_startup_hook = startup_hook;
}

bool available() {
    return shared != nullptr;
}

void set_database(int group, Oid database) {
    if (shared != nullptr && group >= 0 && group < kMaxDatabases)
        pg_atomic_write_u32(&shared->databases[group], database);
}

int database_group(Oid database) {
    if (shared == nullptr || !OidIsValid(database)) return -1;
    for (int g = 0; g < kMaxDatabases; ++g)
        if (pg_atomic_read_u32(&shared->databases[g]) == database) return g;
    return -1;
}

void attach_worker(Role role, int index) {
    static const char* const kRoleNames[] = {"supervisor", "relay", "ingest", "handler"};
    guc::set_worker_role(kRoleNames[static_cast<int>(role)]);
    int base = my_group_base();
    int slot = slot_of(role, index);
    if (base < 0 || slot < 0) return;
    slot += base;
    SpinLockAcquire(&shared->mutex);
    WorkerSlot& s = shared->slots[slot];
    s.pid = MyProcPid;
    s.role = static_cast<int>(role);
    s.latch = &MyProc->procLatch;
    s.started_at = s.last_activity = GetCurrentTimestamp();
    s.messages = s.errors = s.duplicates = s.transport_ids = 0;
    strlcpy(s.state, "starting", sizeof s.state);
    s.last_error[0] = '\0';
    SpinLockRelease(&shared->mutex);
    my_slot = slot;
    on_shmem_exit(detach_worker, 0);
}

void set_state(const char* state) {
    if (shared == nullptr || my_slot < 0) return;
    TimestampTz now = GetCurrentTimestamp();
    SpinLockAcquire(&shared->mutex);
    strlcpy(shared->slots[my_slot].state, state, sizeof shared->slots[my_slot].state);
    shared->slots[my_slot].last_activity = now;
    SpinLockRelease(&shared->mutex);
}

void count_messages(uint64 n) {
    if (shared == nullptr || my_slot < 0 || n == 0) return;
    TimestampTz now = GetCurrentTimestamp();
    SpinLockAcquire(&shared->mutex);
    shared->slots[my_slot].messages += n;
    shared->slots[my_slot].last_activity = now;
    SpinLockRelease(&shared->mutex);
}

uint64 inflow_messages() {
    int base = my_group_base();
    if (base < 0) return 0;
    uint64 total = 0;
    SpinLockAcquire(&shared->mutex);
    for (int i = base + kIngestSlots; i < base + kHandlerSlots + kMaxHandlerWorkers; ++i)
        if (shared->slots[i].pid != 0) total += shared->slots[i].messages;
    SpinLockRelease(&shared->mutex);
    return total;
}

void count_duplicates(uint64 n) {
    if (shared == nullptr || my_slot < 0 || n == 0) return;
    SpinLockAcquire(&shared->mutex);
    shared->slots[my_slot].duplicates += n;
    SpinLockRelease(&shared->mutex);
}

void count_transport_ids(uint64 n) {
    if (shared == nullptr || my_slot < 0 || n == 0) return;
    SpinLockAcquire(&shared->mutex);
    shared->slots[my_slot].transport_ids += n;
    SpinLockRelease(&shared->mutex);
}

void record_error(const char* message) {
    if (shared == nullptr || my_slot < 0) return;
    SpinLockAcquire(&shared->mutex);
    shared->slots[my_slot].errors += 1;
    strlcpy(shared->slots[my_slot].last_error, message, sizeof shared->slots[my_slot].last_error);
    SpinLockRelease(&shared->mutex);
}

void wake_relay() {
    int base = my_group_base();
    if (base >= 0) wake_slot(base + static_cast<int>(Role::kRelay));
}

void wake_handlers() {
    int base = my_group_base();
    if (base < 0) return;
    for (int i = 0; i < kMaxHandlerWorkers; ++i) wake_slot(base + kHandlerSlots + i);
}

// The generation is shared by all databases: a change in one makes the others' workers re-read
// their configuration too, which costs them a few statements and nothing else.
void subscriptions_changed() {
    if (shared == nullptr) return;
    pg_atomic_fetch_add_u64(&shared->subscriptions_generation, 1);
    int base = my_group_base();
    if (base < 0) return;
    for (int i = 0; i < kMaxIngestWorkers; ++i) wake_slot(base + kIngestSlots + i);
    // Enabled subscriptions, new handlers, retried messages: the handler workers may have work.
    wake_handlers();
}

namespace {

bool commit_callback_registered = false;
bool relay_at_commit = false;
bool changes_at_commit = false;
bool supervisor_at_commit = false;

bool inbox_at_commit = false;  // inbox_requeued_at_commit() was called in this transaction
bool inbox_in_flight = false;  // ... and its first bump is done, the second one not yet

// The two bumps of an inbox change (see inbox_generation()): the first before the commit makes
// it visible (in_flight, then generation), the second after (generation, then in_flight).
void inbox_bump_before_commit() {
    if (shared == nullptr || inbox_in_flight) return;
    pg_atomic_fetch_add_u32(&shared->inbox_in_flight, 1);
    pg_atomic_fetch_add_u64(&shared->inbox_generation, 1);
    pg_atomic_fetch_add_u64(&shared->inbox_changes, 1);
    inbox_in_flight = true;
}

void inbox_bump_after_commit() {
    if (shared == nullptr || !inbox_in_flight) return;
    pg_atomic_fetch_add_u64(&shared->inbox_changes, 1);
    pg_atomic_fetch_add_u64(&shared->inbox_generation, 1);
    pg_atomic_fetch_sub_u32(&shared->inbox_in_flight, 1);
    inbox_in_flight = false;
}

void on_xact_event(XactEvent event, void*) {
    if (event == XACT_EVENT_PRE_COMMIT || event == XACT_EVENT_PARALLEL_PRE_COMMIT) {
        if (inbox_at_commit) inbox_bump_before_commit();
        return;
    }
    // Ends the bracket whatever happens next (an abort after PRE_COMMIT too). A PREPAREd
    // transaction commits later in another session, unseen: the workers' periodic drop of their
    // marks covers it (docs/design/handlers.md, "Low-water marks").
    inbox_bump_after_commit();
    inbox_at_commit = false;
    if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT) {
        if (relay_at_commit) wake_relay();
        if (changes_at_commit) subscriptions_changed();
        if (supervisor_at_commit && my_group_base() >= 0)
            wake_slot(my_group_base() + static_cast<int>(Role::kSupervisor));
    } else if (event != XACT_EVENT_ABORT && event != XACT_EVENT_PARALLEL_ABORT &&
               event != XACT_EVENT_PREPARE) {
        return;
    }
    relay_at_commit = changes_at_commit = supervisor_at_commit = false;
}

void register_commit_callback_once() {
    if (commit_callback_registered) return;
    RegisterXactCallback(on_xact_event, nullptr);
    commit_callback_registered = true;
}

}  // namespace

void wake_relay_at_commit() {
    register_commit_callback_once();
    relay_at_commit = true;
}

void wake_supervisor_at_commit() {
    register_commit_callback_once();
    supervisor_at_commit = true;
}

void subscriptions_changed_at_commit() {
    register_commit_callback_once();
    changes_at_commit = true;
    // Every operation that calls it (retry, redrive, skip, replay, reprocess, handler and
    // subscription changes) may make inbox rows wait again.
    inbox_at_commit = true;
}

void inbox_requeued_at_commit() {
    register_commit_callback_once();
    inbox_at_commit = true;
}

void inbox_generation_bump() {
    if (shared != nullptr) pg_atomic_fetch_add_u64(&shared->inbox_generation, 1);
}

namespace {

pg_atomic_uint64* stored_slot(const char* subscription) {
    uint32 hash = hash_bytes(reinterpret_cast<const unsigned char*>(subscription),
                             static_cast<int>(strlen(subscription))) ^
                  (static_cast<uint32>(MyDatabaseId) * 2654435761u);
    return &shared->stored[hash % kStoredSlots];
}

}  // namespace

void inbox_stored(const char* subscription) {
    if (shared != nullptr) pg_atomic_fetch_add_u64(stored_slot(subscription), 1);
}

uint64 inbox_stored_count(const char* subscription) {
    // A full barrier: read before the pass takes its snapshot.
    return shared ? pg_atomic_fetch_add_u64(stored_slot(subscription), 0) : 0;
}

namespace {

// The slot of a lane (with the table's mutex held): its own, or a free one when `claim`;
// nullptr when none.
LaneMarkSlot* lane_mark_slot(const char* subscription, const char* topic, int32 partition,
                             bool claim) {
    std::size_t sl = strlen(subscription), tl = strlen(topic);
    if (sl >= NAMEDATALEN || tl >= sizeof(LaneMarkSlot::topic)) return nullptr;
    uint32 hash =
        hash_bytes(reinterpret_cast<const unsigned char*>(subscription), static_cast<int>(sl)) ^
        (hash_bytes(reinterpret_cast<const unsigned char*>(topic), static_cast<int>(tl)) *
         2654435761u) ^
        static_cast<uint32>(partition) ^ (static_cast<uint32>(MyDatabaseId) * 40503u);
    for (int k = 0; k < kLaneMarkProbes; ++k) {
        LaneMarkSlot* slot = &lane_marks->slots[(hash + k) % kLaneMarkSlots];
        if (!slot->used) {
            if (!claim) return nullptr;
            slot->used = true;
            slot->hash = hash;
            slot->database = MyDatabaseId;
            slot->partition = partition;
            slot->generation = 0;
            slot->mark = -1;
            memcpy(slot->subscription, subscription, sl + 1);
            memcpy(slot->topic, topic, tl + 1);
            return slot;
        }
        if (slot->hash == hash && slot->partition == partition && slot->database == MyDatabaseId &&
            strcmp(slot->subscription, subscription) == 0 && strcmp(slot->topic, topic) == 0)
            return slot;
    }
    return nullptr;
}

}  // namespace

void share_lane_mark(const char* subscription, const char* topic, int32 partition,
                     uint64 generation, int64 mark) {
    if (lane_marks == nullptr) return;
    SpinLockAcquire(&lane_marks->mutex);
    LaneMarkSlot* slot = lane_mark_slot(subscription, topic, partition, true);
    if (slot != nullptr) {
        if (slot->generation == generation) {
            slot->mark = Max(slot->mark, mark);
        } else if (slot->generation < generation) {
            slot->generation = generation;
            slot->mark = mark;
        }
    }
    SpinLockRelease(&lane_marks->mutex);
}

int64 shared_lane_mark(const char* subscription, const char* topic, int32 partition,
                       uint64 generation) {
    if (lane_marks == nullptr) return -1;
    int64 mark = -1;
    SpinLockAcquire(&lane_marks->mutex);
    LaneMarkSlot* slot = lane_mark_slot(subscription, topic, partition, false);
    if (slot != nullptr && slot->generation == generation) mark = slot->mark;
    SpinLockRelease(&lane_marks->mutex);
    return mark;
}

InboxGeneration inbox_generation() {
    if (shared == nullptr) return InboxGeneration{0, 1, 0};
    // Generation first, then in_flight (the reverse of the first bump's order): a bracket
    // opened after the generation was read shows as a later generation, one opened before it
    // shows in in_flight. fetch_add(0) is a full barrier.
    uint64 generation = pg_atomic_fetch_add_u64(&shared->inbox_generation, 0);
    uint64 changes = pg_atomic_fetch_add_u64(&shared->inbox_changes, 0);
    uint32 in_flight = pg_atomic_fetch_add_u32(&shared->inbox_in_flight, 0);
    return InboxGeneration{generation, in_flight, changes};
}

void schema_changing() {
    if (shared != nullptr) pg_atomic_fetch_add_u64(&shared->schema_changes, 1);
}

uint64 schema_changes() {
    return shared ? pg_atomic_read_u64(&shared->schema_changes) : 0;
}

uint64 subscriptions_generation() {
    return shared ? pg_atomic_read_u64(&shared->subscriptions_generation) : 0;
}

void publish_outbox_writer(TransactionId xid) {
    if (shared == nullptr || MyProc == nullptr) return;
    int index = MyProc->pgprocno;
    if (index < 0 || index >= shared->n_writers) return;
    // Written before the id is drawn; the sequence's buffer lock orders it before the nextval.
    pg_atomic_write_u32(&shared->writers[index], xid);
    pg_memory_barrier();
}

void outbox_writers(std::vector<uint32_t>& out) {
    out.clear();
    if (shared == nullptr) return;
    pg_memory_barrier();
    for (int i = 0; i < shared->n_writers; ++i) {
        uint32 xid = pg_atomic_read_u32(&shared->writers[i]);
        if (xid != InvalidTransactionId) out.push_back(xid);
    }
}

namespace {

bool same_lane(const HandlerTimeoutNote& note, Oid database, const char* subscription,
               const char* topic, int32 partition) {
    return note.database == database && note.partition == partition &&
           strcmp(note.subscription, subscription) == 0 && strcmp(note.topic, topic) == 0;
}

}  // namespace

void leave_handler_timeout_note(const HandlerTimeoutNote& note) {
    if (timeout_notes == nullptr) return;
    SpinLockAcquire(&timeout_notes->mutex);
    // The lane's own slot (a claim is settled before the lane is claimed again: an older note of
    // the lane is stale), else a free one, else the oldest.
    TimeoutNoteSlot* into = nullptr;
    for (TimeoutNoteSlot& slot : timeout_notes->slots)
        if (slot.used &&
            same_lane(slot.note, note.database, note.subscription, note.topic, note.partition))
            into = &slot;
    if (into == nullptr)
        for (TimeoutNoteSlot& slot : timeout_notes->slots)
            if (into == nullptr || (into->used && (!slot.used || slot.left < into->left)))
                into = &slot;
    into->used = true;
    into->left = ++timeout_notes->next;
    into->note = note;
    SpinLockRelease(&timeout_notes->mutex);
}

bool take_handler_timeout_note(const char* subscription, const char* topic, int32 partition,
                               HandlerTimeoutNote* out) {
    if (timeout_notes == nullptr) return false;
    bool found = false;
    SpinLockAcquire(&timeout_notes->mutex);
    for (TimeoutNoteSlot& slot : timeout_notes->slots)
        if (slot.used && same_lane(slot.note, MyDatabaseId, subscription, topic, partition)) {
            *out = slot.note;
            slot.used = false;
            found = true;
            break;
        }
    SpinLockRelease(&timeout_notes->mutex);
    return found;
}

int worker_slots() {
    return kSlots;
}

bool read_worker(int slot, WorkerInfo* out) {
    int base = my_group_base();
    if (base < 0 || slot < 0 || slot >= kSlots) return false;
    WorkerSlot copy;
    SpinLockAcquire(&shared->mutex);
    copy = shared->slots[base + slot];
    SpinLockRelease(&shared->mutex);
    if (copy.pid == 0) return false;
    out->pid = copy.pid;
    out->role = kRoleNames[copy.role];
    memcpy(out->state, copy.state, sizeof out->state);
    out->last_activity = copy.last_activity;
    out->started_at = copy.started_at;
    out->messages = copy.messages;
    out->errors = copy.errors;
    memcpy(out->last_error, copy.last_error, sizeof out->last_error);
    out->duplicates = copy.duplicates;
    out->transport_ids = copy.transport_ids;
    return true;
}

}  // namespace eventbox::shmem
