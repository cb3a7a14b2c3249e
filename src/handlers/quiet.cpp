// Quiet subscriptions of a handler worker (see handlers/quiet.hpp). Pure C++.
#include "handlers/quiet.hpp"

#include <algorithm>
#include <functional>

namespace eventbox::handlers {

bool QuietSubscriptions::skip(std::string_view subscription, const QuietKey& key, int64_t now_ms,
                              int64_t* recheck_ms) const noexcept {
    auto it = quiet_.find(subscription);
    if (it == quiet_.end() || key.in_flight) return false;
    const Quiet& q = it->second;
    if (q.key.stored != key.stored || q.key.inbox_changes != key.inbox_changes ||
        q.key.subscriptions_generation != key.subscriptions_generation || now_ms >= q.recheck_ms)
        return false;
    *recheck_ms = q.recheck_ms;
    return true;
}

void QuietSubscriptions::after_pass(std::string_view subscription, const QuietKey& key,
                                    int64_t now_ms, bool found_work, int64_t due_ms) {
    // Subscriptions dropped since are forgotten with the generation that announced it.
    if (key.subscriptions_generation != generation_) {
        quiet_.clear();
        generation_ = key.subscriptions_generation;
    }
    auto it = quiet_.find(subscription);
    if (found_work || key.in_flight) {
        if (it != quiet_.end()) quiet_.erase(it);
        return;
    }
    // A seed that differs by subscription and by pass: the rechecks spread over the period.
    uint64_t seed = std::hash<std::string_view>{}(subscription) ^
                    (static_cast<uint64_t>(now_ms) * 0x9E3779B97F4A7C15ull);
    Quiet q{key, std::min(recheck_time(now_ms, quiet_.size(), seed), due_ms)};
    if (it == quiet_.end())
        quiet_.emplace(std::string(subscription), q);
    else
        it->second = q;
}

int64_t QuietSubscriptions::recheck_time(int64_t now_ms, std::size_t quiet,
                                         uint64_t seed) noexcept {
    int64_t period = static_cast<int64_t>(quiet) * 2000 / kQuietRechecksPerSecond;
    int64_t spread = std::max<int64_t>(period - kQuietRecheckMs, 0);
    int64_t at = now_ms + kQuietRecheckMs + static_cast<int64_t>(seed % (spread + 1));
    return (at + kQuietTickMs - 1) / kQuietTickMs * kQuietTickMs;
}

}  // namespace eventbox::handlers
