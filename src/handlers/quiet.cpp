// Quiet subscriptions of a handler worker (see handlers/quiet.hpp). Pure C++.
#include "handlers/quiet.hpp"

#include <algorithm>

namespace eventbox::handlers {

bool QuietSubscriptions::skip(std::string_view subscription, const QuietKey& key, int64_t now_ms,
                              int64_t* recheck_ms) const noexcept {
    auto it = quiet_.find(subscription);
    if (it == quiet_.end() || key.in_flight) return false;
    const Quiet& q = it->second;
    if (q.key.stored != key.stored || q.key.inbox_generation != key.inbox_generation ||
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
    Quiet q{key, std::min(now_ms + kQuietRecheckMs, due_ms)};
    if (it == quiet_.end())
        quiet_.emplace(std::string(subscription), q);
    else
        it->second = q;
}

}  // namespace eventbox::handlers
