// The relay worker's parts and the state they share (PostgreSQL side, internal to the relay):
//  - relay_worker.cpp: the worker's main and loop, its resets when settings change, the pass;
//  - relay_read.cpp:   reading due, late and new outbox rows and offering them to the dispatcher;
//  - relay_write.cpp:  writing delivery outcomes back (ack rows, held rows, the settled
//                      position) and the purge of given-up held rows;
//  - relay_state.cpp:  the C++ objects, behind the PostgreSQL-side facades declared here.
//
// The facades are how PostgreSQL-side code reaches the relay's C++ objects: each owns its
// object on the heap (built by the relay's reset, destroyed by destroy_state(), never by a
// static destructor: the facades have none). Their methods that can throw or allocate run the
// object inside pg::call_cpp() (an exception becomes a PostgreSQL ERROR after the C++ scope has
// closed); the noexcept ones are plain reads, called without a guard.
#pragma once

extern "C" {
#include "postgres.h"

#include "executor/spi.h"
#include "utils/array.h"
#include "utils/timestamp.h"
}

#include <cstddef>
#include <vector>

#include "amqp/publisher.hpp"
#include "kafka/producer.hpp"
#include "outbox/http_client.hpp"
#include "outbox/outbox_insert.hpp"
#include "outbox/relay_dispatch.hpp"
#include "outbox/relay_formats.hpp"
#include "outbox/relay_recheck.hpp"
#include "outbox/relay_routes.hpp"

namespace eventbox::relay_worker {

// Names the relay in its errors and log lines.
inline constexpr const char* kWho = "eventbox relay";

using outbox::kTables;  // the rotated tables

// The Kafka producer (kafka::Producer).
class PgProducer {
  public:
    // Builds the producer for the current settings (eventbox.brokers, kafka_options, relay_*).
    void create();
    bool active() const noexcept { return producer_ != nullptr; }
    int event_fd() const noexcept { return producer_->event_fd(); }
    // Serves librdkafka's queued callbacks (delivery reports, logs, errors) on this thread.
    void poll();
    // Whether librdkafka raised a fatal error: the producer must be recreated.
    bool fatal() const;
    // What worker::emit_kafka_logs() reads (it guards its own calls).
    kafka::Producer& events() noexcept { return *producer_; }

  private:
    friend class PgDispatcher;
    friend void destroy_state();
    kafka::Producer* producer_ = nullptr;
};

// The HTTP destinations' client (http::Client); inactive when there are none. It knows which
// destinations it was built with, and when they must be read again (outbox/relay_routes.hpp).
class PgHttpClient {
  public:
    // Loads the destinations (a transaction of its own: call outside one); `queue_limit` is the
    // rows they may hold together.
    void load(std::size_t queue_limit);
    bool active() const noexcept { return client_ != nullptr; }
    // Whether a change moved the destinations' generation since they were loaded.
    bool changed() const;
    // Reads the destinations' stamp: call just before a pass takes its snapshot.
    void before_snapshot();
    // After the pass's snapshot, in its transaction: whether the loaded destinations are right
    // for every row the snapshot shows. Reads them in it when a change moved the generation,
    // one was committing when they were loaded, or `recheck` asks for it (once per
    // eventbox.relay_sweep_interval: changes no trigger announced). False: the relay must load
    // them again.
    bool current(bool recheck);
    int event_fd() const noexcept { return client_->event_fd(); }
    // Milliseconds until the client's next timeout (-1: none).
    long timeout_ms(int64 now) const noexcept { return client_->timeout_ms(now); }

  private:
    friend class PgDispatcher;
    friend void destroy_state();
    http::Client* client_ = nullptr;
    relay::RouteVersion version_;        // of the destinations client_ was built with
    relay::RouteStamp before_snapshot_;  // read by before_snapshot()
    char* fingerprint_ = nullptr;        // their text (http_relay::fingerprint()), TopMemoryContext
};

// The AMQP destinations' publisher (amqp::Publisher); inactive when there are none or
// eventbox.amqp_url is empty. Loaded with the HTTP destinations, after them (their fingerprint
// covers both: outbox/amqp_relay.hpp).
class PgAmqp {
  public:
    void load(std::size_t queue_limit);
    bool active() const noexcept { return publisher_ != nullptr; }
    // The connection's socket, -1 while not connected (it changes when it reconnects).
    int fd() const noexcept { return publisher_->fd(); }
    long timeout_ms(int64 now) const noexcept { return publisher_->timeout_ms(now); }

