// Quiet subscriptions of a handler worker: those whose last pass found no lane with work. A
// worker's loop runs a pass over every enabled subscription; each pass costs a transaction and
// a few statements even when it finds nothing, which with a hundred idle subscriptions beside a
// busy one was a quarter of the handler workers' CPU per message of the busy one. A quiet
// subscription is passed over until something may have given it work:
//   - the ingest worker stored rows for it (shmem::inbox_stored_count() moved),
//   - something made rows wait again (the inbox changes moved, or such a change is being
//     committed), or subscriptions or handlers changed (their generation moved),
//   - or its recheck time came, earlier when a retry of it falls due: rows written into
//     eventbox.inbox directly are picked up that way, once the workers' periodic drop of their
//     marks (which does not end the quiet) made the passes look again.
// Rechecks are what an idle subscription costs: kQuietRecheckMs apart while a worker has at
// most kQuietRechecksPerSecond / 2 quiet ones, spread over a longer period when it has more, so
// that a worker rechecks about kQuietRechecksPerSecond a second however many there are; and
// rounded up to kQuietTickMs, so that a worker wakes for them at most 1000 / kQuietTickMs
// times a second.
//
// Pure C++: skip() cannot allocate (noexcept), after_pass() can.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace eventbox::handlers {

inline constexpr int64_t kQuietRecheckMs = 1000;
inline constexpr int64_t kQuietRechecksPerSecond = 200;
inline constexpr int64_t kQuietTickMs = 250;

// What may give a subscription work, read before a pass (and compared before the next).
struct QuietKey {
    uint64_t stored = 0;                    // shmem::inbox_stored_count() of the subscription
    uint64_t inbox_changes = 0;             // shmem::inbox_generation().changes
    uint64_t subscriptions_generation = 0;  // shmem::subscriptions_generation()
    bool in_flight = false;                 // shmem::inbox_generation().in_flight > 0
};

class QuietSubscriptions {
  public:
    // Whether the subscription's pass can be passed over at `now_ms` with the state `key`; if
    // so, `*recheck_ms` gets the time its pass is due anyway.
    bool skip(std::string_view subscription, const QuietKey& key, int64_t now_ms,
              int64_t* recheck_ms) const noexcept;
    // After a pass that began with `key` at `now_ms`: `found_work` false when no lane of the
    // subscription had work (none taken, none locked by another worker, no retry waiting);
    // `due_ms` the earliest retry time it saw (INT64_MAX if none).
    // The recheck time: see recheck_time().
    void after_pass(std::string_view subscription, const QuietKey& key, int64_t now_ms,
                    bool found_work, int64_t due_ms);
    std::size_t size() const noexcept { return quiet_.size(); }
    // When a subscription that went quiet at `now_ms`, beside `quiet` others, is due again:
    // kQuietRecheckMs on, plus a spread of up to 2 * quiet / kQuietRechecksPerSecond seconds
    // less kQuietRecheckMs, drawn from `seed`; rounded up to kQuietTickMs.
    static int64_t recheck_time(int64_t now_ms, std::size_t quiet, uint64_t seed) noexcept;

  private:
    struct Quiet {
        QuietKey key;
        int64_t recheck_ms = 0;
    };
    std::map<std::string, Quiet, std::less<>> quiet_;
    uint64_t generation_ = 0;  // the subscriptions' generation of the entries in quiet_
};

}  // namespace eventbox::handlers
