// What the files of a handler pass share (handlers/runner.hpp is the pass's contract, and
// docs/design/handlers.md tells how a pass goes): the subscription as a pass sees it, the pass's
// working set behind its PostgreSQL-side facade, and the steps one file runs for another.
// PostgreSQL side; internal to src/handlers/.
//
//   pass.cpp          a pass from start to end, and the guard against nesting
//   setup.cpp         the subscription's options and handlers, read at a pass's start
//   choose.cpp        the walk over the lanes that chooses the messages
//   lanes.cpp         finding a lane with the plain probe, reading a locked lane's messages
//   marks.cpp         a worker's low-water marks and the lanes it knows
//   lane_claims.cpp   lane locks, and the claims that count a crashed pass's attempts
//   run.cpp           running the chosen messages in run transactions
//   handler_call.cpp  calling a handler: plan, authority, role, settings, timeouts
//   outcomes.cpp      recording what happened to the messages
//   dry_run.cpp       eventbox.dry_run()
// Beside them: worker.cpp (the handler workers' main loop), sql_api.cpp (the SQL entry points),
// dead_letters.cpp (the failure workflow), and the pure C++ the
// pass decides with (pass_state, plan, low_water, quiet, dead_policy), each with its unit test.
#pragma once

extern "C" {
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
}

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "handlers/dead_letters.hpp"
#include "handlers/low_water.hpp"
#include "handlers/pass_state.hpp"
#include "handlers/plan.hpp"
#include "pg/arrays.hpp"
#include "pg/boundary.hpp"
#include "workers/common.hpp"

namespace eventbox::handlers {

// What the pass's statements and internal errors name.
inline constexpr const char* kWho = "eventbox handlers";

// ---- kept statements --------------------------------------------------------------------------

using worker::KeptStatement;

// worker::exec_kept() of a statement of the pass, naming the handler side in its errors.
inline void exec(KeptStatement& statement, Datum* values, bool read_only, int expected,
                 worker::Access access = worker::Access::kIndex) {
    worker::exec_kept(kWho, statement, values, read_only, expected, access);
}

// Column `column` of an SPI row as a C string (palloc'd), nullptr when NULL.
char* nullable_text(HeapTuple tuple, TupleDesc desc, int column);

// ---- the subscription, as a pass reads it (setup.cpp) ------------------------------------------

struct HandlerRef {
    char* event_type;  // NULL: every type
    char* signature;   // as registered: schema-qualified, resolved again at every pass
    Oid fn;            // InvalidOid when no function has that signature now
    Oid run_as;
    Oid registered_by;
    bool batch;  // f(eventbox.inbox[]): called once per chunk of messages (run.cpp)
    // The transaction (MyProc->lxid) in which check_authority() last passed for this handler:
    // authority is checked once per transaction that runs it, like the catalog it reads.
    LocalTransactionId authorized_in;
};

struct Options {
    Ordering ordering;
    int32 max_attempts;
    int64 backoff_ms;
    int64 backoff_max_ms;
    bool unhandled_keep;
    dead_letters::Policy dead;  // non_retryable, on_dead, dead_letter_topic
    bool replays;               // eventbox.reprocess() queued messages that still wait
};

// What a pass knows of its subscription. Trivially destructible (its parts are palloc'd).
struct PassSetup {
    Datum name;
    HandlerRef* handlers;
    int n_handlers;
    Options options;
    bool found;  // the subscription exists, is enabled, and may have something to run
    // For reading lanes: some handler takes every type; the types handlers take.
    bool any_type;
    bool any_batch;  // some handler is a batch handler: run transactions run chunks (run.cpp)
    Datum handled_types;
    const char** handler_types;  // each handler's type (NULL: every type), for mark_handled()
};

// Reads the subscription `name`'s handlers and options, and the lane read's parameters derived
// from them. The handlers are kept in `memory`; the rest belongs to the current transaction.
void load_setup(Datum name, MemoryContext memory, PassSetup* setup);

// The handlers of `setup` that take `event_type`, into `matching` (room for every handler).
int handlers_taking(const PassSetup& setup, const char* event_type, HandlerRef** matching);

// ---- the pass --------------------------------------------------------------------------------

// The pass's working set (PassState) as the PostgreSQL side uses it: what cannot allocate is
// noexcept and called directly; what can runs inside pg::call_cpp() here, so that a C++
// exception becomes a PostgreSQL ERROR only once its scope closed. Trivially destructible.
class PassWork {
  public:
    explicit PassWork(PassState* state) : state_(state) {}

