// How fast an HTTP destination may be sent to: a token bucket (rate_limit with its burst, and
// max_messages_per_second), the pause a response's limit headers ask for, and the circuit
// breaker (breaker_failures, breaker_cooldown). One of each per destination, shared by all its
// requests; the contracts are docs/guide/http.md's ("Rate limits", "Circuit breaker"). Pure C++.
#pragma once

#include <cstdint>
#include <string_view>

namespace eventbox::http {

// Tokens refilled at `rate` per second up to `burst`. Taking may leave a debt (a bulk request
// takes its messages at once), which later takers wait out: the long-run rate is exact.
class TokenBucket {
  public:
    TokenBucket() = default;  // unlimited
    TokenBucket(double rate, double burst) noexcept;
    bool limited() const noexcept { return rate_ > 0; }
    // Milliseconds until `n` tokens may be taken at `now_ms` (0: now).
    int64_t wait_ms(double n, int64_t now_ms) const noexcept;
    void take(double n, int64_t now_ms) noexcept;

  private:
    double level(int64_t now_ms) const noexcept;
    double rate_ = 0;  // per second; 0: unlimited
    double burst_ = 0;
    double tokens_ = 0;
    int64_t at_ms_ = -1;  // when tokens_ was computed (-1: full)
};

// The delay a response's limit headers ask for before the next request, in ms: when
// RateLimit-Remaining or X-RateLimit-Remaining is 0, its Reset (delta seconds, or epoch seconds
// when larger than 10^9) from `now_epoch_s`; else -1.
int64_t limit_pause_ms(std::string_view remaining, std::string_view reset, int64_t now_epoch_s);

// Closed: requests go; after `failures` transient failures in a row it opens. Open: no request
// for `cooldown_ms`, then half-open: one probe request; its success closes it, its failure opens
// it again. Results of requests started before it opened are ignored while it is not closed.
class Breaker {
  public:
    enum class State { kClosed = 0, kOpen = 1, kHalfOpen = 2 };
    Breaker() = default;  // never opens
    Breaker(int failures, int64_t cooldown_ms) noexcept;
    // Whether a request may start now (moves an open breaker past its cooldown to half-open).
    bool allow(int64_t now_ms) noexcept;
    // A request starts; returns whether it is the probe.
    bool started() noexcept;
    // A request ended: `failed` when it failed transiently (408, 429, 5xx, no response).
    void ended(bool probe, bool failed, int64_t now_ms) noexcept;
    State state() const noexcept { return state_; }
    // Half-open with its probe out: no request until the probe ends.
    bool probing() const noexcept { return state_ == State::kHalfOpen && probe_out_; }
    // When an open breaker half-opens (-1 when it is not open).
    int64_t due_ms() const noexcept { return state_ == State::kOpen ? open_until_ms_ : -1; }
    // Transitions into each state since the last call (indexed by State), then zeroes them.
    void take_transitions(uint64_t out[3]) noexcept;

  private:
    void move(State to, int64_t now_ms) noexcept;
    int failures_ = 0;  // 0: no breaker
    int64_t cooldown_ms_ = 30000;
    State state_ = State::kClosed;
    int in_a_row_ = 0;
    bool probe_out_ = false;
    int64_t open_until_ms_ = 0;
    uint64_t transitions_[3] = {0, 0, 0};
};

}  // namespace eventbox::http
