// Pending gauges between exact counts (see metrics/pending_estimate.hpp).
#include "metrics/pending_estimate.hpp"

#include <algorithm>

namespace eventbox::metrics {

namespace {

int64_t estimate(int64_t pending, int64_t base_balance, int64_t balance) {
    return std::max<int64_t>(0, pending + (balance - base_balance));
}

}  // namespace

bool PendingEstimate::count_due(int64_t now_ms) const {
    if (!counted_) return true;
    int64_t interval = std::max(kMinIntervalMs, took_ms_ * kCountShare);
    // Refreshes come about once a second: a cheap count runs at each of them.
    return interval == kMinIntervalMs || now_ms - counted_at_ms_ >= interval;
}

void PendingEstimate::start_count(int64_t at_ms) {
    counted_ = false;
    counted_at_ms_ = at_ms;
    outbox_ = {0, 0};
    inbox_.clear();
}

void PendingEstimate::set_outbox(int64_t pending, int64_t balance) { outbox_ = {pending, balance}; }

void PendingEstimate::set_inbox(const std::string& subscription, int64_t pending,
                                int64_t balance) {
    inbox_[subscription] = {pending, balance};
}

void PendingEstimate::end_count(int64_t took_ms) {
    took_ms_ = std::max<int64_t>(0, took_ms);
    counted_ = true;
}

int64_t PendingEstimate::outbox(int64_t balance) const {
    return estimate(outbox_.pending, outbox_.balance, balance);
}

bool PendingEstimate::inbox(const std::string& subscription, int64_t balance,
                            int64_t* pending) const {
    auto it = inbox_.find(subscription);
    if (it == inbox_.end()) return false;
    *pending = estimate(it->second.pending, it->second.balance, balance);
    return true;
}

}  // namespace eventbox::metrics
