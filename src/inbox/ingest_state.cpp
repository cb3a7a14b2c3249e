// The ingest worker's C++ state behind its facade: its lifetime, the consumer's poll and the
// subscription list (see inbox/ingest.hpp; the other methods are beside the steps using them).
#include "inbox/ingest.hpp"

#include <algorithm>

#include "handlers/low_water.hpp"
#include "metrics/counters.hpp"
#include "pg/boundary.hpp"
#include "registry/registry.hpp"

namespace eventbox::ingest {

using pg::call_cpp;

IngestState state;

void IngestState::destroy() noexcept {
    if (subscriptions_ != nullptr) {
        for (Subscription* s : *subscriptions_) {
            metrics::group_uncommitted(s->name.c_str(), -s->reported_uncommitted);
            delete s;
        }
        delete subscriptions_;
        subscriptions_ = nullptr;
    }
    delete consumer_;
    consumer_ = nullptr;
    delete registry_;
    registry_ = nullptr;
    registry_fingerprint_.clear();
    consumer_fingerprint_.clear();
}

void IngestState::start_over() {
    destroy();
    subscriptions_ = call_cpp([] { return new std::vector<Subscription*>(); });
}

std::size_t IngestState::poll(std::size_t max) {
    std::size_t n = call_cpp([&] { return consumer_ ? consumer_->poll(max) : 0; });
    report_group_uncommitted();
    return n;
}

void IngestState::report_group_uncommitted() noexcept {
    if (subscriptions_ == nullptr || consumer_ == nullptr) return;
    for (Subscription* s : *subscriptions_) {
        if (!s->group) continue;
        int64_t now = 0;
        try {
            now = consumer_->group_uncommitted(s->id);
        } catch (...) {
            continue;
        }
        if (now == s->reported_uncommitted) continue;
        metrics::group_uncommitted(s->name.c_str(), now - s->reported_uncommitted);
        s->reported_uncommitted = now;
    }
}

void IngestState::emit_logs() {
    if (consumer_ != nullptr) worker::emit_kafka_logs(*consumer_, kWho);
}

bool IngestState::paused(const Subscription* sub) const {
    return call_cpp([&] { return consumer_->paused(sub->id); });
}

std::size_t IngestState::largest_batch_size() const noexcept {
    std::size_t largest = 1;
    for (Subscription* s : *subscriptions_) largest = std::max(largest, s->batch_size);
    return largest;
}

}  // namespace eventbox::ingest
