// The counters behind eventbox.metrics(): plain atomics in shared memory, written by the workers
// without locks (a batch adds its counts once; handler and relay latencies are gathered per pass
// in process-local histograms and added at its end). They live as long as the server: a worker
// that restarts keeps adding to the same counters.
//
// Per-subscription counters sit in a fixed table of kMaxSubscriptions entries keyed by name,
// filled on first use. The supervisor frees the entries of subscriptions it found missing from
// eventbox.subscriptions at two sweeps in a row (sweep_subscriptions()); a freed entry serves the
// next new subscription, from zero. When the table is full, the counts of further subscriptions
// go to one overflow entry, exported with subscription="" and counted by
// eventbox_metrics_subscriptions_overflowed.
#pragma once

extern "C" {
#include "postgres.h"
}

namespace eventbox::metrics {

inline constexpr int kMaxSubscriptions = 512;
// Histogram bucket bounds, in seconds (shared by publish latency and handler duration).
inline constexpr int kBounds = 14;
inline constexpr double kBoundsSeconds[kBounds] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                   0.1,    0.25,  0.5,    1,     2.5,  5,     10};

// Restart counters are kept for these roles.
enum class WorkerRole : int { kSupervisor = 0, kRelay = 1, kIngest = 2, kHandler = 3 };
inline constexpr int kWorkerRoles = 4;
inline constexpr const char* kWorkerRoleNames[kWorkerRoles] = {"supervisor", "relay", "ingest",
                                                               "handler"};
enum class PurgedTable : int { kInbox = 0, kOutbox = 1 };

// A histogram in process memory, added to shared memory at once.
struct LocalHistogram {
    uint64 counts[kBounds + 1];
    uint64 sum_us;
    void clear();
    void observe_us(int64 us);
    bool empty() const;
};

// Registers the shared memory request and startup hooks; called from _PG_init.
void install_hooks();

// Relay.
void relay_published(uint64 n, const LocalHistogram& latency);
void relay_failures(uint64 n);
// Ingest: one batch of `records` read for `subscription`, of which `duplicates` were in the inbox
// already, `transport_ids` identified by topic/partition/offset, `unparsable` not JSON, and
// `skipped` not stored (tombstones and resolved timestamps under the CDC message-id rules).
void ingested(const char* subscription, uint64 records, uint64 duplicates, uint64 transport_ids,
              uint64 unparsable, uint64 skipped);
// Ingest: duplicates of `subscription` whose payload differs from the stored row's.
void ingest_conflicts(const char* subscription, uint64 n);
// Ingest: membership 'group': `delta` added to the offsets `subscription` stored and its group
// did not acknowledge yet (eventbox_ingest_group_uncommitted).
void group_uncommitted(const char* subscription, int64 delta);
// Ingest: RabbitMQ deliveries of `subscription` flagged redelivered (committed in a batch).
void ingest_redelivered(const char* subscription, uint64 n);
// Handlers: a process-local tally of the current pass, added to `subscription` by
// handler_flush() (at the end of the pass).
void handler_processed(int64 duration_us);
void handler_failed(int64 duration_us, bool dead);
void handler_ignored(uint64 n);
void handler_dead(uint64 n);  // dead without a run (a crash used their last attempt)
void handler_flush(const char* subscription);
void handler_discard();
// Outbox rows that wait to be published: added by committed transactions (send() and dead
// letters count their rows; a rolled-back subtransaction's are dropped), settled (published,
// deleted or given up) by the relay's committed passes. The supervisor's pending gauge adds
// their difference to its last exact count (metrics/gauges.hpp).
void outbox_added_at_commit(uint64 n);
void outbox_settled(uint64 n);
// Relay: end-to-end latencies of acknowledged messages that a handler of `subscription` sent,
// from the handled inbox message's received_at (eventbox_e2e_seconds).
void e2e_observed(const char* subscription, const LocalHistogram& latency);
// Supervision and retention.
// A restart of a worker of `database` (default: the calling process's database).
void worker_restarted(WorkerRole role, Oid database = InvalidOid);
void purged(PurgedTable table, uint64 rows);

// The supervisor's sweep, with the names of every subscription (reordered here): entries of
// names missing at two sweeps in a row are freed. Two, because a subscription committed after
// the caller's snapshot may already count.
void sweep_subscriptions(char** names, int n_names);

// A copy of every counter of the calling process's database, for rendering (each database
// eventbox.database lists has counters of its own).
struct SubscriptionCounters {
    char name[NAMEDATALEN];
    bool overflow;
    uint64 records, stored, duplicates, transport_ids, unparsable, conflicts, skipped;
    uint64 redelivered;
    uint64 group_uncommitted;
    uint64 processed, retried, dead, ignored;
    uint64 duration_counts[kBounds + 1];
    uint64 duration_sum_us;
    uint64 e2e_counts[kBounds + 1];
    uint64 e2e_sum_us;
};
struct Counters {
    bool available;  // false without shared memory (library not preloaded)
    uint64 published, delivery_failures;
    uint64 latency_counts[kBounds + 1];
    uint64 latency_sum_us;
    uint64 restarts[kWorkerRoles];
    uint64 purged_inbox, purged_outbox;
    uint64 overflowed;
    uint64 outbox_added, outbox_settled;
    int n_subscriptions;
    SubscriptionCounters* subscriptions;  // palloc'd, n_subscriptions entries
};
// Inbox messages of a subscription that became pending (stored, not unparsable) minus those
// that stopped being pending (processed, dead, ignored) by the workers' committed batches: the
// change of its pending count since an earlier snapshot is the change of this value.
inline int64 inbox_pending_balance(const SubscriptionCounters& c) {
    return static_cast<int64>((c.stored - c.unparsable) - (c.processed + c.dead + c.ignored));
}
// Fills `out` (subscriptions palloc'd in the current memory context).
void snapshot(Counters* out);

}  // namespace eventbox::metrics
