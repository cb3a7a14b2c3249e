// Pending gauges between exact counts (see metrics/pending_estimate.hpp).
#include "metrics/pending_estimate.hpp"

#include <algorithm>

namespace eventbox::metrics {

namespace {

int64_t estimate(int64_t pending, int64_t base_balance, int64_t balance) {
    return std::max<int64_t>(0, pending + (balance - base_balance));
}

}  // namespace

bool PendingEstimate::count_due(int64_t now_ms, int64_t waiting) const {
    if (!counted_) return true;
    double row_us = counted_rows_ >= kLearnRows ? static_cast<double>(took_ms_) * 1000.0 /
                                                      static_cast<double>(counted_rows_)
                                                : kDefaultRowUs;
    auto expected =
        static_cast<int64_t>(row_us * static_cast<double>(std::max<int64_t>(waiting, 0)) / 1000.0);
    int64_t interval = std::max(kMinIntervalMs, std::max(took_ms_, expected) * kCountShare);
    // Refreshes come about once a second: a cheap count runs at each of them.
    return interval == kMinIntervalMs || now_ms - counted_at_ms_ >= interval;
}

void PendingEstimate::start_count(int64_t at_ms) {
    counted_ = false;
    counted_at_ms_ = at_ms;
    outbox_ = {0, 0};
    inbox_.clear();
}

void PendingEstimate::set_outbox(int64_t pending, int64_t balance) {
    outbox_ = {pending, balance};
}

void PendingEstimate::set_inbox(const std::string& subscription, int64_t pending, int64_t balance) {
    inbox_[subscription] = {pending, balance};
}

void PendingEstimate::end_count(int64_t took_ms) {
    took_ms_ = std::max<int64_t>(0, took_ms);
    counted_rows_ = outbox_.pending;
    for (const auto& [name, base] : inbox_) counted_rows_ += base.pending;
    counted_ = true;
    ++counts_;
}

int64_t PendingEstimate::total(
    int64_t outbox_balance, const std::function<int64_t(const std::string&)>& inbox_balance) const {
    int64_t n = outbox(outbox_balance);
    for (const auto& [name, base] : inbox_)
        n += estimate(base.pending, base.balance, inbox_balance(name));
    return n;
}

int64_t PendingEstimate::outbox(int64_t balance) const noexcept {
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
