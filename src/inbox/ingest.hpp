// The ingest worker's internal header: what its loop (ingest_main.cpp), reload
// (ingest_reload.cpp), store (ingest_store.cpp, the rows in ingest_columns.cpp) and error
// bookkeeping (ingest_errors.cpp) share, and the facade of its C++ state (ingest_state.cpp).
//
// An ingest background worker (eventbox.ingest_workers of them, each consuming its share of
// every subscription's partitions) has one librdkafka consumer for all of its subscriptions (see
// kafka/consumer.hpp), so its threads, sockets and fds do not grow with them. Each poll's
// records are handed to the subscriptions that want them, and each subscription's share is
// written in one transaction per batch (inbox rows deduplicated with ON CONFLICT DO NOTHING, plus
// the partitions' next offsets; a batch with duplicates also compares them with the stored rows
// and lists those with another payload in eventbox.conflicts), then the handler workers are
// woken. After a batch without duplicates, the next one is first inserted without ON CONFLICT
// (see insert_new() in ingest_store.cpp). It sleeps on one WaitEventSet: its latch (set when
// subscriptions change), postmaster death, and the consumer's queue fd.
//
// A subscription whose batch cannot be stored (any ERROR) is rolled back alone, paused and retried
// with a backoff from its stored offsets; one that cannot read (an unknown or refused topic, an
// unresolvable start) is retried by the consumer. Either shows in eventbox.subscription_errors
// (the table eventbox.ingest_errors, written only when a subscription starts or stops failing)
// and in the log at a bounded rate; the other subscriptions go on. See docs/design/ingest.md.
//
// PostgreSQL side. The C++ objects (the consumer, the subscriptions) live on the heap behind
// IngestState, whose methods hold the guard (call_cpp()) or are noexcept: the steps call them
// directly, and no object with a destructor lives on their stack frames (CONTRIBUTING.md, "The
// boundary").
#pragma once

extern "C" {
#include "postgres.h"

#include "executor/spi.h"
#include "storage/latch.h"
#include "utils/timestamp.h"
}

#include <librdkafka/rdkafka.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "inbox/recent_ids.hpp"
#include "inbox/record.hpp"
#include "kafka/consumer.hpp"
#include "pg/arrays.hpp"
#include "workers/common.hpp"

namespace eventbox::handlers {
class StoredOffsets;
}
namespace eventbox::registry {
class Registry;
}

namespace eventbox::ingest {

// Names the worker in its errors and kept statements.
inline constexpr const char* kWho = "eventbox ingest";

// One enabled subscription; its records come from the worker's consumer.
struct Subscription {
    std::string name;
    std::string fingerprint;  // settings it was added to the consumer with
    int id = 0;               // in the consumer
    inbox::Options options;
    std::size_t batch_size = 1000;
    bool backfill = false;                // created with backfill => true: rows get a mode
    std::vector<inbox::Classified> rows;  // the current batch, classified
    std::vector<int> order;               // its rows by message id (see IngestState::classify())
    std::size_t skipped = 0;              // records of the batch that get no row
    bool fresh = true;  // paused in the consumer until reload() gives it its stored offsets
    // The last batch had no duplicates but those foreseen (repeats of a record of the batch, ids
    // in `recent`): the next one is tried without ON CONFLICT (insert_new()).
    bool expect_new = true;
    inbox::RecentIds recent;  // the ids its lanes stored last (ingest_store.cpp)
    // A batch that could not be stored: paused until retry_at_ms, then read again from the
    // stored offsets; failing until a batch is stored (or it stays quiet a while after resuming).
    bool failing = false;
    int attempts = 0;
    int backoff_ms = 0;
    int64_t retry_at_ms = 0;
    int64_t resumed_at_ms = 0;
    // value_format 'registry': a record waits for schema id `waiting_for` (the records before it
    // were stored; it and the rest are read again from the stored offsets once the schema is
    // cached, see docs/design/ingest.md). Paused meanwhile.
    bool waiting = false;
    bool schema_ready = false;  // the schema arrived: read again at the next reload
    uint32_t waiting_for = 0;
    bool registry_format = false;  // value_format 'registry'
    bool registry_keys = false;    // key_format 'registry'
    std::string registry_failure;  // why its schema could not be fetched (registry_turn())
    std::string error;             // why its last batch failed
    std::string recorded;          // its error as in eventbox.ingest_errors ("" = no row)
    // Failing because schema `waiting_for` could not be fetched: while its backoff runs, the
    // schema is asked again every kProbeMs (registry_step()), and the subscription is read again
    // as soon as it is cached rather than when the backoff ends.
    bool probing = false;
    int64_t probe_at_ms = 0;
    int recorded_attempts = 0;
    bool group = false;  // membership 'group'
    // Its group's uncommitted offsets as last added to eventbox_ingest_group_uncommitted.
    int64_t reported_uncommitted = 0;

