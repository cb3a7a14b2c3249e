// The relay's in-memory dispatcher: decides which outbox rows go to Kafka now, which wait, and
// what must be written back after delivery reports. It keeps per-key order (also across retries),
// bounds in-flight work and schedules retries with backoff and jitter. Pure C++: it talks to
// Kafka through the Sink interface and to PostgreSQL not at all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace eventbox::relay {

struct Header {
    std::string_view name;
    std::string_view value;
};

// One outbox row as read by the relay; views into memory owned by the caller for the call.
struct Row {
    int64_t id = 0;
    std::string_view message_id;  // canonical uuid text
    std::string_view topic;
    const char* key = nullptr;  // nullptr: no key (no ordering lane)
    std::size_t key_len = 0;
    const char* payload = nullptr;  // nullptr: tombstone (null value)
    std::size_t payload_len = 0;
    const Header* headers = nullptr;
    std::size_t n_headers = 0;
    int32_t attempts = 0;       // delivery attempts recorded so far
    int64_t not_before_ms = 0;  // next_attempt_at in epoch ms; 0 when due now
    int64_t created_ms = 0;     // created_at in epoch ms (for the publish latency metric)
    // The rotated table (eventbox.outbox_rows_N) it was read from, whose ack rows settle it;
    // -1: read from eventbox.outbox_held (its rotated copy, if any is left, is looked up).
    int16_t table = -1;
    // Read from eventbox.outbox_held: its copy in the rotated tables is settled as far as the
    // settled position goes (docs/design/outbox-rotation.md), whatever happens to it here.
    bool held = false;
    // Sent by a handler (send() in a live run): its subscription and the handled inbox row's
    // received_at in epoch ms (for the end-to-end latency metric); empty and 0 otherwise.
    std::string_view cause_subscription;
    int64_t cause_received_ms = 0;
};

// What handing a row to Kafka's client came to.
enum class Produced {
    kQueued,             // on its way; a delivery report follows
    kBusy,               // the local queue is full: try again later, no attempt counted
    kFailed,             // refused: a failed delivery attempt that may succeed later
    kFailedPermanently,  // refused, and retrying cannot help (e.g. too large)
    kUnrouted,           // no sink takes it now: it stays pending, no attempt counted
};

// Where rows go. produce() must copy what it needs and fills `error` unless kQueued.
class Sink {
  public:
    virtual ~Sink() = default;
    virtual Produced produce(const Row& row, std::string& error) = 0;
};

// Where rows for Kafka go while Kafka is not configured (eventbox.brokers empty): nowhere. The
// dispatcher forgets them; they wait in the outbox and are read again after the relay's next
// reset, when a producer or a destination may take them.
class NoKafka final : public Sink {
  public:
    Produced produce(const Row&, std::string&) override { return Produced::kUnrouted; }
};

struct Limits {
    std::size_t max_in_flight = 10000;
    std::size_t max_waiting = 100000;  // rows held back or waiting for a retry (ids only)
    int64_t backoff_ms = 1000;
    int64_t backoff_max_ms = 60000;
    int32_t max_attempts = 5;  // for permanent errors; transient errors retry forever
};

// A row the broker acknowledged.
struct Acked {
    int64_t id;
    int32_t partition;
    int64_t offset;
    int64_t created_ms = 0;           // the row's created_at (epoch ms)
    int16_t table = -1;               // Row::table of the read that was produced
    int64_t cause_received_ms = 0;    // Row::cause_received_ms
    uint32_t cause_subscription = 0;  // Row::cause_subscription, as subscription_name()'s index
};

// A row whose delivery failed: write attempts + 1, last_error, next_attempt_at (or 'failed').
struct Failed {
    int64_t id;
    std::string error;
    int64_t retry_in_ms;
    bool give_up;
};

class Dispatcher {
  public:
    Dispatcher(Sink& sink, Limits limits, uint64_t seed = std::random_device{}());

    // A row read by a claim, recheck or refetch. Rows the dispatcher already tracks are ignored
    // unless it asked for them (refetch of a due row).
    void offer(const Row& row, int64_t now_ms);

    // A delivery report. `permanent` says retrying cannot help (e.g. message too large);
    // `counts` is false for purges, which are not delivery attempts. A retry waits at least
    // `min_retry_ms` (an HTTP Retry-After), else the usual backoff.
    void on_delivery(int64_t id, int err, bool permanent, bool counts, int32_t partition,
                     int64_t offset, std::string_view error, int64_t now_ms,
                     int64_t min_retry_ms = 0);

    // Ids of waiting rows whose turn has come; the caller re-reads them and offers them back,
    // then calls refetch_done() so rows that vanished from the outbox are forgotten.
    const std::vector<int64_t>& due_ids(int64_t now_ms, std::size_t max);
    void refetch_done();

