// The handler background workers (eventbox.handler_workers of them): each runs a handler pass
// (handlers/runner.hpp) over every enabled subscription in turn, passing over the quiet ones
// (handlers/quiet.hpp), then sleeps on its latch, which the ingest worker sets after each
// committed batch, until a retry falls due or a poll interval passes.
extern "C" {
#include "postgres.h"

#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
}

#include <malloc.h>

#include <climits>
#include <cstring>

#include "handlers/quiet.hpp"
#include "handlers/runner.hpp"
#include "pg/boundary.hpp"
#include "pg/shmem.hpp"
#include "workers/common.hpp"

namespace eventbox::handlers {

namespace {

// Messages whose attempts one synchronous commit counts: the runs then commit (asynchronously)
// kMessagesPerTransaction at a time (a crash counts the attempts of one of those). A pass of
// 1,024 rather than 256 drained a backlog 3-19% faster (bench/NOTEBOOK.md, "what the handler
// workers wait for"): each claim's commit waits for the WAL the previous pass wrote.
constexpr int kMessagesPerPass = 16 * kMessagesPerTransaction;
constexpr long kIdleWaitMs = 1000;

// The worker's quiet subscriptions (QuietSubscriptions) as the PostgreSQL side uses them:
// skip() cannot allocate and is called directly; the rest holds the guard.
class Quiet {
  public:
    void make() {
        quiet_ = pg::call_cpp([] { return new QuietSubscriptions(); });
    }
    bool skip(const char* subscription, const QuietKey& key, int64 now_ms,
              int64* recheck_ms) const noexcept {
        return quiet_->skip(subscription, key, now_ms, recheck_ms);
    }
    void after_pass(const char* subscription, const QuietKey& key, int64 now_ms, bool found_work,
                    int64 due_ms) {
        pg::call_cpp([&] { quiet_->after_pass(subscription, key, now_ms, found_work, due_ms); });
    }

  private:
    QuietSubscriptions* quiet_ = nullptr;  // heap: made once, never freed
};

// What the worker keeps across its turns.
struct HandlerWorker {
    Quiet quiet;
    bool recovering = false;  // after an ERROR: the next turn reports "running" again
};
HandlerWorker self;

// The enabled subscriptions' names, read again only when the subscriptions' generation moved
// (any write to eventbox.subscriptions, handler changes) or kNamesMaxAgeMs passed (writes that
// fire no trigger). Read at every turn, they cost a worker with 5,000 subscriptions about 9 ms
// each time (bench/NOTEBOOK.md, "idle subscriptions by the thousand").
constexpr int64 kNamesMaxAgeMs = 10000;

struct EnabledNames {
    MemoryContext context = nullptr;  // holds names and their array
    char** names = nullptr;
    int count = 0;
    uint64 generation = 0;
    int64 read_ms = 0;
    bool valid = false;
};
EnabledNames enabled;

// The names, read in a transaction of their own into `enabled.context`.
void read_enabled_subscriptions() {
    if (enabled.context == nullptr)
        enabled.context = AllocSetContextCreate(TopMemoryContext, "eventbox handler subscriptions",
                                                ALLOCSET_SMALL_SIZES);
    enabled.valid = false;
    MemoryContextReset(enabled.context);
    // Read before the names: a change committed after this shows as a later generation.
    uint64 generation = shmem::subscriptions_generation();
    MemoryContext outer = CurrentMemoryContext;
    worker::begin_work("eventbox handler");
    int rc =
        SPI_execute("SELECT name FROM eventbox.subscriptions WHERE enabled ORDER BY name", true, 0);
    if (rc != SPI_OK_SELECT) elog(ERROR, "eventbox handler: reading subscriptions failed");
    int n = static_cast<int>(SPI_processed);
    MemoryContext keep = MemoryContextSwitchTo(enabled.context);
    char** names = static_cast<char**>(palloc(sizeof(char*) * Max(n, 1)));
    for (int i = 0; i < n; ++i) {
        bool isnull;
        Datum d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull);
        names[i] = TextDatumGetCString(d);
    }
    MemoryContextSwitchTo(keep);
    worker::end_work();
    MemoryContextSwitchTo(outer);
    enabled.names = names;
    enabled.count = n;
    enabled.generation = generation;
    enabled.read_ms = worker::now_ms();
    enabled.valid = true;
}

// Names of the enabled subscriptions (valid until the next call).
int enabled_subscriptions(char*** names) {
    if (!enabled.valid || enabled.generation != shmem::subscriptions_generation() ||
        worker::now_ms() - enabled.read_ms >= kNamesMaxAgeMs)
        read_enabled_subscriptions();
    *names = enabled.names;
    return enabled.count;
}

// What may have given a subscription work since (handlers/quiet.hpp), read before its pass.
QuietKey quiet_key(const char* subscription) {
    shmem::InboxGeneration g = shmem::inbox_generation();
    return QuietKey{shmem::inbox_stored_count(subscription), g.changes,
                    shmem::subscriptions_generation(), g.in_flight > 0};
}

// Runs a pass over the subscription unless it is quiet; lowers *next_due to when it is due
// again. Returns how many messages the pass handled.
int serve(const char* subscription, int64* next_due) {
    // A subscription whose last pass found nothing to do is passed over until something
    // may have given it work, or its recheck time comes.
    QuietKey key = quiet_key(subscription);
    int64 now = worker::now_ms();
    int64 due;
    if (self.quiet.skip(subscription, key, now, &due)) {
        *next_due = Min(*next_due, due);
        return 0;
    }
    int handled = run_pass(subscription, kMessagesPerPass, true, &due);
    bool found_work = last_pass_found_work();  // also true when it handled any
    self.quiet.after_pass(subscription, key, now, found_work, due);
    *next_due = Min(*next_due, due);
    pgstat_report_stat(false);
    CHECK_FOR_INTERRUPTS();
    return handled;
}

// Sleeps until the latch is set, the first retry falls due or the poll interval passed; not at
// all after a turn that handled messages.
void wait_for_work(int handled, int64 next_due) {
    long timeout = kIdleWaitMs;
    if (next_due != INT64_MAX) timeout = Min(timeout, Max(next_due - worker::now_ms(), 0L));
    if (handled > 0) timeout = 0;
    (void)WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, timeout,
                    PG_WAIT_EXTENSION);
    ResetLatch(MyLatch);
    CHECK_FOR_INTERRUPTS();
    worker::reload_if_requested();
}