    // Well again: no longer failing.
    void recovered() noexcept {
        failing = false;
        attempts = 0;
        backoff_ms = 0;
        probing = false;
        error.clear();
    }
};

// What the subscriptions table says, read before (re)building consumers.
struct Wanted {
    std::string name, fingerprint, group_id, message_id_field;
    std::vector<std::string> topics;
    bool start_latest;
    inbox::IdRule id_rule;  // message_id_rule
    bool keep_raw;          // inbox::keeps_raw() of its options
    bool backfill;          // backfill => true
    bool registry_format;   // value_format 'registry'
    bool registry_keys;     // key_format 'registry'
    bool group;             // membership 'group'
    int64_t created_ms;     // Unix epoch ms: where start_from 'latest' starts
    int batch_size;
};

// One row of the subscriptions table as read (palloc'd strings), for IngestState::add_wanted().
struct WantedRow {
    const char* name;
    const char* topics;    // comma-separated
    const char* group_id;  // "" = the default
    const char* start_from;
    const char* message_id_field;
    const char* database;
    int batch_size;
    int64 created_ms;
    const char* message_id_rule;
    bool keep_raw;           // the option keep_raw
    bool dead_letter_topic;  // it has one
    bool backfill;
    bool registry_format;
    bool registry_keys;
    bool group;  // membership 'group'
};

// The worker's C++ state as its PostgreSQL-side steps use it: a facade whose methods run their
// C++ through call_cpp() (an exception becomes an ERROR after the C++ scope closed), or are
// noexcept. Methods are defined beside the step that uses them (the file named with each group).
class IngestState {
  public:
    // ---- lifetime and the consumer (ingest_state.cpp)
    // Whether the consumer and the subscription list exist (a reload built them).
    bool ready() const noexcept { return consumer_ != nullptr && subscriptions_ != nullptr; }
    bool has_consumer() const noexcept { return consumer_ != nullptr; }
    int event_fd() const noexcept { return consumer_->event_fd(); }
    // Deletes the subscriptions and the consumer (from before_shmem_exit, or after an ERROR).
    void destroy() noexcept;
    // destroy(), then an empty subscription list.
    void start_over();
    // Reads up to `max` records (0 without a consumer); they stay valid until release().
    std::size_t poll(std::size_t max);
    // Emits the logs librdkafka queued (worker::emit_kafka_logs()), if there is a consumer.
    void emit_logs();
    void release() noexcept {
        if (consumer_ != nullptr) consumer_->release();
    }

    // ---- the subscriptions (ingest_state.cpp)
    std::size_t count() const noexcept { return subscriptions_ ? subscriptions_->size() : 0; }
    Subscription* at(std::size_t k) const noexcept { return (*subscriptions_)[k]; }
    bool paused(const Subscription* sub) const;
    // The largest batch size: records read per poll.
    std::size_t largest_batch_size() const noexcept;

    // ---- the loop (ingest_main.cpp)
    // Whether a failing subscription's backoff is over (it is then read again).
    bool retry_due(int64 now) const;