    // ---- reads
    bool find_cursor(const char* subscription, const char** topic,
                     int32* partition) const noexcept {
        return state_->find_cursor(subscription, topic, partition);
    }
    std::size_t lane_count() const noexcept { return state_->lane_count(); }
    LaneId lane_id(std::size_t l) const noexcept { return state_->lane_id(l); }
    bool has_lane(const char* topic, int32 partition) const noexcept {
        return state_->has_lane(topic, partition);
    }
    bool is_locked(std::size_t l) const noexcept { return state_->is_locked(l); }
    bool had_claim(std::size_t l) const noexcept { return state_->had_claim(l); }
    bool lane_has_chosen(std::size_t l) const noexcept { return state_->lane_has_chosen(l); }
    bool lane_in_use(std::size_t l) const noexcept { return state_->lane_in_use(l); }
    std::size_t chosen_count() const noexcept { return state_->chosen_count(); }
    std::size_t lane_of_chosen(std::size_t c) const noexcept { return state_->lane_of_chosen(c); }
    ChosenMessage chosen(std::size_t c) const noexcept { return state_->chosen(c); }
    bool is_held_back(std::size_t c, Ordering ordering) const noexcept {
        return state_->is_held_back(c, ordering);
    }

    // ---- updates that cannot allocate
    void begin_pass() noexcept { state_->begin_pass(); }
    void set_locked(std::size_t l) noexcept { state_->set_locked(l); }
    void set_had_claim(std::size_t l) noexcept { state_->set_had_claim(l); }
    void seal_lane(std::size_t l) noexcept { state_->seal_lane(l); }
    void mark_handled(std::size_t l, const char* const* handler_types,
                      std::size_t n_handlers) noexcept {
        state_->mark_handled(l, handler_types, n_handlers);
    }
    double next_jitter() noexcept { return state_->next_jitter(); }

    // ---- updates that allocate: guarded
    void set_cursor(const char* subscription, const char* topic, int32 partition) {
        pg::call_cpp([&] { state_->set_cursor(subscription, topic, partition); });
    }
    std::size_t add_lane(const char* topic, int32 partition) {
        return pg::call_cpp([&] { return state_->add_lane(topic, partition); });
    }
    void add_message(std::size_t l, const MessageRow& row) {
        pg::call_cpp([&] { state_->add_message(l, row); });
    }
    long plan(std::size_t l, Ordering ordering, bool unhandled_keep, int64 now_ms, std::size_t max,
              int64* next_due_ms) {
        return pg::call_cpp(
            [&] { return state_->plan(l, ordering, unhandled_keep, now_ms, max, next_due_ms); });
    }
    void choose_picks(std::size_t l, std::size_t before = SIZE_MAX) {
        pg::call_cpp([&] { state_->choose_picks(l, before); });
    }
    void choose_alone(std::size_t l, std::size_t index) {
        pg::call_cpp([&] { state_->choose_alone(l, index); });
    }
    void mark_failed(std::size_t c) {
        pg::call_cpp([&] { state_->mark_failed(c); });
    }

