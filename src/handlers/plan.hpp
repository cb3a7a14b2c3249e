// Which inbox messages a handler pass takes, lane by lane (docs/design/guarantees.md): messages
// of a lane are handled in offset order, and one that waits for a retry holds back the later
// messages of its lane (ordering 'partition': the whole partition; 'key': the same key; 'none':
// nothing).
// Pure C++.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace eventbox::handlers {

enum class Ordering { kPartition, kKey, kNone };

// Ordering from its SQL name ('partition', 'key', 'none'); kPartition for anything else.
Ordering ordering_from(std::string_view name) noexcept;

// One due-or-waiting message of a lane, in offset order.
struct Candidate {
    std::string_view key;  // ordering 'key' lanes; empty view and has_key false: no key
    bool has_key = false;
    int64_t not_before_ms = 0;  // next_attempt_at; 0: due now
    bool handled = true;        // some registered handler matches its event type
    // Its last attempt started but never finished (the backend crashed or was killed, maybe by
    // another message of that batch): run it alone, so a crasher counts only its own attempts.
    bool suspect = false;
};

// Chooses messages of one lane. `unhandled_keep`: messages without a handler stay 'received'
// for a future handler, and neither run nor hold anything back; otherwise they are taken (to be
// marked 'ignored'). Appends chosen indices to `chosen` while it has fewer than `max`. Returns
// the index of a suspect it would take (then the pass should take only that one), or -1.
long plan_lane(const std::vector<Candidate>& lane, Ordering ordering, bool unhandled_keep,
               int64_t now_ms, std::size_t max, std::vector<std::size_t>& chosen);

// Whether, after the message at `failed` of a lane failed in this pass, the later message at
// `later` must not run in it (it stays where it was, to follow the retry).
bool held_back_by(const Candidate& failed, const Candidate& later, Ordering ordering) noexcept;

// Backoff before the next attempt after `attempts` failures: backoff * 2^(attempts-1), capped at
// backoff_max, then a uniform jitter in [delay/2, delay] from `unit` in [0, 1).
int64_t retry_delay_ms(int32_t attempts, int64_t backoff_ms, int64_t backoff_max_ms,
                       double unit) noexcept;

}  // namespace eventbox::handlers