    // ---- reload (ingest_reload.cpp)
    // The subscription and wanted lists exist.
    void make_lists();
    // Builds the consumer for eventbox.brokers and this worker's share of the partitions; one
    // built for other brokers or another share is dropped first, with its subscriptions.
    void build_consumer(int member, int members);
    void clear_wanted() noexcept { wanted_->clear(); }
    void add_wanted(const WantedRow& row);
    // Subscriptions gone or changed leave the consumer; settings read per record follow the
    // reload; failing ones whose retry is due become fresh.
    void drop_unwanted(int64 now);
    // Adds the wanted subscriptions that do not run yet (paused, fresh); returns how many are
    // wanted.
    std::size_t start_wanted();
    // A row of eventbox.offsets: a fresh subscription's position, or a running one's that was
    // moved (collected for seek_moved()). Between begin_offsets() and end_offsets().
    void begin_offsets();
    void stored_offset(const char* subscription, const char* topic, int32 partition, int64 next,
                       int64 backfill_until);
    // Moves the k-th moved subscription to its stored offsets and returns it; nullptr past them.
    Subscription* seek_moved(std::size_t k);
    void end_offsets() noexcept;
    // Resumes a fresh subscription from its stored offsets; returns whether it was failing.
    bool resume(Subscription* sub, int64 now);
    // Subscriptions with a row in eventbox.ingest_errors.
    int count_recorded() const noexcept;

    // ---- storing (ingest_store.cpp; classify() and backfill_until() in ingest_columns.cpp)
    std::size_t batch_size(const Subscription* sub) const noexcept {
        return consumer_->batch(sub->id).size();
    }
    bool has_positions_to_store(const Subscription* sub) const;
    // Classifies records [from, to) of `sub`'s batch into sub->rows and orders them by message
    // id; returns how many can be stored now (those before the first record whose schema is not
    // cached, registry/registry.hpp).
    std::size_t classify(Subscription* sub, std::size_t from, std::size_t to);
    rd_kafka_message_t* const* records(const Subscription* sub, std::size_t from) const noexcept {
        return consumer_->batch(sub->id).data() + from;
    }
    int64 backfill_until(const Subscription* sub, const rd_kafka_message_t* msg) const;
    // Whether the batch's records (in the consumer's order: by partition, offsets rising) store
    // some lane's rows at offsets not above what this process stored there before. With
    // `record`, records the batch's offsets (StoredOffsets::store()); without, only tells.
    bool stores_below(const Subscription* sub, rd_kafka_message_t* const* messages, int n,
                      bool record);
    const std::vector<kafka::PartitionEnd>& partition_ends(const Subscription* sub,
                                                           std::size_t from, std::size_t to);
    void committed(const Subscription* sub);
    // Brings eventbox_ingest_group_uncommitted in line with the group members' uncommitted
    // offsets (after a poll and after a commit); noexcept: the metric is shared memory.
    void report_group_uncommitted() noexcept;

    // ---- the schema registry (ingest_registry.cpp)
    // Builds, keeps or drops the registry client for eventbox.schema_registry_url and _options
    // (when some subscription has value_format 'registry'), and hands it to them.
    void configure_registry();
    // A subscription stopped at a record waiting for its schema: paused until it is cached.
    void wait_for_schema(Subscription* sub);
    // Drives the registry's transfers; waiting subscriptions whose schema arrived get
    // schema_ready (returns whether any did); those whose fetch failed get the reason in
    // registry_failure, for registry_turn() to fail them. Probing subscriptions (failed so) ask
    // for their schema again, bounded by kProbeMs; once it is cached their retry is due now.
    bool registry_step();
    // How long the loop may wait while the registry has transfers open (briefly; a little
    // longer when they are all probes, registry_step()); -1 when none are.
    long registry_wait_ms() const noexcept;

    // ---- error bookkeeping (ingest_errors.cpp)
    // Pauses `sub` after a failed batch and sets its backoff; returns it (ms).
    int fail(Subscription* sub, const char* message);
    // What eventbox.ingest_errors should say about `sub` ("" = nothing).
    const std::string& wanted_error(const Subscription* sub) const noexcept;
    // Whether eventbox.ingest_errors says something else (another error, or another attempt).
    bool error_changed(const Subscription* sub) const noexcept;
    bool errors_due() const noexcept;
    // eventbox.ingest_errors now says what wanted_error() says.
    void recorded(Subscription* sub);

  private:
    struct Offsets;  // begin_offsets() .. end_offsets()

