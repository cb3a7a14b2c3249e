// A RabbitMQ subscription's batch: classified as Kafka records are, stored in one transaction,
// acknowledged after its commit (see inbox/ingest_amqp.hpp).
#include "inbox/ingest_amqp.hpp"

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
#include <vector>

#include "inbox/jsonb.hpp"
#include "metrics/counters.hpp"
#include "pg/boundary.hpp"
#include "pg/guc.hpp"
#include "pg/shmem.hpp"

namespace eventbox::ingest {

using pg::call_cpp;
using namespace amqp_sub;

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
        order_rows(&sub, n);
    });
}

// The batch's rows as the insert's columns, in message id order (those a rule skips left out).
void build(AmqpSub* s, const std::vector<amqp::Delivery>& batch, Columns* c) {
    ColumnBuilder builder(&s->sub, c);
    for (int i = 0; i < c->count; ++i) {
        auto k = static_cast<std::size_t>(s->sub.order[i]);
        const amqp::Delivery& d = batch[k];
        amqp_context.topic = d.queue.c_str();
        amqp_context.partition = 0;
        RecordBytes r;
        r.topic = d.queue.data();
        r.topic_len = d.queue.size();
        r.offset = s->offsets[k];
        if (!d.routing_key.empty()) {
            r.key = d.routing_key.data();
            r.key_len = d.routing_key.size();
        }
        r.value = d.body.data();
        r.value_len = d.body.size();
        builder.add(i, r, s->sub.rows[k]);
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
    Columns columns(static_cast<int>(s->sub.order.size()));
    columns.records = static_cast<int>(batch->size());
    build(s, *batch, &columns);
    Inserted done = store_rows(&s->sub, columns, Below{amqp_below, s});
    if (done.rows > 0 && s->below) stored_below(&s->sub, columns);
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
    uint64 duplicates = static_cast<uint64>(columns.count) - done.rows;
    shmem::count_duplicates(duplicates);
    metrics::ingested(s->sub.name.c_str(), n, duplicates,
                      static_cast<uint64>(columns.transport_ids),
                      static_cast<uint64>(columns.unparsable_rows), s->sub.skipped);
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

}  // namespace

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
