// Which RabbitMQ subscriptions this ingest worker consumes, its consumer, and their stored
// offsets (see inbox/ingest_amqp.hpp).
#include "inbox/ingest_amqp.hpp"

extern "C" {
#include "utils/builtins.h"
}

#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "pg/boundary.hpp"
#include "pg/guc.hpp"

namespace eventbox::ingest {

using pg::call_cpp;
using namespace amqp_sub;

namespace amqp_sub {

AmqpState* amqp_state = nullptr;

}  // namespace amqp_sub

namespace {

// Which worker consumes a subscription: FNV-1a of its name.
int owner_of(const std::string& name, int n) {
    uint32_t h = 2166136261u;
    for (unsigned char c : name) h = (h ^ c) * 16777619u;
    return n <= 1 ? 0 : static_cast<int>(h % static_cast<uint32_t>(n));
}

void drop_all(AmqpState* st) noexcept {
    for (AmqpSub* s : st->subs) delete s;
    st->subs.clear();
    delete st->consumer;
    st->consumer = nullptr;
}

// The enabled AMQP subscriptions this worker consumes, into amqp_state->wanted.
void read_wanted() {
    int rc = SPI_execute(
        "SELECT name, array_to_string(topics, ','), start_from, "
        "coalesce(message_id_field, ''), batch_size, message_id_rule, keep_raw, "
        "dead_letter_topic IS NOT NULL "
        "FROM eventbox.subscriptions WHERE enabled AND source = 'amqp' ORDER BY name",
        true, 0);
    if (rc != SPI_OK_SELECT) elog(ERROR, "eventbox ingest: reading subscriptions failed");
    call_cpp([] { amqp_state->wanted.clear(); });
    for (uint64 i = 0; i < SPI_processed; ++i) {
        HeapTuple tuple = SPI_tuptable->vals[i];
        TupleDesc desc = SPI_tuptable->tupdesc;
        bool isnull;
        const char* name = text_at(tuple, desc, 1);
        const char* queues = text_at(tuple, desc, 2);
        const char* start = text_at(tuple, desc, 3);
        const char* field = text_at(tuple, desc, 4);
        int batch_size = DatumGetInt32(SPI_getbinval(tuple, desc, 5, &isnull));
        const char* id_rule = text_at(tuple, desc, 6);
        bool keep_raw = DatumGetBool(SPI_getbinval(tuple, desc, 7, &isnull));
        bool dead_letters = DatumGetBool(SPI_getbinval(tuple, desc, 8, &isnull));
        call_cpp([&] {
            if (owner_of(name, members) != member) return;
            AmqpWanted w;
            w.name = name;
            w.message_id_field = field;
            w.start_first = std::string(start) == "earliest";
            w.id_rule = inbox::id_rule_named(id_rule);
            w.keep_raw = inbox::keeps_raw(inbox::RawNeeds{keep_raw, dead_letters});
            w.batch_size = batch_size;
            std::string list = queues;
            for (std::size_t from = 0; from <= list.size();) {
                std::size_t comma = list.find(',', from);
                if (comma == std::string::npos) comma = list.size();
                w.queues.push_back(list.substr(from, comma - from));
                from = comma + 1;
            }
            w.settings = list + "|" + start + "|" + field + "|" + std::to_string(batch_size) + "|" +
                         id_rule + (w.keep_raw ? "|raw" : "");
            amqp_state->wanted.push_back(std::move(w));
        });
    }
}

// Subscriptions gone or changed leave the consumer; new ones join it (consumed from their
// stored offsets, set next).
void apply_wanted() {
    call_cpp([] {
        AmqpState* st = amqp_state;
        std::vector<AmqpSub*> keep;
        for (AmqpSub* s : st->subs) {
            bool still = false;
            for (const AmqpWanted& w : st->wanted)
                still |= w.name == s->sub.name && w.settings == s->settings;
            if (still) {
                keep.push_back(s);
                continue;
            }
            st->consumer->remove(s->id);
            delete s;
        }
        st->subs = std::move(keep);
        for (const AmqpWanted& w : st->wanted) {
            bool running = false;
            for (AmqpSub* s : st->subs) running |= s->sub.name == w.name;
            if (running) continue;
            auto* s = new AmqpSub();
            s->sub.name = w.name;
            s->settings = w.settings;
            s->sub.options.message_id_field = w.message_id_field;
            s->sub.options.id_rule = w.id_rule;
            s->sub.options.keep_raw = w.keep_raw;
            s->sub.batch_size = static_cast<std::size_t>(w.batch_size);
            s->sub.fresh = true;
            amqp::ConsumerSubscription config;
            config.name = w.name;
            config.queues = w.queues;
            config.prefetch = w.batch_size;
            config.start_first = w.start_first;
            s->id = st->consumer->add(config);
            st->subs.push_back(s);
        }
        for (AmqpSub* s : st->subs)
            s->sub.options.max_message_bytes = static_cast<std::size_t>(guc::max_message_bytes);
    });
}

// The stored offsets of this worker's AMQP subscriptions. A new subscription starts from them;
// a running one whose offset was moved (eventbox.replay) is consumed again from there.
void apply_stored_offsets() {
    int rc = SPI_execute(
        "SELECT o.subscription, o.topic, o.next_offset FROM eventbox.offsets o "
        "JOIN eventbox.subscriptions s ON s.name = o.subscription "
        "WHERE s.source = 'amqp' AND o.\"partition\" = 0",
        true, 0);
    if (rc != SPI_OK_SELECT) elog(ERROR, "eventbox ingest: reading offsets failed");
    int64 now = worker::now_ms();
    for (uint64 i = 0; i < SPI_processed; ++i) {
        HeapTuple tuple = SPI_tuptable->vals[i];
        TupleDesc desc = SPI_tuptable->tupdesc;
        bool isnull;
        const char* name = text_at(tuple, desc, 1);
        const char* queue = text_at(tuple, desc, 2);
        int64 next = DatumGetInt64(SPI_getbinval(tuple, desc, 3, &isnull));
        bool moved = call_cpp([&] {
            for (AmqpSub* s : amqp_state->subs) {
                if (s->sub.name != name) continue;
                auto it = s->next.find(queue);
                bool changed = !s->sub.fresh && (it == s->next.end() || it->second != next);
                s->next[queue] = next;
                amqp_state->consumer->set_next_offset(s->id, queue, next);
                if (changed) amqp_state->consumer->restart(s->id, 0, now);
                return changed;
            }
            return false;
        });
        if (moved)
            log_subscription(
                "eventbox ingest: subscription \"%s\" continues from its changed "
                "stored offsets%s",
                name, "");
    }
    call_cpp([] {
        for (AmqpSub* s : amqp_state->subs) s->sub.fresh = false;
    });
}

// Why the wanted subscriptions cannot be consumed with these settings ("" = they can): an
// empty URL, or settings that do not parse (the reason names a key, never a value).
std::string refusal(const char* url, const char* options, amqp::Settings* settings) {
    if (url[0] == '\0')
        return "RabbitMQ is not configured: eventbox.amqp_url is empty (set it and reload the "
               "configuration)";
    try {
        amqp::parse_url(url, *settings);
        amqp::parse_options(options, *settings);
    } catch (const Error& e) {
        return std::string("RabbitMQ is not configured: ") + e.what() +
               " (fix eventbox.amqp_options and restart the server, or eventbox.amqp_url and "
               "reload)";
    }
    return std::string();
}

}  // namespace

std::size_t amqp_reload(int64) {
    if (amqp_state == nullptr) amqp_state = call_cpp([] { return new AmqpState(); });
    read_wanted();
    const char* url = guc::amqp_url ? guc::amqp_url : "";
    const char* options = guc::amqp_options ? guc::amqp_options : "";
    char why[512] = "";
    bool none = call_cpp([&] {
        AmqpState* st = amqp_state;
        std::string fingerprint = std::string(url) + "\n" + options;
        if (st->wanted.empty() || url[0] == '\0' || fingerprint != st->fingerprint) drop_all(st);
        st->fingerprint = fingerprint;
        st->refused.clear();
        if (st->wanted.empty()) return true;
        if (st->consumer != nullptr) return false;
        amqp::Settings settings;
        st->refused = refusal(url, options, &settings);
        if (!st->refused.empty()) {
            snprintf(why, sizeof why, "%s", st->refused.c_str());
            return true;
        }
        st->consumer = new amqp::Consumer(std::move(settings));
        return false;
    });
    if (why[0] != '\0')
        ereport(LOG, (errmsg("eventbox ingest: subscriptions with source 'amqp' wait: %s", why),
                      errhint("eventbox.subscription_errors lists them with this reason.")));
    record_refused();
    if (none) return 0;
    apply_wanted();
    apply_stored_offsets();
    return call_cpp([] { return amqp_state->subs.size(); });
}

void amqp_destroy() noexcept {
    if (amqp_state == nullptr) return;
    drop_all(amqp_state);
    delete amqp_state;
    amqp_state = nullptr;
}

int amqp_fd() {
    return amqp_state == nullptr || amqp_state->consumer == nullptr ? -1
                                                                    : amqp_state->consumer->fd();
}

bool amqp_buffered() {
    return amqp_state != nullptr && amqp_state->consumer != nullptr &&
           amqp_state->consumer->buffered();
}

}  // namespace eventbox::ingest