    kafka::Consumer* consumer_ = nullptr;
    std::string consumer_fingerprint_;  // brokers and worker count it was built for
    std::vector<Subscription*>* subscriptions_ = nullptr;
    std::vector<Wanted>* wanted_ = nullptr;
    // What this process stored, lane by lane: a batch storing below it (replay(), a seek, the
    // first batch after a start) drops the handler workers' low-water marks at its commit.
    handlers::StoredOffsets* stored_offsets_ = nullptr;
    Offsets* offsets_ = nullptr;
    registry::Registry* registry_ = nullptr;
    std::string registry_fingerprint_;  // the settings it was built with
};

extern IngestState state;

// A batch's rows as the insert's array parameters, in message id order (sub->order); palloc'd
// (ingest_columns.cpp).
struct Columns {
    explicit Columns(int n);
    int count;        // rows
    int records = 0;  // records of the batch: the rows and those skipped (sub->skipped)
    pg::ArrayColumn ids, topics, partitions, offsets, keys, key_payloads, headers, payloads, raws,
        types, statuses, notes, modes, raw_headers;
    pg::ArrayColumn unparsable_ids;  // for the dead-letter topic
    int transport_ids = 0;
    int unparsable_rows = 0;
};

// The batch's first n classified rows in the order they are inserted: by message id (ingest
// workers inserting the same ids at once then wait for each other in one order, never in a
// cycle), without those the rule skips (tombstones, resolved timestamps: only their offsets are
// stored), counted in sub->skipped. C++ side: call it inside call_cpp() (ingest_columns.cpp).
void order_rows(Subscription* sub, std::size_t n);

// One record's bytes and place, as the columns take them: a Kafka record's, or a RabbitMQ
// delivery's (topic = the queue, partition 0, key = the routing key).
struct RecordBytes {
    const char* topic = nullptr;
    std::size_t topic_len = 0;
    int32 partition = 0;
    int64 offset = 0;
    const char* key = nullptr;  // nullptr: no key
    std::size_t key_len = 0;
    const char* value = nullptr;
    std::size_t value_len = 0;
    bool backfill = false;                // the row's mode when the subscription has backfill
    rd_kafka_message_t* kafka = nullptr;  // the Kafka record (headers kept exactly); nullptr: AMQP
};

// Fills Columns row by row (ingest_columns.cpp). Values most rows share are made once (the
// arrays copy them). Holds only pointers and Datums: it may live on a frame an ERROR crosses.
class ColumnBuilder {
  public:
    ColumnBuilder(const Subscription* sub, Columns* columns);
    // Row i of the columns: `r`, classified as `row`.
    void add(int i, const RecordBytes& r, inbox::Classified& row);

  private:
    Datum topic(const RecordBytes& r);
    Datum event_type(const std::string& type);
    void raw_headers(int i, const RecordBytes& r);
    void key_payload(int i, const RecordBytes& r, inbox::Classified& row);
    void payload(int i, const RecordBytes& r, inbox::Classified& row);