  private:
    friend class PgDispatcher;
    friend void destroy_state();
    amqp::Publisher* publisher_ = nullptr;
};

// The dispatcher (relay::Dispatcher), and the router in front of it when HTTP destinations exist.
class PgDispatcher {
  public:
    // Builds the dispatcher for the current settings, sending to `producer` and, when active,
    // to `http` by topic; rows for Kafka go nowhere while the producer is inactive (they stay
    // pending: relay::NoKafka).
    void create(PgProducer& producer, PgHttpClient& http, PgAmqp& amqp);
    bool active() const noexcept { return dispatcher_ != nullptr; }
    // Outcomes waiting to be written back, oldest first.
    const std::vector<relay::Acked>& acked() const noexcept { return dispatcher_->acked(); }
    const std::vector<relay::Failed>& failed() const noexcept { return dispatcher_->failed(); }
    // Rows to copy into eventbox.outbox_held (relay::Dispatcher::to_hold()).
    const std::vector<int64_t>& to_hold() const noexcept { return dispatcher_->to_hold(); }
    // The held-too-long rule's tick (relay::Dispatcher::hold_stale()).
    std::size_t hold_stale();
    // The subscription behind relay::Acked::cause_subscription.
    const char* subscription_name(uint32_t index) const noexcept {
        return dispatcher_->subscription_name(index).c_str();
    }
    // How many more rows a read may offer now.
    std::size_t capacity() const noexcept { return dispatcher_->capacity(); }
    // The lowest id not settled yet (relay::Dispatcher::lowest_unsettled()).
    int64 lowest_unsettled() const noexcept { return dispatcher_->lowest_unsettled(); }
    // Earliest time a waiting row becomes due (INT64_MAX when none).
    int64 next_due_ms() const noexcept { return dispatcher_->next_due_ms(); }
    // Hands a row just read to the dispatcher.
    void offer(const relay::Row& row, int64 now);
    // Feeds the producer's delivery reports, and the HTTP client's finished requests, to it.
    void take_deliveries(PgProducer& producer);
    void take_http_outcomes(PgHttpClient& http);
    void take_amqp_outcomes(PgAmqp& amqp);
    // The ids of waiting rows whose turn has come (at most `max`), palloc'd; *n gets their
    // count. After they were read and offered, refetch_done().
    int64* due_ids(int64 now, std::size_t max, int* n);
    void refetch_done();
    // Forgets the first outcomes and holds, written by a transaction that committed.
    void clear_outcomes(std::size_t n_acked, std::size_t n_failed, std::size_t n_hold);
    // Rows for Kafka read while it is not configured (relay::Dispatcher::unrouted()): their
    // count since the last call, and in `topic` (palloc'd) the topic of the first.
    std::size_t take_unrouted(char** topic);

    // Reads eventbox.topic_formats (a transaction of its own: call outside one) for the next
    // create() (relay_formats_pg.cpp).
    void load_formats();
    // Serves the registry's transfers of the topic formats, if any.
    void serve_formats();
    // Whether schema fetches are open (the relay then sleeps briefly).
    bool formats_busy() const noexcept { return formats_ != nullptr && formats_->busy(); }

