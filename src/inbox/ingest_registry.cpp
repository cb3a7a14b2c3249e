// The ingest worker's side of the Schema Registry: the registry client of the subscriptions with
// value_format 'registry', driven from the worker's loop (see inbox/ingest.hpp,
// registry/registry.hpp and docs/design/ingest.md).
#include "inbox/ingest.hpp"

#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "pg/boundary.hpp"
#include "pg/guc.hpp"
#include "registry/registry.hpp"

namespace eventbox::ingest {

using pg::call_cpp;

namespace {

// How often a subscription paused because the registry could not be reached asks for its schema
// again while its backoff runs: one fetch at a time (an open one is not started twice), served
// by the loop like any other.
constexpr int64_t kProbeMs = 1000;

// How long the loop sleeps while schema fetches are open: curl's transfers advance between
// waits (a fetch on loopback takes ~1 ms; a slow registry costs this wakeup rate only). While
// only probes are open (a registry that hangs keeps one open for request.timeout.ms), longer:
// nothing waits for them but a paused subscription.
constexpr long kRegistryPollMs = 5;
constexpr long kProbePollMs = 50;

}  // namespace

void IngestState::configure_registry() {
    call_cpp([&] {
        bool wanted = false;
        for (Subscription* s : *subscriptions_)
            wanted = wanted || s->registry_format || s->registry_keys;
        const char* url = guc::schema_registry_url ? guc::schema_registry_url : "";
        const char* options = guc::schema_registry_options ? guc::schema_registry_options : "";
        std::string fingerprint = std::string(url) + "|" + options;
        if (registry_ != nullptr && (!wanted || fingerprint != registry_fingerprint_)) {
            delete registry_;
            registry_ = nullptr;
            // What they waited for is asked of the new client when they read it again.
            for (Subscription* s : *subscriptions_)
                if (s->waiting) s->schema_ready = true;
        }
        if (wanted && registry_ == nullptr) {
            registry_ = new registry::Registry(registry::make_config(url, options));
            registry_fingerprint_ = fingerprint;
        }
        for (Subscription* s : *subscriptions_) {
            s->options.registry = s->registry_format || s->registry_keys ? registry_ : nullptr;
            s->options.registry_values = s->registry_format;
            s->options.registry_keys = s->registry_keys;
        }
    });
}

void IngestState::wait_for_schema(Subscription* sub) {
    call_cpp([&] {
        if (!consumer_->paused(sub->id)) consumer_->pause(sub->id);
        sub->waiting = true;
    });
}

bool IngestState::registry_step() {
    return call_cpp([&] {
        if (registry_ == nullptr) return false;
        registry_->perform();
        bool ready = false;
        for (Subscription* s : *subscriptions_) {
            if (!s->waiting) continue;
            if (registry_->cached(s->waiting_for)) {
                s->waiting = false;
                s->schema_ready = true;
                ready = true;
            } else if (std::string why = registry_->failure(s->waiting_for); !why.empty()) {
                s->waiting = false;
                s->registry_failure = why;
            }
        }
        // After the waiting ones saw their failures: a probe's fetch clears the last one.
        int64_t now = worker::now_ms();
        for (Subscription* s : *subscriptions_) {
            if (!s->probing) continue;
            if (!s->failing || s->waiting || consumer_ == nullptr || !consumer_->paused(s->id) ||
                now >= s->retry_at_ms) {
                s->probing = false;  // read again already, or failed otherwise
            } else if (registry_->cached(s->waiting_for)) {
                s->probing = false;
                s->retry_at_ms = now;  // the registry answers again: its retry is due
                ready = true;
            } else if (now >= s->probe_at_ms) {
                registry_->probe(s->waiting_for);
                s->probe_at_ms = now + kProbeMs;
            }
        }
        return ready;
    });
}

long IngestState::registry_wait_ms() const noexcept {
    if (registry_ == nullptr || !registry_->busy()) return -1;
    return registry_->probes_only() ? kProbePollMs : kRegistryPollMs;
}

// A subscription whose schema could not be fetched (the registry unreachable, refusing our
// credentials, answering 5xx) is failed like one whose batch could not be stored: paused, shown
// in eventbox.subscription_errors, read again after its backoff (and its schema asked again),
// or sooner: its schema is asked for again every kProbeMs meanwhile, and once it arrived the
// subscription is read again at once.
bool registry_turn() {
    bool ready = state.registry_step();
    for (std::size_t k = 0; k < state.count(); ++k) {
        Subscription* sub = state.at(k);
        if (sub->registry_failure.empty()) continue;
        subscription_failed(sub, sub->registry_failure.c_str());
        sub->registry_failure.clear();
        sub->probing = true;
        sub->probe_at_ms = worker::now_ms() + kProbeMs;
    }
    return ready;
}

}  // namespace eventbox::ingest
