// The ingest worker's store: each subscription's records of a poll, batch_size records per
// transaction (inbox rows, conflicting duplicates, the partitions' next offsets), a failing
// subscription rolled back alone (see inbox/ingest.hpp; the rows are built in ingest_columns.cpp).
#include "inbox/ingest.hpp"

extern "C" {
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
}

#include <algorithm>
#include <string>
#include <vector>

#include "handlers/dead_letters.hpp"
#include "handlers/low_water.hpp"
#include "metrics/counters.hpp"
#include "pg/arrays.hpp"
#include "pg/boundary.hpp"
#include "pg/shmem.hpp"

namespace eventbox::ingest {

using pg::call_cpp;

bool IngestState::has_positions_to_store(const Subscription* sub) const {
    return call_cpp([&] { return consumer_->has_positions_to_store(sub->id); });
}

namespace {

// What names the batch in the CONTEXT line of errors raised while it is stored: the
// subscription, the lane of the record being converted (then the batch's lane, when it has only
// one; see build_columns()), and the batch's number among those this process began.
worker::WorkContext store_context;
int64 batches_begun = 0;

// ---- the rows -------------------------------------------------------------------------------

// The inbox rows of a batch. unnest() in the select list: the rows stream from the arrays
// (ProjectSet); unnest() in FROM would first copy them all into a tuplestore (~12% of the
// statement at 1 KiB). The subscription row is locked KEY SHARE until the batch commits:
// drop_subscription() (which locks it FOR UPDATE) waits for a batch being stored, and a batch
// waits for a drop in progress and then finds the subscription gone. Checked with the
// statement's snapshot alone, a batch stored during an uncommitted drop committed rows after the
// drop had deleted the subscription's rows, and a subscription created again under that name
// took its messages for duplicates of those orphans.
// Index: inbox_pkey (each row's insertion, and ON CONFLICT's arbiter: one probe per row) and
// subscriptions_pkey (the lock).
#define INSERT_ROWS(MODE_COLUMN, MODE_VALUES)                                                     \
    "INSERT INTO eventbox.inbox (subscription, message_id, topic, \"partition\", \"offset\", "    \
    "key, headers, payload, raw_payload, event_type, status, last_error, key_payload" MODE_COLUMN \
    ") "                                                                                          \
    "SELECT $1, unnest($2::text[]), unnest($3::text[]), unnest($4::int4[]), "                     \
    "unnest($5::int8[]), unnest($6::bytea[]), unnest($7::jsonb[]), unnest($8::jsonb[]), "         \
    "unnest($9::bytea[]), unnest($10::text[]), unnest($11::text[]), "                             \
    "unnest($12::text[]), unnest($13::jsonb[])" MODE_VALUES                                       \
    " "                                                                                           \
    "WHERE EXISTS (SELECT 1 FROM eventbox.subscriptions s WHERE s.name = $1 FOR KEY SHARE)"
#define ON_CONFLICT " ON CONFLICT (subscription, message_id) DO NOTHING"

struct InsertPlans {
    SPIPlanPtr insert, insert_new, insert_modes, insert_new_modes;
};

InsertPlans insert_plans() {
    static InsertPlans plans{};
    if (plans.insert_new_modes != nullptr) return plans;  // prepared last
    Oid insert_types[13] = {TEXTOID,       TEXTARRAYOID,  TEXTARRAYOID,  INT4ARRAYOID,
                            INT8ARRAYOID,  BYTEAARRAYOID, JSONBARRAYOID, JSONBARRAYOID,
                            BYTEAARRAYOID, TEXTARRAYOID,  TEXTARRAYOID,  TEXTARRAYOID,
                            JSONBARRAYOID};
    plans.insert = prepare(INSERT_ROWS("", "") ON_CONFLICT, 13, insert_types);
    // A batch expected to hold only new messages (insert_new()): the same rows without ON
    // CONFLICT, which spares each row the arbiter's probe of inbox_pkey before its insertion and
    // the speculative insertion's extra WAL record (~30% of the statement at 200 B); inbox_pkey
    // still refuses a duplicate, at its insertion.
    plans.insert_new = prepare(INSERT_ROWS("", ""), 13, insert_types);
    // The same for a backfill subscription, with each row's mode ($14) (and the same lock).
    Oid insert_modes_types[14] = {TEXTOID,       TEXTARRAYOID,  TEXTARRAYOID,  INT4ARRAYOID,
                                  INT8ARRAYOID,  BYTEAARRAYOID, JSONBARRAYOID, JSONBARRAYOID,
                                  BYTEAARRAYOID, TEXTARRAYOID,  TEXTARRAYOID,  TEXTARRAYOID,
                                  JSONBARRAYOID, TEXTARRAYOID};
    plans.insert_modes =
        prepare(INSERT_ROWS(", mode", ", unnest($14::text[])") ON_CONFLICT, 14, insert_modes_types);
    plans.insert_new_modes =
        prepare(INSERT_ROWS(", mode", ", unnest($14::text[])"), 14, insert_modes_types);
    return plans;
}

#undef ON_CONFLICT
#undef INSERT_ROWS

// Inserts a batch with `plan` (the rows without ON CONFLICT) in a subtransaction; returns false,
// with the subtransaction rolled back, when inbox_pkey refused a row (a duplicate: the caller
// inserts the batch again with ON CONFLICT). Any other ERROR goes on up. `writer` gets the
// subtransaction's xid, the xmin of the rows it inserted.
//
// Most batches hold only new messages: the stored offsets advance with the rows in one
// transaction, so Kafka redelivers nothing stored. Duplicates come from a producer's retries or
// republishing, from eventbox.replay() and from the same id in several partitions. A batch is
// tried this way only after one without duplicates and when it stores no offset below what this
// process stored before: a run of duplicates from elsewhere pays one rolled-back attempt, not
// one per batch.
bool insert_new(SPIPlanPtr plan, Datum* values, uint64* inserted, TransactionId* writer) {
    volatile bool ok = true;
    worker::Subtransaction sub = worker::begin_subtransaction();
    PG_TRY();
    {
        worker::exec_kept(kWho, plan, values, false, SPI_OK_INSERT);
        *inserted = SPI_processed;
        *writer = GetCurrentTransactionIdIfAny();
        worker::end_subtransaction(sub, true);
    }
    PG_CATCH();
    {
        ErrorData* edata = worker::abort_subtransaction(sub);
        if (edata->sqlerrcode != ERRCODE_UNIQUE_VIOLATION) ReThrowError(edata);
        FreeErrorData(edata);
        ok = false;
    }
    PG_END_TRY();
    return ok;
}

// What storing a batch's rows did.
struct Inserted {
    uint64 rows = 0;       // inserted
    uint64 conflicts = 0;  // conflicting duplicates listed
};

// Inserts the rows: without ON CONFLICT when the batch is expected to hold only new messages,
// else (or when that found a duplicate) with it. `values` are the statement's 13 parameters.
uint64 insert_rows(Subscription* sub, const Columns& c, Datum* values,
                   rd_kafka_message_t* const* messages, TransactionId* writer) {
    InsertPlans plans = insert_plans();
    Datum mode_values[14];
    Datum* args = values;
    if (sub->backfill) {
        memcpy(mode_values, values, 13 * sizeof(Datum));
        mode_values[13] = c.modes.get();
        args = mode_values;
    }
    uint64 inserted = 0;
    // A batch below what this process stored in a lane (eventbox.replay(), a seek, the first one
    // after a start) goes straight to ON CONFLICT: it may hold only duplicates, and a refused
    // attempt would leave its rows' dead versions behind.
    if (!sub->expect_new || state.stores_below(sub, messages, c.count, false) ||
        !insert_new(sub->backfill ? plans.insert_new_modes : plans.insert_new, args, &inserted,
                    writer)) {
        worker::exec_kept(kWho, sub->backfill ? plans.insert_modes : plans.insert, args, false,
                          SPI_OK_INSERT);
        inserted = SPI_processed;
        *writer = GetCurrentTransactionIdIfAny();
    }
    sub->expect_new = inserted == static_cast<uint64>(c.count);
    return inserted;
}

// Conflicting duplicates, looked for only when the insert above left records out: those whose id
// is in the inbox under another transport identity (not the row this batch stored, not a
// redelivery of the stored record) with another payload. Each is listed once.
// Index: inbox_pkey, one probe per id (EVENTBOX_INBOX_BY_ID), and conflicts_pkey (the arbiter).
worker::KeptStatement conflicts_statement{
    "INSERT INTO eventbox.conflicts (subscription, message_id, stored_topic, "
    "stored_partition, stored_offset, topic, \"partition\", \"offset\") "
    "SELECT $1, x.message_id, x.topic, x.\"partition\", x.\"offset\", u.topic, u.p, u.o "
    "FROM (SELECT unnest($2::text[]) AS id, unnest($3::text[]) AS topic, "
    "unnest($4::int4[]) AS p, unnest($5::int8[]) AS o, unnest($6::jsonb[]) AS payload, "
    "unnest($7::bytea[]) AS raw) u "
    EVENTBOX_INBOX_BY_ID("x.message_id, x.topic, x.\"partition\", x.\"offset\", "
                         "x.payload, x.raw_payload", "")
    "WHERE (x.topic, x.\"partition\", x.\"offset\") IS DISTINCT FROM (u.topic, u.p, u.o) "
    "AND (x.payload IS DISTINCT FROM u.payload OR x.raw_payload IS DISTINCT FROM u.raw) "
    "ON CONFLICT DO NOTHING",
    7,
    {TEXTOID, TEXTARRAYOID, TEXTARRAYOID, INT4ARRAYOID, INT8ARRAYOID, JSONBARRAYOID,
     BYTEAARRAYOID},
    nullptr};

// Stores the batch's rows; the unparsable ones go to the dead-letter topic, if any, and
// conflicting duplicates to eventbox.conflicts.
Inserted store_rows(Subscription* sub, const Columns& c, rd_kafka_message_t* const* messages) {
    Inserted done;
    if (c.count == 0) return done;
    Datum name = CStringGetTextDatum(sub->name.c_str());
    Datum values[13] = {name,
                        c.ids.get(),
                        c.topics.get(),
                        c.partitions.get(),
                        c.offsets.get(),
                        c.keys.get(),
                        c.headers.get(),
                        c.payloads.get(),
                        c.raws.get(),
                        c.types.get(),
                        c.statuses.get(),
                        c.notes.get(),
                        c.key_payloads.get()};
    TransactionId writer = InvalidTransactionId;  // the xmin of the rows inserted now
    done.rows = insert_rows(sub, c, values, messages, &writer);
    // The subscription's dead-letter topic, if any, gets the unparsable rows stored now.
    if (c.unparsable_rows > 0 && done.rows > 0)
        handlers::dead_letters::after_unparsable(name, c.unparsable_ids.get(c.unparsable_rows),
                                                 writer);
    // Only a batch with duplicates pays for comparing them with the stored rows.
    if (done.rows < static_cast<uint64>(c.count)) {
        Datum conflict_values[7] = {name,      values[1], values[2], values[3],
                                    values[4], values[7], values[8]};
        worker::exec_kept(kWho, conflicts_statement, conflict_values, false, SPI_OK_INSERT);
        done.conflicts = SPI_processed;
    }
    return done;
}

}  // namespace

bool IngestState::stores_below(const Subscription* sub, rd_kafka_message_t* const* messages, int n,
                               bool record) {
    return call_cpp([&] {
        if (stored_offsets_ == nullptr) stored_offsets_ = new handlers::StoredOffsets();
        bool below = false;
        for (int k = 0; k < n;) {
            rd_kafka_message_t* first = messages[k];
            int last = k;
            while (last + 1 < n && messages[last + 1]->rkt == first->rkt &&
                   messages[last + 1]->partition == first->partition)
                ++last;
            const char* topic = rd_kafka_topic_name(first->rkt);
            below |=
                record ? stored_offsets_->store(sub->name, topic, first->partition, first->offset,
                                                messages[last]->offset)
                       : stored_offsets_->below(sub->name, topic, first->partition, first->offset);
            k = last + 1;
        }
        return below;
    });
}

// ---- the offsets ----------------------------------------------------------------------------

const std::vector<kafka::PartitionEnd>& IngestState::partition_ends(const Subscription* sub,
                                                                    std::size_t from,
                                                                    std::size_t to) {
    return *call_cpp([&] { return &consumer_->partition_ends(sub->id, from, to); });
}

void IngestState::committed(const Subscription* sub) {
    call_cpp([&] { consumer_->committed(sub->id); });
}

namespace {

// Compare-and-set: a stored offset someone else moved (eventbox.replay) is left alone, and the
// worker notices from the row count and moves the subscription to the table's offsets.
// backfill_until ($7) is written once, with the partition's first row.
// Index: offsets_pkey (the arbiter, one probe per lane) and subscriptions_pkey (the lock).
worker::KeptStatement offsets_statement{
    "INSERT INTO eventbox.offsets AS o (subscription, topic, \"partition\", next_offset, "
    "high_watermark, backfill_until) "
    "SELECT $1, u.topic, u.p, u.next, u.high, u.until "
    "FROM unnest($2::text[], $3::int4[], $4::int8[], $5::int8[], $6::int8[], $7::int8[]) "
    "AS u(topic, p, next, high, previous, until) "
    "WHERE EXISTS (SELECT 1 FROM eventbox.subscriptions s WHERE s.name = $1 FOR KEY SHARE) "
    "ON CONFLICT (subscription, topic, \"partition\") DO UPDATE SET "
    "next_offset = excluded.next_offset, high_watermark = excluded.high_watermark, "
    "backfill_until = coalesce(o.backfill_until, excluded.backfill_until), "
    "updated_at = now() "
    "WHERE o.next_offset IS NOT DISTINCT FROM (SELECT u2.previous FROM unnest($2::text[], "
    "$3::int4[], $6::int8[]) AS u2(topic, p, previous) "
    "WHERE u2.topic = excluded.topic AND u2.p = excluded.\"partition\")",
    7,
    {TEXTOID, TEXTARRAYOID, INT4ARRAYOID, INT8ARRAYOID, INT8ARRAYOID, INT8ARRAYOID, INT8ARRAYOID},
    nullptr};

// Stores the next offsets of the lanes of records [from, to) (and the positions to store);
// returns whether one was moved under us (eventbox.replay).
bool store_offsets(const Subscription* sub, std::size_t from, std::size_t to) {
    const std::vector<kafka::PartitionEnd>& ends = state.partition_ends(sub, from, to);
    int m = static_cast<int>(ends.size());
    pg::ArrayColumn end_topics(m, TEXTOID), end_partitions(m, INT4OID), end_offsets(m, INT8OID),
        end_high(m, INT8OID), end_previous(m, INT8OID), end_until(m, INT8OID);
    for (int i = 0; i < m; ++i) {
        const kafka::PartitionEnd& end = ends[i];
        end_topics.set(i, CStringGetTextDatum(end.topic.c_str()));
        end_partitions.set(i, Int32GetDatum(end.partition));
        end_offsets.set(i, Int64GetDatum(end.next_offset));
        if (end.high_watermark >= 0) end_high.set(i, Int64GetDatum(end.high_watermark));
        if (end.previous >= 0) end_previous.set(i, Int64GetDatum(end.previous));
        if (end.backfill_until >= 0) end_until.set(i, Int64GetDatum(end.backfill_until));
    }
    Datum offset_values[7] = {CStringGetTextDatum(sub->name.c_str()),
                              end_topics.get(),
                              end_partitions.get(),
                              end_offsets.get(),
                              end_high.get(),
                              end_previous.get(),
                              end_until.get()};
    worker::exec_kept(kWho, offsets_statement, offset_values, false, SPI_OK_INSERT);
    return SPI_processed < static_cast<uint64>(m);
}

// ---- a batch --------------------------------------------------------------------------------

// After the batch committed: the consumer, the counters and the handler workers learn of it.
void after_commit(Subscription* sub, std::size_t n, const Columns& c, const Inserted& done,
                  bool moved) {
    // Right after the commit: a handler worker that read the count before its pass saw these
    // rows (handlers/quiet.hpp).
    if (done.rows > 0) shmem::inbox_stored(sub->name.c_str());
    pgstat_report_stat(false);  // lets autovacuum and autoanalyze see the inbox
    state.committed(sub);
    if (moved) {
        // A stored offset was moved under us (eventbox.replay): continue from the table's.
        needs_reload = true;
    }
    shmem::count_messages(n);
    shmem::count_transport_ids(static_cast<uint64>(c.transport_ids));
    shmem::count_duplicates(n - done.rows);
    metrics::ingested(sub->name.c_str(), n, n - done.rows, static_cast<uint64>(c.transport_ids),
                      static_cast<uint64>(c.unparsable_rows));
    metrics::ingest_conflicts(sub->name.c_str(), done.conflicts);
    shmem::wake_handlers();
}

// Stores records [from, to) of `sub`'s batch (and the positions to store) in one transaction;
// returns how many: fewer when a record waits for its schema (it and those after it are not).
std::size_t store_batch(Subscription* sub, std::size_t from, std::size_t to) {
    store_context.batch = ++batches_begun;
    store_context.topic = nullptr;
    store_context.partition = -1;
    std::size_t ready = state.classify(sub, from, to);
    if (ready == 0 && to > from) return 0;
    to = from + ready;
    rd_kafka_message_t* const* messages = state.records(sub, from);
    worker::begin_work(kWho);
    Columns columns(static_cast<int>(to - from));
    build_columns(sub, messages, &columns, &store_context);
    Inserted done = store_rows(sub, columns, messages);
    if (done.rows > 0 && state.stores_below(sub, messages, columns.count, true))
        shmem::inbox_requeued_at_commit();
    bool moved = store_offsets(sub, from, to);
    worker::end_work();
    after_commit(sub, to - from, columns, done, moved);
    return ready;
}

// Stores `sub`'s records of the last poll, batch_size records per transaction; returns how many.
std::size_t store(Subscription* sub) {
    std::size_t total = state.batch_size(sub);
    bool pinned = state.has_positions_to_store(sub);
    if (total == 0 && !pinned) return 0;
    std::size_t from = 0;
    do {
        std::size_t to = Min(from + sub->batch_size, total);
        std::size_t stored = store_batch(sub, from, to);
        MemoryContextReset(batch_context);
        if (stored < to - from) {
            // A record waits for its schema: the subscription pauses until it is cached.
            state.wait_for_schema(sub);
            return from + stored;
        }
        from = to;
    } while (from < total);
    return total;
}

// Stores `sub`'s records; an ERROR is rolled back and recorded on `sub` alone. Returns false
// when the batch failed. Errors raised meanwhile, and the line logging a failed batch, name the
// batch in their CONTEXT line.
bool store_isolated(Subscription* sub, std::size_t* stored) {
    MemoryContext context = CurrentMemoryContext;
    volatile bool ok = true;
    store_context = worker::WorkContext{};
    store_context.who = kWho;
    store_context.subscription = sub->name.c_str();
    worker::push_work_context(&store_context);
    PG_TRY();
    { *stored = store(sub); }
    PG_CATCH();
    {
        // As a worker's top-level handler does, but for this subscription only.
        MemoryContextSwitchTo(TopMemoryContext);
        ErrorData* edata = CopyErrorData();
        FlushErrorState();
        AbortCurrentTransaction();
        MemoryContextSwitchTo(context);
        MemoryContextReset(batch_context);
        subscription_failed(sub, edata->message);
        FreeErrorData(edata);
        ok = false;
    }
    PG_END_TRY();
    worker::pop_work_context(&store_context);
    return ok;
}

}  // namespace

// A subscription that failed is well again once it stores records, or stays quiet for a while
// after resuming.
constexpr int64_t kQuietAfterResumeMs = 5000;

bool store_all() {
    bool worked = false;
    int64 now = worker::now_ms();
    for (std::size_t i = 0; i < state.count(); ++i) {
        Subscription* sub = state.at(i);
        std::size_t stored = 0;
        if (store_isolated(sub, &stored)) {
            if (stored > 0) worked = true;
            if (sub->failing && !state.paused(sub) &&
                (stored > 0 || now - sub->resumed_at_ms >= kQuietAfterResumeMs))
                sub->recovered();
        }
        MemoryContextReset(batch_context);
        CHECK_FOR_INTERRUPTS();
    }
    return worked;
}

}  // namespace eventbox::ingest
