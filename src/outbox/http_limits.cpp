// Rate limits and the circuit breaker of HTTP destinations (see outbox/http_limits.hpp).
#include "outbox/http_limits.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

namespace eventbox::http {

namespace {

// A non-negative number (digits, an optional fraction); -1 when there is none.
double number(std::string_view s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
    if (s.empty() || s.size() > 20) return -1;
    bool dot = false;
    for (char c : s) {
        if (c == '.' && !dot) {
            dot = true;
            continue;
        }
        if (c < '0' || c > '9') return -1;
    }
    return std::stod(std::string(s));
}

constexpr int64_t kMaxPauseMs = 3600 * 1000;

}  // namespace

TokenBucket::TokenBucket(double rate, double burst) noexcept
    : rate_(rate > 0 ? rate : 0), burst_(std::max(burst, 1.0)), tokens_(burst_) {}

double TokenBucket::level(int64_t now_ms) const noexcept {
    if (at_ms_ < 0) return burst_;
    double refilled = tokens_ + rate_ * static_cast<double>(now_ms - at_ms_) / 1000.0;
    return std::min(refilled, burst_);
}

int64_t TokenBucket::wait_ms(double n, int64_t now_ms) const noexcept {
    if (!limited()) return 0;
    double need = std::min(n, burst_);  // more than the burst: taken as a debt
    double have = level(now_ms);
    if (have >= need) return 0;
    return static_cast<int64_t>(std::ceil((need - have) * 1000.0 / rate_));
}

void TokenBucket::take(double n, int64_t now_ms) noexcept {
    if (!limited()) return;
    tokens_ = level(now_ms) - n;
    at_ms_ = now_ms;
}

int64_t limit_pause_ms(std::string_view remaining, std::string_view reset, int64_t now_epoch_s) {
    if (number(remaining) != 0) return -1;
    double r = number(reset);
    if (r < 0) return -1;
    double delay_s = r > 1e9 ? r - static_cast<double>(now_epoch_s) : r;
    return std::clamp<int64_t>(static_cast<int64_t>(delay_s * 1000.0), 0, kMaxPauseMs);
}

Breaker::Breaker(int failures, int64_t cooldown_ms) noexcept
    : failures_(std::max(failures, 0)), cooldown_ms_(std::max<int64_t>(cooldown_ms, 0)) {}

void Breaker::move(State to, int64_t now_ms) noexcept {
    state_ = to;
    ++transitions_[static_cast<int>(to)];
    if (to == State::kOpen) open_until_ms_ = now_ms + cooldown_ms_;
    if (to == State::kClosed) in_a_row_ = 0;
    probe_out_ = false;
}

bool Breaker::allow(int64_t now_ms) noexcept {
    if (state_ == State::kOpen && now_ms >= open_until_ms_) move(State::kHalfOpen, now_ms);
    switch (state_) {
        case State::kClosed:
            return true;
        case State::kOpen:
            return false;
        case State::kHalfOpen:
            return !probe_out_;
    }
    return true;
}

bool Breaker::started() noexcept {
    if (state_ != State::kHalfOpen) return false;
    probe_out_ = true;
    return true;
}

void Breaker::ended(bool probe, bool failed, int64_t now_ms) noexcept {
    if (failures_ == 0) return;
    switch (state_) {
        case State::kClosed:
            if (!failed) {
                in_a_row_ = 0;
            } else if (++in_a_row_ >= failures_) {
                move(State::kOpen, now_ms);
            }
            return;
        case State::kOpen:
            return;  // a request started before it opened
        case State::kHalfOpen:
            if (!probe) return;
            move(failed ? State::kOpen : State::kClosed, now_ms);
            return;
    }
}

void Breaker::take_transitions(uint64_t out[3]) noexcept {
    for (int i = 0; i < 3; ++i) {
        out[i] = transitions_[i];
        transitions_[i] = 0;
    }
}

}  // namespace eventbox::http