// glibc maps every allocation above M_MMAP_THRESHOLD on its own and gives the top of its heap
// back once M_TRIM_THRESHOLD is free there; setting either stops both from adapting. A pass's
// memory (a batch handler's array of up to a pass's rows, the executor's) is freed at each
// transaction's end, so with the defaults every transaction faulted its pages in again: 6-8x
// the page faults and up to half a batch handler's CPU per message (bench/NOTEBOOK.md,
// 2026-11-28, "the handler workers' page faults"). The relay and the ingest worker keep the
// defaults: their allocations are librdkafka's, and fixed thresholds made the relay slower.
void keep_freed_memory() {
    mallopt(M_MMAP_THRESHOLD, 8 << 20);
    mallopt(M_TRIM_THRESHOLD, 32 << 20);
}

void start(MemoryContext) {
    keep_freed_memory();
    shmem::set_state("running");
    self.quiet.make();
}

// An ERROR outside a handler's subtransaction: the lanes are released before the backoff.
void after_error() {
    release_lane_locks();
    self.recovering = true;
}

void turn(MemoryContext) {
    if (self.recovering) {
        shmem::set_state("running");
        self.recovering = false;
    }
    char** names;
    int n = enabled_subscriptions(&names);
    int handled = 0;
    int64 next_due = INT64_MAX;
    for (int i = 0; i < n; ++i) handled += serve(names[i], &next_due);
    wait_for_work(handled, next_due);
}

}  // namespace

}  // namespace eventbox::handlers

extern "C" PGDLLEXPORT void eventbox_handler_main(Datum arg) {
    using namespace eventbox;
    int index;
    memcpy(&index, MyBgworkerEntry->bgw_extra, sizeof index);
    // Synchronous commits (async_commit false): the commit counting an attempt must survive a
    // handler that crashes the backend.
    worker::run_worker(
        arg, worker::WorkerMain{shmem::Role::kHandler, index, false, "eventbox handler pass",
                                handlers::start, handlers::after_error, handlers::turn});
}
