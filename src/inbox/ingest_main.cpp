// The ingest worker's main and its loop: reload when due, poll, store each subscription's
// records, record the errors that changed, wait for more (see inbox/ingest.hpp).
#include "inbox/ingest.hpp"

extern "C" {
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "utils/memutils.h"
}

#include "kafka/group_member.hpp"
#include "pg/boundary.hpp"
#include "pg/shmem.hpp"

namespace eventbox::ingest {

int member = 0;
int members = 1;
uint64 loaded_generation = 0;
bool needs_reload = true;
std::size_t round_size = 1000;
MemoryContext batch_context = nullptr;
WaitEventSet* wait_set = nullptr;

bool IngestState::retry_due(int64 now) const {
    return pg::call_cpp([&] {
        if (subscriptions_ == nullptr || consumer_ == nullptr) return false;
        for (Subscription* s : *subscriptions_)
            if (s->failing && consumer_->paused(s->id) && now >= s->retry_at_ms) return true;
        return false;
    });
}

namespace {

TimestampTz last_batch_at = 0;  // end of the last batch with messages

void shutdown_ingest(int, Datum) {
    state.destroy();
    amqp_destroy();
}

void start(MemoryContext turn_context) {
    before_shmem_exit(shutdown_ingest, 0);
    batch_context = turn_context;
}

// An ERROR outside a subscription's batch (building the consumer, reading the subscriptions,
// recording errors): everything is rebuilt from the stored offsets (records in memory were not
// stored and are read again) after the backoff.
void after_error() {
    state.destroy();
    amqp_destroy();
    needs_reload = true;
}

// Reloads when something changed, or when failing subscriptions whose backoff is over are due to
// be read again from their stored offsets.
void reload_if_due() {
    bool retry_due = state.retry_due(worker::now_ms());
    if (needs_reload || retry_due || shmem::subscriptions_generation() != loaded_generation) {
        needs_reload = false;
        reload();
    }
}

// PostgreSQL holds table statistics back while flushes would come less than a second apart (by
// the last commit's time, which stands still while the worker is idle): after a second without
// batches they are flushed, so autovacuum sees the last ones too.
void flush_stats(bool worked) {
    if (worked)
        last_batch_at = GetCurrentTimestamp();
    else if (TimestampDifferenceExceeds(last_batch_at, GetCurrentTimestamp(), 1000))
        pgstat_report_stat(true);
}

// Sleeps until the latch, the consumer's queue or a second; not at all when `more` waits, and
// briefly while schemas are being fetched (their transfers are served between the waits).
void wait_for_more(bool more) {
    WaitEvent event;
    long registry_ms = state.registry_wait_ms();
    long timeout = more ? 0 : registry_ms >= 0 ? registry_ms : 1000;
    (void)WaitEventSetWait(wait_set, timeout, &event, 1, PG_WAIT_EXTENSION);
    ResetLatch(MyLatch);
    CHECK_FOR_INTERRUPTS();
    if (worker::reload_if_requested()) needs_reload = true;
}

// A group member destroyed before its first assignment was closed and left open instead
// (kafka/group_member.hpp: librdkafka 2.0.2 would abort the process): the worker exits, which
// takes it away, and the launcher starts it again.
void exit_if_members_left_open() {
    if (kafka::GroupMember::abandoned() == 0) return;
    ereport(LOG, (errmsg("eventbox ingest: restarting to let go of a Kafka consumer group member "
                         "that had no assignment yet"),
                  errdetail("librdkafka 2.0.2 aborts the process when such a member is "
                            "destroyed (confluentinc/librdkafka#4312); it was closed and left "
                            "open instead.")));
    proc_exit(1);
}

void turn(MemoryContext) {
    exit_if_members_left_open();
    reload_if_due();
    std::size_t n = state.poll(round_size);
    state.emit_logs();
    bool worked = store_all();
    state.release();
    // Waiting subscriptions whose schemas arrived are read again at once.
    bool schemas_ready = registry_turn();
    if (schemas_ready) needs_reload = true;
    if (state.ready()) record_errors();
    MemoryContextSwitchTo(TopMemoryContext);
    MemoryContextReset(batch_context);
    // RabbitMQ subscriptions: their deliveries stored, then acknowledged.
    bool more_amqp = amqp_turn();
    MemoryContextSwitchTo(TopMemoryContext);
    MemoryContextReset(batch_context);
    if (amqp_fd() != wait_set_amqp_fd) rebuild_wait_set();
    flush_stats(worked);
    wait_for_more(n >= round_size || more_amqp || schemas_ready);
}

}  // namespace

}  // namespace eventbox::ingest

extern "C" PGDLLEXPORT void eventbox_ingest_main(Datum);

extern "C" void eventbox_ingest_main(Datum arg) {
    using namespace eventbox;
    memcpy(&ingest::member, MyBgworkerEntry->bgw_extra, sizeof ingest::member);
    worker::WorkerMain main{};
    main.role = shmem::Role::kIngest;
    main.index = ingest::member;
    // Safe asynchronously: a lost commit loses inbox rows and their offsets together, and they
    // are read from Kafka again.
    main.async_commit = true;
    main.context_name = "eventbox ingest batch";
    main.start = ingest::start;
    main.after_error = ingest::after_error;
    main.turn = ingest::turn;
    worker::run_worker(arg, main);
}
