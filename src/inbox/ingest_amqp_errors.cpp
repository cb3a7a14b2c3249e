// What the log and eventbox.subscription_errors say about this ingest worker's RabbitMQ
// subscriptions (see inbox/ingest_amqp.hpp).
#include "inbox/ingest_amqp.hpp"

#include <string>

#include "pg/boundary.hpp"

namespace eventbox::ingest {

using pg::call_cpp;
using namespace amqp_sub;

namespace amqp_sub {

// The consumer's errors, each logged when it changes (at a bounded rate).
void log_errors() {
    char* connection = nullptr;
    call_cpp([&] {
        const std::string& e = amqp_state->consumer->last_error();
        if (e != amqp_state->logged_error) {
            amqp_state->logged_error = e;
            if (!e.empty()) connection = pstrdup(e.c_str());
        }
    });
    if (connection != nullptr) ereport(LOG, (errmsg("eventbox ingest: RabbitMQ: %s", connection)));
    for (std::size_t k = 0;; ++k) {
        AmqpSub* s = nullptr;
        char* what = nullptr;
        bool more = call_cpp([&] {
            if (k >= amqp_state->subs.size()) return false;
            s = amqp_state->subs[k];
            const std::string& e = amqp_state->consumer->error(s->id);
            if (e != s->logged_error) {
                s->logged_error = e;
                if (!e.empty() && e != amqp_state->consumer->last_error())
                    what = pstrdup((": " + e).c_str());
            }
            return true;
        });
        if (!more) break;
        if (what != nullptr)
            log_subscription("eventbox ingest: subscription \"%s\" cannot consume%s",
                             s->sub.name.c_str(), what);
    }
}

namespace {

// A failed batch stays in eventbox.subscription_errors until a batch is stored, or until the
// subscription stayed quiet this long after its retry (its deliveries were taken elsewhere).
constexpr int64_t kQuietRecoveryMs = 10000;

// What eventbox.ingest_errors should say about `s` ("" = nothing): its failed batch, else why
// it cannot consume (a missing queue, a refused connection or login, a closed channel).
const std::string& wanted_error(const AmqpSub* s) {
    return s->sub.failing ? s->sub.error : amqp_state->consumer->error(s->id);
}

bool error_changed(const AmqpSub* s) {
    return wanted_error(s) != s->sub.recorded ||
           (s->sub.failing ? s->sub.attempts : 0) != s->sub.recorded_attempts;
}

}  // namespace

// Writes the errors of the AMQP subscriptions that changed to eventbox.ingest_errors, in one
// transaction (none when nothing changed): as the Kafka subscriptions' (record_errors()).
void record_amqp_errors() {
    int64 now = worker::now_ms();
    bool due = call_cpp([&] {
        bool any = false;
        for (AmqpSub* s : amqp_state->subs) {
            if (s->sub.failing && now >= s->sub.retry_at_ms + kQuietRecoveryMs &&
                amqp_state->consumer->error(s->id).empty() &&
                amqp_state->consumer->batch(s->id).empty())
                s->sub.recovered();
            any |= error_changed(s);
        }
        return any;
    });
    if (!due) return;
    worker::begin_work(kWho);
    for (std::size_t k = 0;; ++k) {
        // Views into the subscription's strings: nothing changes them until end_work().
        const char* name = nullptr;
        const char* error = nullptr;
        int attempts = 0;
        int64 retry_at_ms = -1;
        bool more = call_cpp([&] {
            if (k >= amqp_state->subs.size()) return false;
            AmqpSub* s = amqp_state->subs[k];
            if (!error_changed(s)) return true;
            name = s->sub.name.c_str();
            error = wanted_error(s).c_str();
            attempts = s->sub.failing ? s->sub.attempts : 0;
            retry_at_ms = s->sub.failing ? s->sub.retry_at_ms : -1;
            return true;
        });
        if (!more) break;
        if (name == nullptr) continue;
        write_error_row(name, error, attempts, retry_at_ms);
        call_cpp([&] {
            AmqpSub* s = amqp_state->subs[k];
            s->sub.recorded = wanted_error(s);
            s->sub.recorded_attempts = s->sub.failing ? s->sub.attempts : 0;
        });
    }
    worker::end_work();
}

void record_refused() {
    for (std::size_t k = 0;; ++k) {
        const char* name = nullptr;
        const char* error = nullptr;
        bool more = call_cpp([&] {
            if (k >= amqp_state->wanted.size() || amqp_state->refused.empty()) return false;
            name = amqp_state->wanted[k].name.c_str();
            error = amqp_state->refused.c_str();
            return true;
        });
        if (!more) break;
        write_error_row(name, error, 0, -1);
    }
}

}  // namespace amqp_sub

int amqp_count_recorded() noexcept {
    if (amqp_state == nullptr) return 0;
    if (!amqp_state->refused.empty()) return static_cast<int>(amqp_state->wanted.size());
    int n = 0;
    for (const AmqpSub* s : amqp_state->subs) n += s->sub.recorded.empty() ? 0 : 1;
    return n;
}

int amqp_recorded(const char** names, int max) {
    if (amqp_state == nullptr) return 0;
    int n = 0;
    if (!amqp_state->refused.empty()) {
        for (const AmqpWanted& w : amqp_state->wanted)
            if (n < max) names[n++] = w.name.c_str();
        return n;
    }
    for (const AmqpSub* s : amqp_state->subs)
        if (!s->sub.recorded.empty() && n < max) names[n++] = s->sub.name.c_str();
    return n;
}

}  // namespace eventbox::ingest
