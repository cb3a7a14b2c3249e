// The relay background worker: reads committed outbox rows, hands them to the Kafka producer (or
// an HTTP destination) and, once the broker has acknowledged them, deletes them (or marks them
// sent) in one short transaction per batch. It sleeps on one WaitEventSet: its latch (set by
// send() at COMMIT), postmaster death, librdkafka's queue event fd and the HTTP client's.
// Without eventbox.brokers it delivers to HTTP destinations only (rows for Kafka wait), and
// idles when there are none.
//
// This file holds the worker's main and loop, its resets when settings change, and the pass;
// the reads, the writes and the C++ state have files of their own (outbox/relay_worker.hpp).
// PostgreSQL-side code: C++ objects live on the heap behind the facades and are reached only
// through them; no object with a destructor lives on these stack frames.
#include "outbox/relay_worker.hpp"

#include "outbox/relay_rotate.hpp"

extern "C" {
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
}

#include <chrono>

#include "pg/guc.hpp"
#include "pg/shmem.hpp"
#include "workers/common.hpp"

namespace eventbox::relay_worker {

namespace {

TimestampTz last_tick = 0;           // last held-too-long tick (eventbox.relay_sweep_interval)
char* config_fingerprint = nullptr;  // settings the current producer was built with
bool needs_reset = true;             // rebuild producer and dispatcher before the next pass
WaitEventSet* wait_set = nullptr;
int amqp_fd = -1;            // the AMQP connection's socket in wait_set (-1: none)
int64 passes = 0;            // numbers the passes in the CONTEXT line of their errors
int64 last_pass_ms = 0;      // when the last pass started (monotonic_ms())
bool last_pass_more = true;  // whether it left work waiting (then the next starts at once)

// Settings that require a new producer and dispatcher when they change.
char* current_fingerprint() {
    return MemoryContextStrdup(
        TopMemoryContext,
        psprintf("%s|%s|%d|%d|%d|%d|%d|%d|%d|%d|%s", guc::brokers, guc::amqp_url,
                 guc::max_message_bytes, guc::relay_max_in_flight, guc::relay_message_timeout_ms,
                 guc::relay_linger_ms, guc::relay_retry_backoff_ms, guc::relay_retry_backoff_max_ms,
                 guc::relay_max_attempts, guc::relay_batch_size, guc::schema_registry_url));
}

void rebuild_wait_set() {
    if (wait_set != nullptr) FreeWaitEventSet(wait_set);
    wait_set = CreateWaitEventSet(TopMemoryContext, 4);
    AddWaitEventToSet(wait_set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, nullptr);
    AddWaitEventToSet(wait_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, nullptr, nullptr);
    if (producer.active())
        AddWaitEventToSet(wait_set, WL_SOCKET_READABLE, producer.event_fd(), nullptr, nullptr);
    if (http_client.active())
        AddWaitEventToSet(wait_set, WL_SOCKET_READABLE, http_client.event_fd(), nullptr, nullptr);
    amqp_fd = amqp_publisher.active() ? amqp_publisher.fd() : -1;
    if (amqp_fd >= 0) AddWaitEventToSet(wait_set, WL_SOCKET_READABLE, amqp_fd, nullptr, nullptr);
}

void shutdown_relay(int, Datum) {
    destroy_state();
}

// Rows for Kafka read while it is not configured: they stay pending (held, so that they do not
// hold W, and read again after the next reset), said in the log at most once a minute.
worker::LogRate unrouted_rate{1, 60000};
std::size_t unrouted_since_line = 0;

void report_unrouted() {
    char* topic = nullptr;
    std::size_t n = dispatcher.take_unrouted(&topic);
    if (n == 0) return;
    unrouted_since_line += n;
    int held_back = 0;
    if (!worker::log_allowed(unrouted_rate, &held_back)) return;
    ereport(LOG, (errmsg("eventbox relay: messages for topic \"%s\" wait in the outbox: Kafka is "
                         "not configured",
                         topic),
                  errdetail("%zu message(s) for topics without an HTTP destination were read "
                            "since the last such line.",
                            unrouted_since_line),
                  errhint("Set eventbox.brokers and reload the configuration, or create an HTTP "
                          "destination for the topic.")));
    unrouted_since_line = 0;
}

// What the relay does after a reset: publish to Kafka (and deliver to HTTP destinations),
// deliver to HTTP destinations only (eventbox.brokers is empty), or nothing.
enum class Mode { kNone, kKafka, kHttpOnly, kIdle };
Mode announced = Mode::kNone;  // the last mode said in the log

// Says what the relay does now in eventbox.workers, and in the log when that changed (Kafka's
// brokers at every reset).
void announce(Mode mode) {
    bool changed = mode != announced;
    announced = mode;
    switch (mode) {
        case Mode::kKafka:
            ereport(LOG, (errmsg("eventbox relay publishing to %s", guc::brokers)));
            shmem::set_state("running");
            return;
        case Mode::kHttpOnly:
            if (changed) {
                ereport(LOG,
                        (errmsg("eventbox relay delivering to HTTP and AMQP destinations only: "
                                "eventbox.brokers is empty"),
                         errhint("Messages for topics without an HTTP destination wait in "
                                 "the outbox until eventbox.brokers is set.")));
                unrouted_rate = worker::LogRate{1, 60000};  // the first such row is said at once
            }
            shmem::set_state("HTTP only: no Kafka brokers");
            return;
        case Mode::kIdle:
        case Mode::kNone:
            if (changed)
                ereport(LOG, (errmsg("eventbox relay idle: eventbox.brokers is empty"),
                              errhint("Set eventbox.brokers and reload the configuration.")));
            shmem::set_state("idle: no brokers");
            return;
    }
}

// (Re)creates the producer and dispatcher for the current settings. Without eventbox.brokers
// there is no producer: the relay delivers to HTTP destinations only, or idles when there are
// none (and waits for one).
void reset() {
    destroy_state();
    if (config_fingerprint != nullptr) pfree(config_fingerprint);
    config_fingerprint = current_fingerprint();
    bool kafka = guc::brokers[0] != '\0';
    // HTTP destinations together may hold half of the relay's in-flight rows (each an equal
    // share): endpoints that hang leave the other half to Kafka. Without Kafka, all of them.
    int share = kafka ? Max(guc::relay_max_in_flight / 2, 1) : guc::relay_max_in_flight;
    http_client.load(static_cast<std::size_t>(share));
    // The AMQP publisher may hold every in-flight row: a broker that stops confirming fails its
    // rows after confirm_timeout and a blocked connection refuses rows (kBusy), so it cannot
    // hang on to them; below the dispatcher's limit, a busy publisher made its keys' later
    // rows wait a retry backoff each and go out one per pass (about 0.43x of the baseline).
    amqp_publisher.load(static_cast<std::size_t>(guc::relay_max_in_flight));
    dispatcher.load_formats();
    if (kafka) producer.create();
    if (kafka || http_client.active() || amqp_publisher.active()) {
        dispatcher.create(producer, http_client, amqp_publisher);
        rechecks.create();
    }
    announce(kafka                                             ? Mode::kKafka
             : http_client.active() || amqp_publisher.active() ? Mode::kHttpOnly
                                                               : Mode::kIdle);
    rebuild_wait_set();
}

// The pass itself (see iterate()).
bool run_pass() {
    // The outcomes this pass writes; rows offered below may add failures (refused by the
    // producer at once), which stay for the next pass.
    std::size_t acked = dispatcher.acked().size();
    std::size_t failed = dispatcher.failed().size();
    std::size_t held = dispatcher.to_hold().size();

    worker::begin_work(kWho);  // now() of this transaction
    prepare_read_plans();
    prepare_write_plans();
    write_outcomes();
    PopActiveSnapshot();

    // Once per eventbox.relay_sweep_interval: rows tracked since the last tick and still not
    // settled are held (written by the next pass), so that a stalled destination or a long
    // retry does not hold W (docs/design/outbox-rotation.md, "held too long"); and the HTTP
    // destinations are read again for changes no trigger announced.
    TimestampTz now = GetCurrentTimestamp();
    bool tick = TimestampDifferenceExceeds(last_tick, now, guc::relay_sweep_interval_s * 1000);
    if (tick) {
        last_tick = now;
        dispatcher.hold_stale();
    }
    // Which gaps are read for the last time must be decided before the snapshot is taken.
    int n_ranges = 0;
    relay::IdRange* ranges = rechecks.begin_pass(&n_ranges);

    http_client.before_snapshot();
    PushActiveSnapshot(GetTransactionSnapshot());
    // The rows this snapshot shows are routed only by destinations that show every change it
    // shows (outbox/relay_routes.hpp); the tick also looks for changes no trigger announced.
    if (!http_client.current(tick)) {
        worker::end_work();
        settle_outcomes(acked, failed, held);
        needs_reset = true;
        return true;
    }
    bool more = read_rows(ranges, n_ranges);
    // In the transaction that wrote the outcomes: W and what it settles commit together.
    store_position(now);
    report_unrouted();
    // The purge takes a snapshot of its own, after the reads.
    if (purge_outbox(now)) more = true;
    rotate_outbox(now);
    worker::end_work();
    pgstat_report_stat(false);  // lets autovacuum see outbox_held's deletes
    settle_outcomes(acked, failed, held);
    return !dispatcher.failed().empty() || more;
}

// One pass: write back outcomes, then read due, late and new rows and dispatch them, and purge
// what is past its retention. Returns true when more work is already waiting.
bool iterate() {
    worker::WorkContext context;
    context.who = kWho;
    context.batch = ++passes;
    worker::push_work_context(&context);
    bool more = run_pass();
    worker::pop_work_context(&context);
    return more;
}

// Serves the producer and the HTTP client, then runs a pass. Returns true when more work is
// already waiting; sets needs_reset when the producer must be recreated.
bool work() {
    if (producer.active()) {
        producer.poll();
        worker::emit_kafka_logs(producer.events(), kWho);
        if (producer.fatal()) {
            ereport(LOG, (errmsg("eventbox relay: recreating the Kafka producer after a fatal "
                                 "error")));
            needs_reset = true;
            return true;
        }
        dispatcher.take_deliveries(producer);
    }
    if (http_client.active()) dispatcher.take_http_outcomes(http_client);
    if (amqp_publisher.active()) dispatcher.take_amqp_outcomes(amqp_publisher);
    if (dispatcher.active()) dispatcher.serve_formats();
    bool more = iterate();
    // Publishing in the pass may have connected (or lost) RabbitMQ: wait on its socket.
    if (amqp_publisher.active()) {
        if (amqp_publisher.fd() != amqp_fd) rebuild_wait_set();
        dispatcher.take_amqp_outcomes(amqp_publisher);
        more = more || !dispatcher.failed().empty();
    }
    return more;
}

// How long to sleep: until the next retry or HTTP timeout is due, at most
// eventbox.relay_poll_interval; a quarter of a second while late commits are rechecked.
long wait_timeout(bool more) {
    if (more) return 0;
    long timeout = guc::relay_poll_interval_ms;
    if (!dispatcher.active()) return timeout;
    int64 due = dispatcher.next_due_ms();
    if (due != INT64_MAX) timeout = Min(timeout, Max(due - worker::now_ms(), 0L));
    if (!rechecks.empty()) timeout = Min(timeout, 250L);
    long position_due = position_due_ms();
    if (position_due >= 0) timeout = Min(timeout, position_due);
    // Schema fetches of the topic formats advance between waits.
    if (dispatcher.formats_busy()) timeout = Min(timeout, 5L);
    if (http_client.active()) {
        long http_due = http_client.timeout_ms(worker::now_ms());
        if (http_due >= 0) timeout = Min(timeout, http_due);
    }
    if (amqp_publisher.active()) {
        long amqp_due = amqp_publisher.timeout_ms(worker::now_ms());
        if (amqp_due >= 0) timeout = Min(timeout, amqp_due);
    }
    return timeout;
}

// Sleeps, then takes a reload: settings the producer was built with restart it.
void wait_and_reload(long timeout) {
    WaitEvent event;
    (void)WaitEventSetWait(wait_set, timeout, &event, 1, PG_WAIT_EXTENSION);
    ResetLatch(MyLatch);
    CHECK_FOR_INTERRUPTS();
    if (!worker::reload_if_requested()) return;
    char* fingerprint = current_fingerprint();
    if (strcmp(fingerprint, config_fingerprint) != 0) {
        ereport(LOG, (errmsg("eventbox relay: settings changed; restarting the producer")));
        needs_reset = true;
    }
    pfree(fingerprint);
}

void relay_start(MemoryContext) {
    before_shmem_exit(shutdown_relay, 0);
    init_write_state();
}

// An ERROR in a pass: start over from the outbox after the backoff.
void relay_after_error() {
    needs_reset = true;
}

// A clock that never goes back, in milliseconds.
int64 monotonic_ms() {
    using namespace std::chrono;
    return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
}

constexpr int64 kPaceSliceMs = 10;

// Passes start at least eventbox.relay_linger apart while wakes keep coming (commits of a few
// rows each, delivery reports): a pass costs 0.35-0.45 ms of CPU whatever it finds (its
// statements' executor setup over the rotated tables, the WAL flush before it publishes), and
// a pass per wake kept the relay at 35-40% of a core at 1,000 one-row commits a second
// (bench/NOTEBOOK.md, 2026-11-29). Rows committed meanwhile wait for the next pass, which is
// the relay's only batching wait: its producer lingers 1 ms (kProducerLingerMs), where it
// lingered relay_linger too before. The first wake after a quiet spell longer than that runs at
// once, and so does the pass after one that left work waiting: a full read, failures to retry,
// or a read the dispatcher had no room for (its room comes back when the deliveries the pass
// wrote are settled; waiting then idled the producer: a burst of 1 KiB rows went out at half
// the rate). The wait does not watch the latch (the committing backends then send no signal),
// only interrupts and the postmaster, in slices of at most kPaceSliceMs.
void pace_passes() {
    if (last_pass_more || guc::relay_linger_ms <= 0) return;
    int64 start = last_pass_ms + guc::relay_linger_ms;
    for (int64 left = start - monotonic_ms(); left > 0; left = start - monotonic_ms()) {
        (void)WaitLatch(MyLatch, WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, Min(left, kPaceSliceMs),
                        PG_WAIT_EXTENSION);
        CHECK_FOR_INTERRUPTS();
    }
}

void relay_turn(MemoryContext) {
    if (needs_reset) {
        reset();
        needs_reset = false;
        last_pass_more = true;
    }
    bool more = false;
    if (dispatcher.active()) {
        pace_passes();
        last_pass_ms = monotonic_ms();
        more = work();
        last_pass_more = more || read_lacked_room;
    } else if (http_client.changed()) {
        needs_reset = true;  // idle, and a destination may have been created
    }
    if (needs_reset) return;  // at once, without waiting
    wait_and_reload(wait_timeout(more));
}

}  // namespace

}  // namespace eventbox::relay_worker

extern "C" PGDLLEXPORT void eventbox_relay_main(Datum);

extern "C" void eventbox_relay_main(Datum arg) {
    using namespace eventbox;
    using namespace eventbox::relay_worker;
    worker::run_worker(arg, worker::WorkerMain{shmem::Role::kRelay, 0, true, "eventbox relay batch",
                                               relay_start, relay_after_error, relay_turn});
}