    const Subscription* sub_;
    Columns* c_;
    Datum received_, unparsable_, live_, backfill_;
    const char* topic_of_ = nullptr;
    std::size_t topic_len_ = 0;
    Datum topic_ = 0;
    const std::string* type_of_ = nullptr;
    Datum type_ = 0;
};

// Converts the batch's classified rows into `columns`. `context` names the lane of each record
// while it is converted, then the batch's lane if it has only one (ingest_columns.cpp).
void build_columns(Subscription* sub, rd_kafka_message_t* const* messages, Columns* columns,
                   worker::WorkContext* context);

// What storing a batch's rows did.
struct Inserted {
    uint64 rows = 0;       // inserted
    uint64 conflicts = 0;  // conflicting duplicates listed
};

// A text column of an SPI result as a palloc'd C string ("" for NULL).
char* text_at(HeapTuple tuple, TupleDesc desc, int column);

// Whether a batch stores some lane's rows at offsets not above what this process stored there
// before (asked only when the batch is expected to hold only new messages). A plain function
// and its argument: no object with a destructor on the stack of a step that may raise an ERROR.
struct Below {
    bool (*ask)(const void* arg);
    const void* arg;
    bool operator()() const { return ask(arg); }
};

// Stores a batch's rows (in the current transaction): without ON CONFLICT when the last batch
// had no duplicates and `below` says no, else with it; the unparsable ones go to the
// dead-letter topic, if any, and conflicting duplicates to eventbox.conflicts
// (ingest_store.cpp).
Inserted store_rows(Subscription* sub, const Columns& c, const Below& below);
// After store_rows() stored a batch below what this process stored before: the lanes'
// positions go down to it (ingest_store.cpp).
void stored_below(Subscription* sub, const Columns& c);
// After the commit of a batch stored by store_rows(): its ids become recent (ingest_store.cpp).
void rows_committed(Subscription* sub);
// Stores the lanes' next offsets, compare-and-set from each one's `previous`; returns whether
// one was moved under us (eventbox.replay) (ingest_store.cpp).
bool store_lane_offsets(const Subscription* sub, const std::vector<kafka::PartitionEnd>& ends);

// The worker's plain state (ingest_main.cpp).
extern int member;                // this worker's index among the ingest workers
extern int members;               // eventbox.ingest_workers, as of the last reload
extern uint64 loaded_generation;  // shmem::subscriptions_generation() of the last reload
extern bool needs_reload;
extern std::size_t round_size;  // records read per poll: the largest batch size
extern MemoryContext batch_context;
extern WaitEventSet* wait_set;

// worker::prepare_kept() for the ingest worker.
inline SPIPlanPtr prepare(const char* sql, int nargs, Oid* types) {
    return worker::prepare_kept(kWho, sql, nargs, types);
}

// Brings the consumer and its subscriptions in line with the subscriptions table
// (ingest_reload.cpp).
void reload();
// The wait set: the latch, postmaster death, the Kafka consumer's queue fd and the RabbitMQ
// socket (wait_set_amqp_fd, -1: none) (ingest_reload.cpp).
void rebuild_wait_set();
extern int wait_set_amqp_fd;

// ---- RabbitMQ subscriptions (source 'amqp'; ingest_amqp.cpp)
// Reads this worker's AMQP subscriptions and their stored offsets (in a transaction) and brings
// its RabbitMQ consumer in line; returns how many it consumes.
std::size_t amqp_reload(int64 now);
// Reads what RabbitMQ delivered and stores each subscription's deliveries in one transaction,
// acknowledging them after its commit; returns whether more deliveries wait.
bool amqp_turn();
// The consumer's socket (-1: none) and whether frames wait in its buffer already.
int amqp_fd();
bool amqp_buffered();
// Deletes the consumer (before_shmem_exit, after an ERROR outside a batch).
void amqp_destroy() noexcept;
// The AMQP subscriptions with a row in eventbox.ingest_errors: their names (valid until the
// next amqp_reload()) into names[0 .. returned), at most `max`.
int amqp_recorded(const char** names, int max);
int amqp_count_recorded() noexcept;

// Stores each subscription's records of the last poll, a failing one rolled back alone; returns
// whether any records were stored (ingest_store.cpp).
bool store_all();

// A batch of `sub` failed with `message`: it is paused (the others go on) and read again from
// its stored offsets after a backoff (ingest_errors.cpp).
void subscription_failed(Subscription* sub, const char* message);
// Drives the schema registry's transfers and fails the subscriptions whose schema could not be
// fetched; returns whether some waiting subscription can be read again (ingest_registry.cpp).
bool registry_turn();
// Writes the subscriptions' errors that changed to eventbox.ingest_errors (ingest_errors.cpp).
void record_errors();
// Sets this worker's row of `subscription` in eventbox.ingest_errors to `error` ("": deletes
// it); retry_at_ms < 0: no next_retry_at. In the current transaction (ingest_errors.cpp).
void write_error_row(const char* subscription, const char* error, int attempts, int64 retry_at_ms);
// Logs a line about one subscription (at most 5 a minute): fmt takes `name`, then `what`.
void log_subscription(const char* fmt, const char* name, const char* what);

}  // namespace eventbox::ingest