  private:
    PassState* state_;
};

// One pass over a subscription, as its steps share it. Trivially destructible: it lives on the
// frame of run_pass(), which an ERROR crosses.
struct Pass {
    const char* subscription;
    int max;                // messages it chooses at most
    bool own_transactions;  // a worker's pass (see run_pass())
    int64* next_due_ms;     // lowered to the earliest retry time the pass sees waiting
    MemoryContext memory;   // what it keeps, across its transactions and SPI connections
    PassWork work;
    PassSetup setup;
    int64 now;  // when it began choosing, on PostgreSQL's clock (ms)
    // A worker's: names the subscription, the pass and the lane worked on in its errors.
    worker::WorkContext* context;
};

static_assert(std::is_trivially_destructible_v<PassWork> &&
                  std::is_trivially_destructible_v<PassSetup> &&
                  std::is_trivially_destructible_v<Pass>,
              "kept on frames a PostgreSQL ERROR crosses");

// Names lane (topic, partition) in the pass's errors from now on (topic nullptr: no lane).
inline void name_lane(Pass& p, const char* topic, int32 partition) noexcept {
    if (p.context == nullptr) return;
    p.context->topic = topic;
    p.context->partition = partition;
}

// Starts a pass: the state it works in (returned), its memory context (reset), a worker's first
// transaction, SPI, a snapshot; leaves the memory context current.
PassState* open_pass(bool own_transactions, MemoryContext* memory);

// Raises ERROR 55000 when a pass or a dry run is in progress in this backend (`function`, called
// from a handler, would run one inside it, over the same state); else one is until leave_pass().
void enter_pass(const char* function);
void leave_pass() noexcept;

// ---- choosing (choose.cpp, lanes.cpp, lane_claims.cpp, marks.cpp) -------------------------------

// Chooses up to p.max messages lane by lane, locking each lane it reads and settling a crashed
// pass's claim there. Returns how many messages the settlements made dead; *found_work gets
// whether it found a lane with work (see last_pass_found_work()).
int choose_messages(Pass& p, bool* found_work);

// The lane (topic, partition) with work that follows `after` in index order, up to `upto`
// inclusive when upto_topic is not NULL, by the plain probe; false when there is none. The topic
// is allocated in the current memory context.
bool next_lane(Datum name, const char* after_topic, int32 after_partition, const char* upto_topic,
               int32 upto_partition, char** topic, int32* partition);
// Reads up to `per_lane` waiting messages of pass lane l, whose lock the pass holds, into it.
void read_lane(Pass& p, std::size_t l, int per_lane);

bool try_lock_lane(const char* subscription, const char* topic, int32 partition, bool session);
bool try_lock_suspects(bool session);
// Releases the session locks of the lanes a worker's pass read but does not use.
void release_unused_lanes(const Pass& p);
// Settles what a crashed pass left in pass lane l; returns how many messages went dead.
int settle_claim(Pass& p, std::size_t l);
// Writes the claim of each lane the pass holds that runs messages or whose claim it settled:
// its messages with their places in the run order, the first run transaction's [0, first_end).
void write_claims(Pass& p, const bool* to_run, int first_end);
// Records in the pass's claims that its run transaction of places [from, to) is the one in
// flight, in the transaction that commits the previous one's outcomes.
void set_claims_running(Pass& p, int from, int to);
// Empties the claims of the lanes whose messages the pass ran.
void clear_claims(Pass& p);

// A worker's low-water marks (marks.cpp; LaneMarks, docs/design/handlers.md).
void begin_marks(int64 now);
void marks_off() noexcept;
bool marks_on() noexcept;
bool marks_still_hold();
// Whether the worker's lanes of the subscription are loaded; the position of a lane it knows.
bool lanes_loaded(const char* subscription) noexcept;
long known_lane(const char* subscription, const char* topic, int32 partition) noexcept;
bool unknown_work(const char* subscription) noexcept;
void set_unknown_work(const char* subscription, bool found);
// Reads the lanes of the subscription a worker knows (once loaded: their next offsets only).
void read_lanes(Datum name, const char* subscription);
// next_lane() for a worker, over the lanes it knows, from their marks.
bool next_known_lane(Datum name, const char* subscription, const char* after_topic,
                     int32 after_partition, const char* upto_topic, int32 upto_partition,
                     bool replays, char** topic, int32* partition);
// The mark of lane (topic, partition) of the subscription, or none; *position in the marks.
LaneMark lane_mark(const char* subscription, const char* topic, int32 partition, long* position);
// Raises the lane's mark of a range to the first row of the read in SPI_tuptable.
void raise_mark(const char* subscription, long position, bool replay, bool filtered);
// Whether lane (TOPIC, PARTITION) of subscription $1 has a message waiting for a retry, due or
// not, or a dead one holding a key back: a position passes the messages a read left out
// (lanes.cpp, LANE_READ), so the probes and the discovery of lanes look for these apart,
// through inbox_retry_idx (its order pins it) and key_blocks' primary key, one descent each.
// Such a lane is read at each pass, from its position: the read finds the due retries below it
// and releases the blocks whose message is no longer dead.
#define EVENTBOX_LANE_LEFT_OUT(TOPIC, PARTITION)                                              \
    "(SELECT 1 FROM eventbox.inbox r WHERE r.subscription = $1 AND r.topic = " TOPIC          \
    " AND r.\"partition\" = " PARTITION                                                       \
    " AND r.next_attempt_at IS NOT NULL"                                                      \
    " AND r.status IN ('received', 'retry') ORDER BY r.next_attempt_at LIMIT 1) IS NOT NULL"  \
    " OR (SELECT 1 FROM eventbox.key_blocks b WHERE b.subscription = $1 AND b.topic = " TOPIC \
    " AND b.\"partition\" = " PARTITION " LIMIT 1) IS NOT NULL"

// A lane's durable positions as a pass read them (eventbox.inbox_positions, kNoMark: none), read
// before the lane: a range has no waiting row below its position.
struct LanePosition {
    int64 live = kNoMark;
    int64 version = -1;  // of the live range's row, -1 without one
    int64 replay = kNoMark;
    int64 replay_version = -1;  // of the replay range's row, -1 without one
    int64 next = kNoMark;       // the lane's next offset to store (eventbox.offsets)
};
LanePosition lane_position(Datum name, const char* topic, int32 partition);
// What a worker's pass read in its lanes, to raise their live marks and positions.
void forget_lane_reads() noexcept;
void note_lane_read(std::size_t l, long position, bool counted, bool from_position,
                    const LaneId& lane, const LanePosition& durable, MemoryContext memory);
void uncount_lane_read(std::size_t l) noexcept;
// Pass lane l read rows of its replay range: its position is raised with the pass's last outcomes.
void note_replay_read(std::size_t l) noexcept;
void count_final(const ChosenMessage& m) noexcept;
void raise_marks_after_commit(const char* subscription);
// Raises the positions of the lanes the pass read, in the transaction of its last outcomes
// (docs/design/handlers.md, "Lane positions").
void advance_positions(Datum name);
// The live ranges' part, in a worker's run transaction before the last (outcomes so far).
void advance_live_positions(Datum name);

// ---- running (run.cpp, handler_call.cpp, outcomes.cpp) ----------------------------------------

// Opens a worker's run transaction (worker::begin_work) with `memory` current.
void begin_run_transaction(MemoryContext memory);
// Commits a worker's run transaction, asynchronously.
void commit_run_transaction();
// Where the first run transaction of the pass's n_chosen chosen messages ends (see
// transaction_end() in run.cpp).
int first_run_end(const Pass& p, int n_chosen);
// Runs the chosen messages marked in to_run[], the first run transaction ending at first_end
// (first_run_end()); returns how many it handled.
int run_messages(Pass& p, int n_chosen, const bool* to_run, int first_end);

// Registers this backend's handler timeouts (once), and the exit callback that leaves the note
// of a handler that ran past its timeout (see handler_call.cpp).
void register_handler_timeouts();
// The error of an attempt whose backend was terminated because its handler ran past
// eventbox.handler_timeout (`timeout_ms` then) and ignored the cancel; palloc'd.
char* timeout_termination_error(int timeout_ms);
// Names the claimed message whose handlers a worker's pass runs next (the strings must last
// until they return): the note a termination leaves names it.
void claim_running(const char* subscription, const char* topic, int32 partition, const char* id,
                   int32 attempts) noexcept;
// Pins the settings handlers start from around their calls (see handler_call.cpp).
void pin_handler_settings();
void unpin_handler_settings();
// Calls the handlers of one message, each as its run_as role; ERROR when one fails. A batch
// handler among them gets the message as a one-element array.
void call_handlers(Datum row, HandlerRef* const* handlers, int n);
// Calls the batch handlers `handlers` once each, in order, with the n rows (`rows`, one lane's, in
// offset order) as an eventbox.inbox[], each as its run_as role; ERROR when one fails. send()
// inside them takes its lineage from rows[0].
void call_batch_handlers(const Datum* rows, int n, HandlerRef* const* handlers, int n_handlers);
// After an ERROR from call_handlers(): rolls `sub` back and returns the error's text.
char* handlers_failed(const worker::Subtransaction& sub);
// Runs the handlers of one message in a subtransaction (rolled back in a dry run); NULL on
// success, else the error text ("SQLSTATE: message").
char* run_message(Datum row, HandlerRef* const* handlers, int n);
// A dry run is in progress: run_message() rolls every message back.
void set_dry_run(bool on) noexcept;
bool dry_running() noexcept;
// A role's name, or a description when it was dropped.
const char* role_name(Oid role);

// The outcomes a run transaction records: each kind in arrays of its own, filled from the
// front (at most `n` messages). Trivially destructible.
struct Outcomes {
    pg::ArrayColumn processed, processed_tids, ignored, failed_ids, failed_errors, failed_delays,
        failed_dead;
    int n_processed = 0, n_ignored = 0, n_failed = 0;
    explicit Outcomes(int n)
        : processed(n, TEXTOID),
          processed_tids(n, TIDOID),
          ignored(n, TEXTOID),
          failed_ids(n, TEXTOID),
          failed_errors(n, TEXTOID),
          failed_delays(n, INT8OID),
          failed_dead(n, BOOLOID) {}
    void add_processed(Datum id, Datum tid) {
        processed.set(n_processed, id);
        processed_tids.set(n_processed++, tid);
    }
    void add_ignored(Datum id) { ignored.set(n_ignored++, id); }
    void add_failed(Datum id, Datum error, Datum delay_ms, Datum dead) {
        failed_ids.set(n_failed, id);
        failed_errors.set(n_failed, error);
        failed_delays.set(n_failed, delay_ms);
        failed_dead.set(n_failed++, dead);
    }
};
static_assert(std::is_trivially_destructible_v<Outcomes>, "kept on frames an ERROR crosses");
// Records the outcomes in the current transaction; they commit with the handlers' effects.
void record_outcomes(Datum name, const Outcomes& o);
// Marks ignored, without an attempt, the chosen messages no handler takes, and marks the others
// in to_run[] (*n_to_run gets how many). Returns how many it ignored.
int ignore_unhandled(Pass& p, int n_chosen, bool* to_run, int* n_to_run);

}  // namespace eventbox::handlers