  private:
    friend void destroy_state();
    // `kafka`, or the topic formats' sink in front of it when load_formats() found some.
    relay::Sink* with_formats(relay::Sink* kafka);
    relay::Dispatcher* dispatcher_ = nullptr;
    relay::FormatSink* formats_ = nullptr;  // before Kafka, when topics have registry formats
    http::Router* router_ = nullptr;
    amqp::Router* amqp_router_ = nullptr;
    relay::NoKafka* no_kafka_ = nullptr;  // Kafka's place while eventbox.brokers is empty
};

// The late-commit rechecks (relay::Rechecks), with the outbox writers and the ids of the claim
// scan they are computed from.
class PgRechecks {
  public:
    void create();
    bool empty() const noexcept { return rechecks_->empty(); }
    // The lowest id of the gaps kept (INT64_MAX when none).
    int64 lowest() const noexcept { return rechecks_->lowest(); }
    // Starts a pass (before its snapshot): the ranges to read, palloc'd; *n gets their count.
    relay::IdRange* begin_pass(int* n);
    // Ends the pass in which the first `fully_read` ranges were read whole.
    void end_pass(int fully_read);
    // Reads the outbox writers running now (after the pass's snapshot) from their slots;
    // add_writers() adds the prepared transactions' xids (relay_read.cpp).
    void read_writers();
    void add_writers(const uint32* xids, int n);
    // The claim scan: its ids in order, then the gaps it left above `cursor` recorded with the
    // writers read.
    void start_scan() noexcept { scan_ids_->clear(); }
    void scanned(int64 id);
    void end_scan(int64 cursor);

  private:
    friend void destroy_state();
    relay::Rechecks* rechecks_ = nullptr;
    std::vector<uint32_t>* writers_ = nullptr;
    std::vector<int64_t>* scan_ids_ = nullptr;
};

extern PgProducer producer;
extern PgHttpClient http_client;
extern PgAmqp amqp_publisher;
extern PgDispatcher dispatcher;
extern PgRechecks rechecks;

// Drops all in-memory state; every pending row is read again from the outbox.
void destroy_state();

// ---- Reading (relay_read.cpp) ----

// Executes a kept relay statement (worker::exec_kept()).
void exec(SPIPlanPtr plan, Datum* values, bool read_only, int expected);
// An int8[] of `n` values, palloc'd.
ArrayType* int8_array(const int64* values, int n);

// Highest id read by a claim scan (0 after a reset: every pending row is read again).
extern int64 cursor;
// Prepares the read statements once per process.
void prepare_read_plans();
// The reads of a pass, in its snapshot: rows due again, the ranges of late commits (`ranges`,
// from PgRechecks::begin_pass()), then new rows above the cursor when every range was read
// whole. Returns true when the claim filled its batch (more rows wait).
bool read_rows(const relay::IdRange* ranges, int n_ranges);
// Whether the last read_rows() stopped because the dispatcher had no room: rows may wait that
// the next pass, once deliveries are settled, can read.
extern bool read_lacked_room;

// ---- Writing (relay_write.cpp) ----

// Once, at start.
void init_write_state();
// Prepares the write statements once per process.
void prepare_write_plans();
// Writes the dispatcher's rows to hold, and its acknowledged and failed deliveries, back to the
// outbox.
void write_outcomes();
// After the transaction that wrote the first `acked` and `failed` outcomes and `held` holds
// committed: forgets them and counts them (worker slot, metrics).
void settle_outcomes(std::size_t acked, std::size_t failed, std::size_t held);
// Stores the settled position W (docs/design/outbox-rotation.md) when it moved: every row read
// below it is settled (acknowledged in an ack row, or held), and no gap kept reaches below it.
// At most every 100 ms (`now`): computing it walks every id in flight, and nothing needs it
// sooner (the rotation reads it once a second; ack rows, not W, say what a restarted relay must
// not send again).
void store_position(TimestampTz now);
constexpr long kPositionEveryMs = 100;
// Milliseconds until a W that store_position() did not compute is due (the relay's wait is no
// longer, so that an idle relay does not leave W behind for a whole poll interval); -1: none.
long position_due_ms();
// Deletes given-up held rows past eventbox.dead_retention (whatever W is), and cancelled ones
// below W, at most once a second (`now`) unless the last purge was full. Returns true when it
// was full (more rows to purge).
bool purge_outbox(TimestampTz now);

}  // namespace eventbox::relay_worker