    // Outcomes to write back, oldest first. After the transaction that wrote the first n_acked
    // and n_failed of them committed, forget those: outcomes recorded meanwhile (a row refused
    // while that transaction offered rows) stay for the next write.
    const std::vector<Acked>& acked() const noexcept { return acked_; }
    const std::vector<Failed>& failed() const noexcept { return failed_; }
    // Rows to copy into eventbox.outbox_held without an attempt, oldest first: held too long
    // (hold_stale()) or taken by no sink. Written with the outcomes, forgotten with them: once
    // written, failed rows waiting for a retry and these are held (they no longer hold W).
    const std::vector<int64_t>& to_hold() const noexcept { return hold_; }
    void clear_outcomes(std::size_t n_acked, std::size_t n_failed, std::size_t n_hold = 0);
    // The held-too-long rule: queues for to_hold() the rows it tracks that are not held and
    // were tracked, not held, at the previous call already (in flight, waiting for their turn
    // or a retry). Called once per eventbox.relay_sweep_interval, it holds a row after one to
    // two intervals. Returns how many it queued.
    std::size_t hold_stale();
    // Whether a written hold or failure made `id` a held row (tests).
    bool is_held(int64_t id) const noexcept { return held_ids_.count(id) != 0; }

    // Rows no sink took (Produced::kUnrouted) since forget_unrouted(), and the topic of the
    // first of them.
    std::size_t unrouted() const noexcept { return unrouted_; }
    const std::string& unrouted_topic() const noexcept { return unrouted_topic_; }
    void forget_unrouted() noexcept {
        unrouted_ = 0;
        unrouted_topic_.clear();
    }

    std::size_t in_flight() const noexcept { return in_flight_.size(); }
    std::size_t waiting() const noexcept { return waiting_count_; }
    // How many more rows a claim may read now.
    std::size_t capacity() const noexcept;
    // Earliest time a waiting row becomes due (INT64_MAX when none).
    int64_t next_due_ms() const noexcept;
    bool knows(int64_t id) const noexcept;
    // The lowest id it has not settled (INT64_MAX when none): in flight, waiting (its turn or a
    // retry), being re-read, with an outcome not yet forgotten (clear_outcomes()), or offered and
    // taken by no sink and not yet held; rows held (read from outbox_held, or copied there by a
    // written failure or hold) are settled as far as it goes. Every id below it that the relay
    // read is settled: the relay's settled position (docs/design/outbox-rotation.md) never
    // passes it.
    int64_t lowest_unsettled() const noexcept;
    // The subscription behind Acked::cause_subscription ("" for 0). Names are kept for the
    // dispatcher's life: they are the subscriptions whose handlers sent, a short list.
    const std::string& subscription_name(uint32_t index) const noexcept {
        return subscriptions_[index < subscriptions_.size() ? index : 0];
    }

    // Backoff for the n-th failed attempt (1-based), with jitter in [delay/2, delay].
    int64_t backoff_for(int32_t attempts);

  private:
    struct Wait {
        int64_t id;
        int64_t due_ms;
    };
    // A lane's identity: a 64-bit hash of topic and key (keyless rows: of the row id). Two keys
    // that collide share a lane, which only makes one wait behind the other; a string per row
    // (built, copied into its flight, hashed three times) was a tenth of the relay's CPU.
    using LaneKey = uint64_t;
    // Rows of one topic+key (or one keyless row) that must go out in order.
    struct Lane {
        std::size_t in_flight = 0;
        std::map<uint64_t, Wait> waiting;  // by dispatch sequence
        bool fetching = false;             // head asked for by due_ids()
    };
    struct Flight {
        LaneKey lane;
        uint64_t seq;
        int32_t attempts;
        int64_t created_ms;
        int16_t table;
        int64_t cause_received_ms;
        uint32_t cause_subscription;
    };

    static LaneKey lane_of(const Row& row);
    void wait_in_lane(LaneKey lane, uint64_t seq, int64_t id, int64_t due_ms);
    void produce_now(const Row& row, LaneKey lane, uint64_t seq, int64_t now_ms);
    void forget_lane_if_idle(LaneKey lane);
    bool held(int64_t id) const noexcept { return !held_ids_.empty() && held_ids_.count(id) != 0; }
    // The index of a row's cause subscription (0: none), added on first use.
    uint32_t subscription_index(const Row& row);
    // Records a failed attempt of row `id` and schedules its retry unless it gives up.
    void record_failure(int64_t id, LaneKey lane, uint64_t seq, int32_t attempts, bool permanent,
                        std::string_view error, int64_t now_ms, int64_t min_retry_ms = 0);

    Sink& sink_;
    Limits limits_;
    std::mt19937_64 rng_;
    uint64_t next_seq_ = 1;
    std::size_t waiting_count_ = 0;
    std::unordered_map<int64_t, Flight> in_flight_;
    std::unordered_map<LaneKey, Lane> lanes_;
    std::unordered_set<LaneKey> blocked_;  // lanes with waiting rows
    std::unordered_map<int64_t, std::pair<LaneKey, uint64_t>> waiting_ids_;
    std::unordered_set<int64_t> fetching_ids_;
    std::vector<int64_t> due_;
    std::vector<Acked> acked_;
    std::vector<Failed> failed_;
    std::size_t unrouted_ = 0;
    std::string unrouted_topic_;
    std::vector<int64_t> hold_;              // to copy into outbox_held (to_hold())
    std::unordered_set<int64_t> held_ids_;   // tracked rows with a committed held copy
    std::vector<int64_t> stale_candidates_;  // tracked, not held, at the last hold_stale()
    std::vector<std::string> subscriptions_{std::string()};
    std::unordered_map<std::string, uint32_t> subscription_ids_;
    uint32_t last_subscription_ = 0;  // the last one looked up: a handler's sends come in runs
};

}  // namespace eventbox::relay
