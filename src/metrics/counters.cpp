// Shared-memory counters of eventbox.metrics() (see metrics/counters.hpp).
#include "metrics/counters.hpp"

extern "C" {
#include "access/xact.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
}

#include "pg/shmem.hpp"

#include <cstring>

namespace eventbox::metrics {

namespace {

struct AtomicHistogram {
    pg_atomic_uint64 counts[kBounds + 1];
    pg_atomic_uint64 sum_us;
};

// An entry's name is written under the mutex, between two increments of `version` (odd while
// it changes): a reader without the mutex trusts a name it read between two equal, even
// versions. An empty name is a free entry (its subscription was dropped).
struct SubscriptionEntry {
    pg_atomic_uint32 version;
    uint32 absent_sweeps;  // the supervisor's, under the mutex (sweep_subscriptions())
    char name[NAMEDATALEN];
    pg_atomic_uint64 records, stored, duplicates, transport_ids, unparsable, conflicts, skipped;
    pg_atomic_uint64 redelivered;  // RabbitMQ deliveries flagged redelivered
    // Membership 'group': offsets stored and not yet acknowledged by the group (a gauge, the
    // sum of the ingest workers' deltas).
    pg_atomic_uint64 group_uncommitted;
    pg_atomic_uint64 processed, retried, dead, ignored;
    AtomicHistogram duration;
    AtomicHistogram e2e;  // inbox received_at -> ack of a message its handlers sent
};

struct Shared {
    slock_t mutex;  // only to add, free and reuse subscription entries
    pg_atomic_uint32 n_used;
    pg_atomic_uint64 published, delivery_failures;
    AtomicHistogram latency;
    pg_atomic_uint64 restarts[kWorkerRoles];
    pg_atomic_uint64 purged[2];
    pg_atomic_uint64 overflowed;
    pg_atomic_uint64 outbox_added, outbox_settled;
    SubscriptionEntry entries[kMaxSubscriptions + 1];  // the last one: overflow
};

// One block per database group (pg/shmem.hpp), and a last one for the sessions of databases
// eventbox.database does not list (their send() counts; no worker reads them).
constexpr int kBlocks = shmem::kMaxDatabases + 1;
Shared* blocks = nullptr;
shmem_request_hook_type prev_request_hook = nullptr;
shmem_startup_hook_type prev_startup_hook = nullptr;

void request_hook() {
    if (prev_request_hook) prev_request_hook();
    RequestAddinShmemSpace(mul_size(sizeof(Shared), kBlocks));
}

void init_histogram(AtomicHistogram& h) {
    for (auto& c : h.counts) pg_atomic_init_u64(&c, 0);
    pg_atomic_init_u64(&h.sum_us, 0);
}

void startup_hook() {
    if (prev_startup_hook) prev_startup_hook();
    LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
    bool found = false;
    blocks = static_cast<Shared*>(
        ShmemInitStruct("pg_eventbox metrics", mul_size(sizeof(Shared), kBlocks), &found));
    for (int b = 0; b < kBlocks && !found; ++b) {
        Shared* shared = &blocks[b];
        memset(shared, 0, sizeof(Shared));
        SpinLockInit(&shared->mutex);
        pg_atomic_init_u32(&shared->n_used, 0);
        pg_atomic_init_u64(&shared->published, 0);
        pg_atomic_init_u64(&shared->delivery_failures, 0);
        init_histogram(shared->latency);
        for (auto& r : shared->restarts) pg_atomic_init_u64(&r, 0);
        for (auto& p : shared->purged) pg_atomic_init_u64(&p, 0);
        pg_atomic_init_u64(&shared->overflowed, 0);
        pg_atomic_init_u64(&shared->outbox_added, 0);
        pg_atomic_init_u64(&shared->outbox_settled, 0);
        for (SubscriptionEntry& e : shared->entries) {
            pg_atomic_init_u32(&e.version, 0);
            pg_atomic_init_u64(&e.records, 0);
            pg_atomic_init_u64(&e.stored, 0);
            pg_atomic_init_u64(&e.duplicates, 0);
            pg_atomic_init_u64(&e.transport_ids, 0);
            pg_atomic_init_u64(&e.unparsable, 0);
            pg_atomic_init_u64(&e.conflicts, 0);
            pg_atomic_init_u64(&e.redelivered, 0);
            pg_atomic_init_u64(&e.skipped, 0);
            pg_atomic_init_u64(&e.processed, 0);
            pg_atomic_init_u64(&e.retried, 0);
            pg_atomic_init_u64(&e.dead, 0);
            pg_atomic_init_u64(&e.ignored, 0);
            init_histogram(e.duration);
            init_histogram(e.e2e);
        }
    }
    LWLockRelease(AddinShmemInitLock);
}

// The block of the calling process's database: its group's (kept once found; a process's
// database never changes), else the last one.
Shared* this_block() {
    static int group = -1;
    if (blocks == nullptr) return nullptr;
    if (group < 0) group = shmem::database_group(MyDatabaseId);
    return &blocks[group < 0 ? kBlocks - 1 : group];
}

// The block of `database`'s group (the launcher counts the supervisors' restarts).
Shared* block_of(Oid database) {
    if (blocks == nullptr) return nullptr;
    int group = shmem::database_group(database);
    return &blocks[group < 0 ? kBlocks - 1 : group];
}

inline void add(pg_atomic_uint64* counter, uint64 n) {
    if (n != 0) pg_atomic_fetch_add_u64(counter, n);
}

void add_histogram(AtomicHistogram& to, const LocalHistogram& from) {
    for (int i = 0; i <= kBounds; ++i) add(&to.counts[i], from.counts[i]);
    add(&to.sum_us, from.sum_us);
}

// This process's last entry, by name and version: a batch of the same subscription finds it
// without a scan, unless the entry was freed or reused since.
char cached_name[NAMEDATALEN];
SubscriptionEntry* cached_entry = nullptr;
uint32 cached_version = 0;

// Copies the entry's name into `name` (NAMEDATALEN bytes) without the mutex; false while it
// changes. Returns the version it read in *version.
bool read_name(SubscriptionEntry& e, char* name, uint32* version) {
    uint32 before = pg_atomic_read_u32(&e.version);
    pg_read_barrier();
    memcpy(name, e.name, NAMEDATALEN);
    pg_read_barrier();
    *version = pg_atomic_read_u32(&e.version);
    name[NAMEDATALEN - 1] = '\0';
    return before == *version && before % 2 == 0;
}

// Renames entry `e` (with the mutex held; an empty name frees it). A reused entry starts from
// zero: its counters were the dropped subscription's.
void rename_entry(SubscriptionEntry& e, const char* name) {
    pg_atomic_fetch_add_u32(&e.version, 1);  // odd: readers without the mutex look again
    if (name[0] != '\0') {
        pg_atomic_uint64* counters[] = {&e.records,       &e.stored,          &e.duplicates,
                                        &e.transport_ids, &e.unparsable,      &e.conflicts,
                                        &e.processed,     &e.retried,         &e.dead,
                                        &e.ignored,       &e.duration.sum_us, &e.skipped,
                                        &e.redelivered,   &e.e2e.sum_us,      &e.group_uncommitted};
        for (pg_atomic_uint64* c : counters) pg_atomic_write_u64(c, 0);
        for (pg_atomic_uint64& c : e.duration.counts) pg_atomic_write_u64(&c, 0);
        for (pg_atomic_uint64& c : e.e2e.counts) pg_atomic_write_u64(&c, 0);
    }
    strlcpy(e.name, name, NAMEDATALEN);
    e.absent_sweeps = 0;
    pg_write_barrier();
    pg_atomic_fetch_add_u32(&e.version, 1);
}

// The entry of `name`, added on first use (in a free entry if there is one); the overflow entry
// when the table is full.
SubscriptionEntry* entry_of(const char* name) {
    Shared* shared = this_block();
    if (cached_entry != nullptr && strncmp(cached_name, name, NAMEDATALEN) == 0 &&
        pg_atomic_read_u32(&cached_entry->version) == cached_version)
        return cached_entry;
    SubscriptionEntry* found = nullptr;
    uint32 version = 0;
    char seen[NAMEDATALEN];
    uint32 n = pg_atomic_read_u32(&shared->n_used);
    pg_read_barrier();
    for (uint32 i = 0; i < n && found == nullptr; ++i)
        if (read_name(shared->entries[i], seen, &version) && strncmp(seen, name, NAMEDATALEN) == 0)
            found = &shared->entries[i];
    if (found == nullptr) {
        SpinLockAcquire(&shared->mutex);
        n = pg_atomic_read_u32(&shared->n_used);
        SubscriptionEntry* free_entry = nullptr;
        for (uint32 i = 0; i < n && found == nullptr; ++i) {
            SubscriptionEntry& e = shared->entries[i];
            if (strncmp(e.name, name, NAMEDATALEN) == 0)
                found = &e;
            else if (e.name[0] == '\0' && free_entry == nullptr)
                free_entry = &e;
        }
        if (found == nullptr && free_entry != nullptr) {
            found = free_entry;
            rename_entry(*found, name);
        } else if (found == nullptr && n < static_cast<uint32>(kMaxSubscriptions)) {
            found = &shared->entries[n];
            rename_entry(*found, name);
            pg_write_barrier();
            pg_atomic_write_u32(&shared->n_used, n + 1);
        }
        if (found != nullptr) version = pg_atomic_read_u32(&found->version);
        SpinLockRelease(&shared->mutex);
    }
    if (found == nullptr) {
        pg_atomic_fetch_add_u64(&shared->overflowed, 1);
        return &shared->entries[kMaxSubscriptions];  // not cached: counted each time
    }
    strlcpy(cached_name, name, NAMEDATALEN);
    cached_entry = found;
    cached_version = version;
    return found;
}

int compare_names(const void* a, const void* b) {
    return strcmp(*static_cast<char* const*>(a), *static_cast<char* const*>(b));
}

// The current handler pass's tally.
struct HandlerTally {
    uint64 processed, retried, dead, ignored;
    LocalHistogram duration;
};
HandlerTally tally;

}  // namespace

void LocalHistogram::clear() {
    memset(this, 0, sizeof *this);
}

void LocalHistogram::observe_us(int64 us) {
    if (us < 0) us = 0;
    double seconds = static_cast<double>(us) / 1e6;
    int i = 0;
    while (i < kBounds && seconds > kBoundsSeconds[i]) ++i;
    ++counts[i];
    sum_us += static_cast<uint64>(us);
}

bool LocalHistogram::empty() const {
    for (uint64 c : counts)
        if (c != 0) return false;
    return true;
}

void install_hooks() {
    prev_request_hook = shmem_request_hook;
    shmem_request_hook = request_hook;
    prev_startup_hook = shmem_startup_hook;
    shmem_startup_hook = startup_hook;
}

void relay_published(uint64 n, const LocalHistogram& latency) {
    Shared* shared = this_block();
    if (shared == nullptr) return;
    add(&shared->published, n);
    add_histogram(shared->latency, latency);
}

void relay_failures(uint64 n) {
    Shared* shared = this_block();
    if (shared != nullptr) add(&shared->delivery_failures, n);
}

void ingested(const char* subscription, uint64 records, uint64 duplicates, uint64 transport_ids,
              uint64 unparsable, uint64 skipped) {
    Shared* shared = this_block();
    if (shared == nullptr || records == 0) return;
    SubscriptionEntry* e = entry_of(subscription);
    add(&e->records, records);
    add(&e->stored, records - duplicates - skipped);
    add(&e->skipped, skipped);
    add(&e->duplicates, duplicates);
    add(&e->transport_ids, transport_ids);
    add(&e->unparsable, unparsable);
}

void ingest_redelivered(const char* subscription, uint64 n) {
    Shared* shared = this_block();
    if (shared == nullptr || n == 0) return;
    add(&entry_of(subscription)->redelivered, n);
}

void group_uncommitted(const char* subscription, int64 delta) {
    Shared* shared = this_block();
    if (shared == nullptr || delta == 0) return;
    pg_atomic_fetch_add_u64(&entry_of(subscription)->group_uncommitted, delta);
}

void ingest_conflicts(const char* subscription, uint64 n) {
    Shared* shared = this_block();
    if (shared == nullptr || n == 0) return;
    add(&entry_of(subscription)->conflicts, n);
}

void handler_processed(int64 duration_us) {
    ++tally.processed;
    tally.duration.observe_us(duration_us);
}

void handler_failed(int64 duration_us, bool dead) {
    ++(dead ? tally.dead : tally.retried);
    tally.duration.observe_us(duration_us);
}

void handler_ignored(uint64 n) {
    tally.ignored += n;
}
void handler_dead(uint64 n) {
    tally.dead += n;
}

void handler_flush(const char* subscription) {
    Shared* shared = this_block();
    if (shared != nullptr && (tally.processed | tally.retried | tally.dead | tally.ignored) != 0) {
        SubscriptionEntry* e = entry_of(subscription);
        add(&e->processed, tally.processed);
        add(&e->retried, tally.retried);
        add(&e->dead, tally.dead);
        add(&e->ignored, tally.ignored);
        add_histogram(e->duration, tally.duration);
    }
    handler_discard();
}

void handler_discard() {
    memset(&tally, 0, sizeof tally);
}

namespace {

// Outbox rows added by the current transaction, per subtransaction nesting level (levels past
// the last share it): a subtransaction's are handed to its parent when it commits and dropped
// when it aborts; the top level's are counted when it commits.
constexpr int kNestLevels = 64;
uint64 added_by_level[kNestLevels + 1];
bool added_callbacks = false;

int added_level() {
    return Min(GetCurrentTransactionNestLevel(), kNestLevels);
}

void on_added_xact(XactEvent event, void*) {
    Shared* shared = this_block();
    switch (event) {
        case XACT_EVENT_COMMIT:
        case XACT_EVENT_PARALLEL_COMMIT: {
            uint64 n = 0;
            for (uint64 c : added_by_level) n += c;
            if (shared != nullptr) add(&shared->outbox_added, n);
            break;
        }
        case XACT_EVENT_ABORT:
        case XACT_EVENT_PARALLEL_ABORT:
        case XACT_EVENT_PREPARE:  // counted by the next exact count, after COMMIT PREPARED
            break;
        default:
            return;
    }
    memset(added_by_level, 0, sizeof added_by_level);
}

void on_added_subxact(SubXactEvent event, SubTransactionId, SubTransactionId, void*) {
    int level = GetCurrentTransactionNestLevel();
    if (level > kNestLevels || level < 2) return;
    if (event == SUBXACT_EVENT_COMMIT_SUB) {
        added_by_level[level - 1] += added_by_level[level];
        added_by_level[level] = 0;
    } else if (event == SUBXACT_EVENT_ABORT_SUB) {
        added_by_level[level] = 0;
    }
}

}  // namespace

void outbox_added_at_commit(uint64 n) {
    Shared* shared = this_block();
    if (shared == nullptr || n == 0) return;
    if (!added_callbacks) {
        RegisterXactCallback(on_added_xact, nullptr);
        RegisterSubXactCallback(on_added_subxact, nullptr);
        added_callbacks = true;
    }
    added_by_level[added_level()] += n;
}

void e2e_observed(const char* subscription, const LocalHistogram& latency) {
    Shared* shared = this_block();
    if (shared == nullptr || latency.empty()) return;
    add_histogram(entry_of(subscription)->e2e, latency);
}

void outbox_settled(uint64 n) {
    Shared* shared = this_block();
    if (shared != nullptr) add(&shared->outbox_settled, n);
}

void worker_restarted(WorkerRole role, Oid database) {
    Shared* shared = OidIsValid(database) ? block_of(database) : this_block();
    if (shared != nullptr) add(&shared->restarts[static_cast<int>(role)], 1);
}

void purged(PurgedTable table, uint64 rows) {
    Shared* shared = this_block();
    if (shared != nullptr) add(&shared->purged[static_cast<int>(table)], rows);
}

namespace {

void copy_histogram(const AtomicHistogram& from, uint64* counts, uint64* sum_us) {
    for (int i = 0; i <= kBounds; ++i)
        counts[i] = pg_atomic_read_u64(const_cast<pg_atomic_uint64*>(&from.counts[i]));
    *sum_us = pg_atomic_read_u64(const_cast<pg_atomic_uint64*>(&from.sum_us));
}

uint64 read(const pg_atomic_uint64& c) {
    return pg_atomic_read_u64(const_cast<pg_atomic_uint64*>(&c));
}

}  // namespace

void sweep_subscriptions(char** names, int n_names) {
    Shared* shared = this_block();
    if (shared == nullptr) return;
    qsort(names, static_cast<size_t>(n_names), sizeof(char*), compare_names);
    SpinLockAcquire(&shared->mutex);
    uint32 n = pg_atomic_read_u32(&shared->n_used);
    for (uint32 i = 0; i < n; ++i) {
        SubscriptionEntry& e = shared->entries[i];
        if (e.name[0] == '\0') continue;
        const char* key = e.name;
        if (bsearch(&key, names, static_cast<size_t>(n_names), sizeof(char*), compare_names))
            e.absent_sweeps = 0;
        else if (++e.absent_sweeps >= 2)
            rename_entry(e, "");
    }
    SpinLockRelease(&shared->mutex);
}

void snapshot(Counters* out) {
    Shared* shared = this_block();
    memset(out, 0, sizeof *out);
    if (shared == nullptr) return;
    out->available = true;
    out->published = read(shared->published);
    out->delivery_failures = read(shared->delivery_failures);
    copy_histogram(shared->latency, out->latency_counts, &out->latency_sum_us);
    for (int i = 0; i < kWorkerRoles; ++i) out->restarts[i] = read(shared->restarts[i]);
    out->purged_inbox = read(shared->purged[0]);
    out->purged_outbox = read(shared->purged[1]);
    out->overflowed = read(shared->overflowed);
    out->outbox_added = read(shared->outbox_added);
    out->outbox_settled = read(shared->outbox_settled);
    uint32 n = pg_atomic_read_u32(&shared->n_used);
    pg_read_barrier();
    out->subscriptions =
        static_cast<SubscriptionCounters*>(palloc0(sizeof(SubscriptionCounters) * (n + 1)));
    int k = 0;
    for (uint32 i = 0; i <= n; ++i) {
        SubscriptionEntry& e = shared->entries[i < n ? i : static_cast<uint32>(kMaxSubscriptions)];
        SubscriptionCounters& c = out->subscriptions[k];
        c.overflow = i == n;
        if (c.overflow && out->overflowed == 0) continue;
        uint32 version;
        if (c.overflow)
            c.name[0] = '\0';
        else if (!read_name(e, c.name, &version) || c.name[0] == '\0')
            continue;  // free or changing
        c.records = read(e.records);
        c.stored = read(e.stored);
        c.duplicates = read(e.duplicates);
        c.transport_ids = read(e.transport_ids);
        c.unparsable = read(e.unparsable);
        c.conflicts = read(e.conflicts);
        c.redelivered = read(e.redelivered);
        c.group_uncommitted = read(e.group_uncommitted);
        c.skipped = read(e.skipped);
        c.processed = read(e.processed);
        c.retried = read(e.retried);
        c.dead = read(e.dead);
        c.ignored = read(e.ignored);
        copy_histogram(e.duration, c.duration_counts, &c.duration_sum_us);
        copy_histogram(e.e2e, c.e2e_counts, &c.e2e_sum_us);
        ++k;
    }
    out->n_subscriptions = k;
}

}  // namespace eventbox::metrics
