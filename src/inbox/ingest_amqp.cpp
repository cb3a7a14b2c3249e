// The ingest worker's RabbitMQ subscriptions (source 'amqp'): their queues and streams consumed
// by one amqp::Consumer, each subscription's deliveries stored through the same rows as Kafka
// records (store_rows()), with their lanes' offsets (topic = the queue, partition 0), in one
// transaction; acknowledged only after it committed (see docs/design/ingest.md).
//
// A subscription is consumed by one worker: the one its name hashes to among
// eventbox.ingest_workers. Offsets: a stream's delivery carries its offset (x-stream-offset);
// a plain queue's deliveries are numbered by the worker from the queue's stored next offset, so
// that the inbox's lanes stay ordered. A batch that cannot be stored is rolled back, its
// deliveries go back to the queue (the channel is closed) and are read again after a backoff.
#include "inbox/ingest.hpp"

extern "C" {
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
}

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "amqp/consumer.hpp"
#include "core/error.hpp"
#include "inbox/jsonb.hpp"
#include "metrics/counters.hpp"
#include "pg/arrays.hpp"
#include "pg/boundary.hpp"
#include "pg/guc.hpp"
#include "pg/shmem.hpp"

namespace eventbox::ingest {

using pg::call_cpp;

namespace {

constexpr int64_t kRetryMinMs = 1000;
constexpr int64_t kRetryMaxMs = 60000;

struct AmqpSub {
    Subscription sub;
    std::string settings;  // what it was added with: queues, start, batch size, id rules
    int id = 0;            // in the consumer
    std::map<std::string, int64_t> next;     // per queue: the stored next offset
    std::map<std::string, int64_t> highest;  // per queue: the highest next this process stored
    std::vector<int64_t> offsets;            // of the current batch's deliveries
    std::vector<kafka::PartitionEnd> ends;   // of the current batch
    bool below = false;                      // the batch stores below `highest` somewhere
    int64_t redelivered = 0;
    int64_t retry_ms = 0;
    std::string logged_error;
};

struct Wanted {
    std::string name, settings, message_id_field;
    std::vector<std::string> queues;
    bool start_first;
    inbox::IdRule id_rule;  // message_id_rule
    bool keep_raw;          // inbox::keeps_raw() of its options
    int batch_size;
};

struct AmqpState {
    amqp::Consumer* consumer = nullptr;
    std::string fingerprint;  // eventbox.amqp_url and amqp_options it was built with
    std::vector<AmqpSub*> subs;
    std::vector<Wanted> wanted;
    std::string logged_error;
};

AmqpState* amqp_state = nullptr;

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

char* text_at(HeapTuple tuple, TupleDesc desc, int column) {
    bool isnull;
    Datum d = SPI_getbinval(tuple, desc, column, &isnull);
    return isnull ? pstrdup("") : TextDatumGetCString(d);
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
            Wanted w;
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
            for (const Wanted& w : st->wanted)
                still |= w.name == s->sub.name && w.settings == s->settings;
            if (still) {
                keep.push_back(s);
                continue;
            }
            st->consumer->remove(s->id);
            delete s;
        }
        st->subs = std::move(keep);
        for (const Wanted& w : st->wanted) {
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
        if (st->wanted.empty()) return true;
        if (url[0] == '\0') {
            snprintf(why, sizeof why, "eventbox.amqp_url is empty");
            return true;
        }
        if (st->consumer != nullptr) return false;
        amqp::Settings settings;
        try {
            amqp::parse_url(url, settings);
            amqp::parse_options(options, settings);
        } catch (const Error& e) {
            snprintf(why, sizeof why, "%s", e.what());
            return true;
        }
        st->consumer = new amqp::Consumer(std::move(settings));
        return false;
    });
    if (why[0] != '\0')
        ereport(LOG, (errmsg("eventbox ingest: subscriptions with source 'amqp' wait: %s", why),
                      errhint("Set eventbox.amqp_url (and eventbox.amqp_options) to a RabbitMQ "
                              "node.")));
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

namespace {

worker::WorkContext amqp_context;

// Classifies the batch's deliveries (message ids, event types, headers, payloads) into
// s->sub.rows, numbers a plain queue's deliveries from its next offset, and collects the lanes'
// ends. C++ side.
void classify(AmqpSub* s, const std::vector<amqp::Delivery>& batch) {
    call_cpp([&] {
        std::size_t n = batch.size();
        Subscription& sub = s->sub;
        if (sub.rows.size() < n) sub.rows.resize(n);
        s->offsets.resize(n);
        s->ends.clear();
        s->below = false;
        s->redelivered = 0;
        std::map<std::string, std::size_t> lane;  // queue -> index in ends
        std::vector<inbox::KafkaHeader> headers;
        for (std::size_t i = 0; i < n; ++i) {
            const amqp::Delivery& d = batch[i];
            auto found = lane.find(d.queue);
            if (found == lane.end()) {
                kafka::PartitionEnd end;
                end.topic = d.queue;
                end.partition = 0;
                auto stored = s->next.find(d.queue);
                end.previous = stored == s->next.end() ? -1 : stored->second;
                end.next_offset = std::max<int64_t>(end.previous, 0);
                end.high_watermark = -1;
                end.backfill_until = -1;
                found = lane.emplace(d.queue, s->ends.size()).first;
                s->ends.push_back(end);
            }
            kafka::PartitionEnd& end = s->ends[found->second];
            int64_t offset = d.stream_offset >= 0 ? d.stream_offset : end.next_offset;
            s->offsets[i] = offset;
            end.next_offset = std::max(end.next_offset, offset + 1);
            auto high = s->highest.find(d.queue);
            if (d.redelivered || (high != s->highest.end() && offset < high->second))
                s->below = true;
            s->redelivered += d.redelivered ? 1 : 0;
            amqp::record_headers(d, headers);
            inbox::Record record;
            record.topic = d.queue;
            record.partition = 0;
            record.offset = offset;
            record.value = d.body.data();
            record.value_len = d.body.size();
            record.headers = headers.data();
            record.n_headers = headers.size();
            inbox::classify(record, sub.options, sub.rows[i]);
        }
        // By message id, as the Kafka batches (no deadlock between workers storing copies).
        sub.order.resize(n);
        for (std::size_t k = 0; k < n; ++k) sub.order[k] = static_cast<int>(k);
        std::stable_sort(sub.order.begin(), sub.order.end(), [&](int a, int b) {
            return sub.rows[a].message_id < sub.rows[b].message_id;
        });
    });
}

bytea* to_bytea(const void* data, std::size_t len) {
    auto* b = static_cast<bytea*>(palloc(VARHDRSZ + len));
    SET_VARSIZE(b, VARHDRSZ + len);
    if (len > 0) memcpy(VARDATA(b), data, len);
    return b;
}

// The batch's rows as the insert's columns, in message id order.
void build(AmqpSub* s, const std::vector<amqp::Delivery>& batch, Columns* c) {
    Datum received = CStringGetTextDatum("received");
    Datum unparsable = CStringGetTextDatum("unparsable");
    for (int i = 0; i < c->count; ++i) {
        int k = s->sub.order[i];
        const amqp::Delivery& d = batch[static_cast<std::size_t>(k)];
        inbox::Classified& row = s->sub.rows[static_cast<std::size_t>(k)];
        amqp_context.topic = d.queue.c_str();
        amqp_context.partition = 0;
        c->ids.set(i, PointerGetDatum(
                          cstring_to_text_with_len(row.message_id.data(), row.message_id.size())));
        c->transport_ids += row.transport_id ? 1 : 0;
        c->topics.set(i, PointerGetDatum(cstring_to_text_with_len(d.queue.data(), d.queue.size())));
        c->partitions.set(i, Int32GetDatum(0));
        c->offsets.set(i, Int64GetDatum(s->offsets[static_cast<std::size_t>(k)]));
        if (!d.routing_key.empty())
            c->keys.set(i, PointerGetDatum(to_bytea(d.routing_key.data(), d.routing_key.size())));
        c->headers.set(i, inbox::headers_jsonb(row));
        Datum payload;
        if (row.parsable &&
            inbox::payload_jsonb(row, d.body.data(), d.body.size(), &payload, &row.note)) {
            c->payloads.set(i, payload);
            if (s->sub.options.keep_raw)  // the bytes too (inbox::keeps_raw())
                c->raws.set(i, PointerGetDatum(to_bytea(d.body.data(), d.body.size())));
        } else {
            if (row.parsable) row.raw_len = d.body.size();  // jsonb refused what looked like JSON
            row.parsable = false;
            if (!row.raw_null)
                c->raws.set(i, PointerGetDatum(to_bytea(d.body.data(), row.raw_len)));
            c->notes.set(i, CStringGetTextDatum(row.note.c_str()));
        }
        if (row.event_type)
            c->types.set(i, PointerGetDatum(cstring_to_text_with_len(row.event_type->data(),
                                                                     row.event_type->size())));
        c->statuses.set(i, row.parsable ? received : unparsable);
        if (!row.parsable) c->unparsable_ids.set(c->unparsable_rows++, c->ids.value(i));
    }
}

bool amqp_below(const void* arg) {
    return static_cast<const AmqpSub*>(arg)->below;
}

// Stores the subscription's batch in one transaction, then acknowledges it.
void store(AmqpSub* s) {
    const std::vector<amqp::Delivery>* batch =
        call_cpp([&] { return &amqp_state->consumer->batch(s->id); });
    classify(s, *batch);
    worker::begin_work(kWho);
    Columns columns(static_cast<int>(batch->size()));
    build(s, *batch, &columns);
    Inserted done = store_rows(&s->sub, columns, Below{amqp_below, s});
    if (done.rows > 0 && s->below) shmem::inbox_requeued_at_commit();
    bool moved = store_lane_offsets(&s->sub, s->ends);
    worker::end_work();
    // The worker commits asynchronously (Kafka is read again from the stored offsets after a
    // lost commit); a queue forgets what was acknowledged, so the commit is flushed first.
    XLogFlush(XactLastCommitEnd);
    rows_committed(&s->sub);
    // Committed: only now are the deliveries acknowledged (a crash before redelivers them).
    uint64 n = batch->size();
    call_cpp([&] {
        amqp_state->consumer->ack_batch(s->id);
        for (const kafka::PartitionEnd& end : s->ends) {
            s->next[end.topic] = end.next_offset;
            amqp_state->consumer->set_next_offset(s->id, end.topic, end.next_offset);
            int64_t& high = s->highest[end.topic];
            high = std::max(high, end.next_offset);
        }
        s->retry_ms = 0;
        s->sub.recovered();
    });
    if (moved) needs_reload = true;  // eventbox.replay moved an offset: continue from the table's
    if (done.rows > 0) shmem::inbox_stored(s->sub.name.c_str());
    pgstat_report_stat(false);
    shmem::count_messages(n);
    shmem::count_transport_ids(static_cast<uint64>(columns.transport_ids));
    shmem::count_duplicates(n - done.rows);
    metrics::ingested(s->sub.name.c_str(), n, n - done.rows,
                      static_cast<uint64>(columns.transport_ids),
                      static_cast<uint64>(columns.unparsable_rows), 0);
    metrics::ingest_conflicts(s->sub.name.c_str(), done.conflicts);
    metrics::ingest_redelivered(s->sub.name.c_str(), static_cast<uint64>(s->redelivered));
    shmem::wake_handlers();
}

// store(), an ERROR rolled back for this subscription alone: its deliveries go back to their
// queues (the channel is closed) and are consumed again after a backoff.
void store_isolated(AmqpSub* s) {
    MemoryContext context = CurrentMemoryContext;
    amqp_context = worker::WorkContext{};
    amqp_context.who = kWho;
    amqp_context.subscription = s->sub.name.c_str();
    worker::push_work_context(&amqp_context);
    PG_TRY();
    { store(s); }
    PG_CATCH();
    {
        MemoryContextSwitchTo(TopMemoryContext);
        ErrorData* edata = CopyErrorData();
        FlushErrorState();
        AbortCurrentTransaction();
        MemoryContextSwitchTo(context);
        MemoryContextReset(batch_context);
        const char* message = edata->message != nullptr ? edata->message : "unknown error";
        int64 delay = call_cpp([&] {
            int64_t now = worker::now_ms();
            s->retry_ms = std::clamp<int64_t>(s->retry_ms * 2, kRetryMinMs, kRetryMaxMs);
            s->sub.expect_new = false;
            s->sub.failing = true;
            s->sub.attempts += 1;
            s->sub.error = message;
            s->sub.retry_at_ms = now + s->retry_ms;
            amqp_state->consumer->restart(s->id, s->retry_ms, now);
            return s->retry_ms;
        });
        char* what = psprintf(": %s; consumed again in %lld ms", edata->message,
                              static_cast<long long>(delay));
        log_subscription("eventbox ingest: a batch of subscription \"%s\" failed%s",
                         s->sub.name.c_str(), what);
        FreeErrorData(edata);
    }
    PG_END_TRY();
    worker::pop_work_context(&amqp_context);
}

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

}  // namespace

int amqp_count_recorded() noexcept {
    if (amqp_state == nullptr) return 0;
    int n = 0;
    for (const AmqpSub* s : amqp_state->subs) n += s->sub.recorded.empty() ? 0 : 1;
    return n;
}

int amqp_recorded(const char** names, int max) {
    if (amqp_state == nullptr) return 0;
    int n = 0;
    for (const AmqpSub* s : amqp_state->subs)
        if (!s->sub.recorded.empty() && n < max) names[n++] = s->sub.name.c_str();
    return n;
}

bool amqp_turn() {
    if (amqp_state == nullptr || amqp_state->consumer == nullptr) return false;
    std::size_t max = 0;
    std::size_t n = call_cpp([&] {
        for (AmqpSub* s : amqp_state->subs) max += s->sub.batch_size;
        return amqp_state->consumer->poll(worker::now_ms(), std::max<std::size_t>(max, 1));
    });
    log_errors();
    for (std::size_t k = 0;; ++k) {
        AmqpSub* s = call_cpp([&]() -> AmqpSub* {
            if (k >= amqp_state->subs.size()) return nullptr;
            AmqpSub* sub = amqp_state->subs[k];
            return amqp_state->consumer->batch(sub->id).empty() ? nullptr : sub;
        });
        bool past_end = call_cpp([&] { return k >= amqp_state->subs.size(); });
        if (past_end) break;
        if (s == nullptr) continue;
        store_isolated(s);
        MemoryContextReset(batch_context);
        CHECK_FOR_INTERRUPTS();
    }
    record_amqp_errors();
    return n >= max || amqp_buffered();
}

}  // namespace eventbox::ingest
