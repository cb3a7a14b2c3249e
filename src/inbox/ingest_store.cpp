// The ingest worker's store: each subscription's records of a poll, batch_size records per
// transaction (inbox rows, conflicting duplicates, the partitions' next offsets), a failing
// subscription rolled back alone (see inbox/ingest.hpp; the rows are built in ingest_columns.cpp).
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
#include <string>
#include <string_view>
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
#define INSERT_ROWS(MODE_COLUMN, MODE_VALUES)                                                  \
    "INSERT INTO eventbox.inbox (subscription, message_id, topic, \"partition\", \"offset\", " \
    "key, headers, payload, raw_payload, event_type, status, last_error, key_payload, "        \
    "raw_headers" MODE_COLUMN                                                                  \
    ") "                                                                                       \
    "SELECT $1, unnest($2::text[]), unnest($3::text[]), unnest($4::int4[]), "                  \
    "unnest($5::int8[]), unnest($6::bytea[]), unnest($7::jsonb[]), unnest($8::jsonb[]), "      \
    "unnest($9::bytea[]), unnest($10::text[]), unnest($11::text[]), "                          \
    "unnest($12::text[]), unnest($13::jsonb[]), unnest($14::bytea[])" MODE_VALUES              \
    " "                                                                                        \
    "WHERE EXISTS (SELECT 1 FROM eventbox.subscriptions s WHERE s.name = $1 FOR KEY SHARE)"
#define ON_CONFLICT " ON CONFLICT (subscription, message_id) DO NOTHING"

struct InsertPlans {
    SPIPlanPtr insert, insert_new, insert_modes, insert_new_modes;
};

InsertPlans insert_plans() {
    static InsertPlans plans{};
    if (plans.insert_new_modes != nullptr) return plans;  // prepared last
    Oid insert_types[14] = {TEXTOID,       TEXTARRAYOID,  TEXTARRAYOID,  INT4ARRAYOID,
                            INT8ARRAYOID,  BYTEAARRAYOID, JSONBARRAYOID, JSONBARRAYOID,
                            BYTEAARRAYOID, TEXTARRAYOID,  TEXTARRAYOID,  TEXTARRAYOID,
                            JSONBARRAYOID, BYTEAARRAYOID};
    plans.insert = prepare(INSERT_ROWS("", "") ON_CONFLICT, 14, insert_types);
    // A batch expected to hold only new messages (insert_new()): the same rows without ON
    // CONFLICT, which spares each row the arbiter's probe of inbox_pkey before its insertion and
    // the speculative insertion's extra WAL record (~30% of the statement at 200 B); inbox_pkey
    // still refuses a duplicate, at its insertion.
    plans.insert_new = prepare(INSERT_ROWS("", ""), 14, insert_types);
    // The same for a backfill subscription, with each row's mode ($15) (and the same lock).
    Oid insert_modes_types[15] = {TEXTOID,       TEXTARRAYOID,  TEXTARRAYOID,  INT4ARRAYOID,
                                  INT8ARRAYOID,  BYTEAARRAYOID, JSONBARRAYOID, JSONBARRAYOID,
                                  BYTEAARRAYOID, TEXTARRAYOID,  TEXTARRAYOID,  TEXTARRAYOID,
                                  JSONBARRAYOID, BYTEAARRAYOID, TEXTARRAYOID};
    plans.insert_modes =
        prepare(INSERT_ROWS(", mode", ", unnest($15::text[])") ON_CONFLICT, 15, insert_modes_types);
    plans.insert_new_modes =
        prepare(INSERT_ROWS(", mode", ", unnest($15::text[])"), 15, insert_modes_types);
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

// The old way, for a batch not expected to hold only new messages and foreseen duplicates (below
// what this process stored in a lane, after a batch with unforeseen duplicates, unparsable rows
// with ids stored before) and when the fast way found an unforeseen duplicate: every row with ON
// CONFLICT, then every row compared with the stored one. `values` are the statement's 14
// parameters (15 with the modes).
uint64 insert_all(Subscription* sub, Datum* values, TransactionId* writer) {
    InsertPlans plans = insert_plans();
    worker::exec_kept(kWho, sub->backfill ? plans.insert_modes : plans.insert, values, false,
                      SPI_OK_INSERT);
    *writer = GetCurrentTransactionIdIfAny();
    return SPI_processed;
}

// The statement's parameters for the rows `rows[0..n)` of `c` (all of them when rows is null).
void row_values(const Subscription* sub, const Columns& c, Datum name, const int* rows, int n,
                Datum* values) {
    const pg::ArrayColumn* columns[15] = {
        nullptr,     &c.ids,     &c.topics,       &c.partitions,  &c.offsets,
        &c.keys,     &c.headers, &c.payloads,     &c.raws,        &c.types,
        &c.statuses, &c.notes,   &c.key_payloads, &c.raw_headers, &c.modes};
    values[0] = name;
    for (int k = 1; k < (sub->backfill ? 15 : 14); ++k)
        values[k] = rows == nullptr ? columns[k]->get() : columns[k]->get_rows(rows, n);
}

// Whether two rows' values are the same bytes: then a repeat is no conflict with its first
// (what conflicts_statement compares: the jsonb, or the raw bytes of a value without one; jsonb
// the same bytes is the same jsonb, other bytes may still be equal jsonb: compared there).
bool same_datum(const pg::ArrayColumn& col, int a, int b) {
    bool na = col.null(a), nb = col.null(b);
    if (na || nb) return na && nb;
    Datum x = col.value(a), y = col.value(b);
    Size lx = VARSIZE_ANY_EXHDR(DatumGetPointer(x)), ly = VARSIZE_ANY_EXHDR(DatumGetPointer(y));
    return lx == ly &&
           memcmp(VARDATA_ANY(DatumGetPointer(x)), VARDATA_ANY(DatumGetPointer(y)), lx) == 0;
}

bool same_value(const Columns& c, int a, int b) {
    if (!same_datum(c.payloads, a, b)) return false;
    return !c.payloads.null(a) || same_datum(c.raws, a, b);
}

// How a batch's rows go in. Rows are in message-id order, so a record sent again within the
// batch (a producer's retry) follows the first of its id.
struct Split {
    int* fresh;  // the first row of each id not stored recently: inserted without ON CONFLICT
    int* known;  // rows whose id this subscription's last batches stored: with ON CONFLICT
    int* check;  // repeats whose value is not the same bytes as their first's: compared after
    int n_fresh = 0, n_known = 0, n_check = 0;
    int repeats = 0;  // repeats of a fresh row with the same value: not inserted, no conflict
};

// Splits the rows of `c`; their ids become `sub`'s recent ids once the batch commits.
void split_rows(Subscription* sub, const Columns& c, bool cdc, Split* out) {
    int n = c.count;
    uint64_t* hashes = static_cast<uint64_t*>(palloc(sizeof(uint64_t) * n));
    uint64_t* lanes = static_cast<uint64_t*>(palloc(sizeof(uint64_t) * n));
    int* first = static_cast<int*>(palloc(sizeof(int) * n));  // first row of the row's id
    for (int i = 0; i < n; ++i) {
        text* id = DatumGetTextPP(c.ids.value(i));
        Size len = VARSIZE_ANY_EXHDR(id);
        first[i] = i;
        if (i > 0) {
            text* prev = DatumGetTextPP(c.ids.value(i - 1));
            if (VARSIZE_ANY_EXHDR(prev) == len &&
                memcmp(VARDATA_ANY(prev), VARDATA_ANY(id), len) == 0)
                first[i] = first[i - 1];
        }
        hashes[i] = inbox::RecentIds::hash(std::string_view(VARDATA_ANY(id), len));
        text* topic = DatumGetTextPP(c.topics.value(i));
        lanes[i] =
            inbox::RecentIds::lane(std::string_view(VARDATA_ANY(topic), VARSIZE_ANY_EXHDR(topic)),
                                   DatumGetInt32(c.partitions.value(i)));
    }
    bool* known = static_cast<bool*>(palloc0(sizeof(bool) * n));
    call_cpp([&] {
        for (int i = 0; i < n; ++i) {
            if (first[i] != i) continue;
            known[i] = sub->recent.contains(lanes[i], hashes[i]);
            sub->recent.add(lanes[i], hashes[i]);
        }
    });
    out->fresh = static_cast<int*>(palloc(sizeof(int) * n));
    out->known = static_cast<int*>(palloc(sizeof(int) * n));
    out->check = static_cast<int*>(palloc(sizeof(int) * n));
    for (int i = 0; i < n; ++i) {
        int f = first[i];
        if (known[f])
            out->known[out->n_known++] = i;  // compared with the stored row, as before
        else if (f == i)
            out->fresh[out->n_fresh++] = i;
        else if (cdc || same_value(c, f, i))
            ++out->repeats;
        else
            out->check[out->n_check++] = i;
    }
    pfree(hashes);
    pfree(lanes);
    pfree(first);
    pfree(known);
}

// Conflicting duplicates, looked for only when the insert left records out: those whose id
// is in the inbox under another transport identity (not the row this batch stored, not a
// redelivery of the stored record) with another payload. Each is listed once. Values stored as
// jsonb are compared as jsonb even when their bytes are kept too (keep_raw): the same JSON
// written with other whitespace or key order is not a conflict.
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
    "AND CASE WHEN x.payload IS NULL AND u.payload IS NULL "
    "THEN x.raw_payload IS DISTINCT FROM u.raw ELSE x.payload IS DISTINCT FROM u.payload END "
    "ON CONFLICT DO NOTHING",
    7,
    {TEXTOID, TEXTARRAYOID, TEXTARRAYOID, INT4ARRAYOID, INT8ARRAYOID, JSONBARRAYOID,
     BYTEAARRAYOID},
    nullptr};

// Lists the conflicting duplicates among rows[0..n) of `c` (all of them when rows is null).
uint64 record_conflicts(const Columns& c, Datum name, const int* rows, int n) {
    auto col = [&](const pg::ArrayColumn& a) {
        return rows == nullptr ? a.get() : a.get_rows(rows, n);
    };
    Datum conflict_values[7] = {name,           col(c.ids),      col(c.topics), col(c.partitions),
                                col(c.offsets), col(c.payloads), col(c.raws)};
    worker::exec_kept(kWho, conflicts_statement, conflict_values, false, SPI_OK_INSERT);
    return SPI_processed;
}

}  // namespace

// A batch goes in one of two ways.
//
// The fast way, when the batch is expected to hold only new messages and foreseen duplicates:
// the repeats of a record of the batch (rows are in message-id order: the same id follows) are
// left out, compared with their first row in memory when their values are the same bytes (no
// conflict) and in the database after the insert otherwise; the ids this subscription's last
// lanes stored last (sub->recent: a producer's retry a few records later, across a batch's end)
// go in with ON CONFLICT and are compared with the stored rows; the rest, the first of each new
// id, goes in without ON CONFLICT (insert_new()). 5% duplicates then cost a memcmp each, or an
// ON CONFLICT probe and a comparison each, not the whole batch's.
//
// The old way (insert_all(), then every row compared) otherwise, and when the fast insert found
// an unforeseen duplicate (a subtransaction rolled back, then the whole batch again).
Inserted store_rows(Subscription* sub, const Columns& c, const Below& below) {
    Inserted done;
    sub->recent.begin();
    if (c.count == 0) return done;
    InsertPlans plans = insert_plans();
    Datum name = CStringGetTextDatum(sub->name.c_str());
    // Under the CDC rules a duplicate is a change emitted again, whose envelope differs in when
    // the connector emitted it (ts_ms): not a conflict.
    bool cdc = sub->options.id_rule == inbox::IdRule::kDebezium ||
               sub->options.id_rule == inbox::IdRule::kCockroachDb;
    Split split;
    split_rows(sub, c, cdc, &split);
    TransactionId writer = InvalidTransactionId;  // the xmin of the rows inserted now
    Datum values[15];
    // The unparsable rows are found by their inserter's xid (the subtransaction's): none may go
    // in with the known ones (the top transaction's).
    bool fast = sub->expect_new && (c.unparsable_rows == 0 || split.n_known == 0) && !below();
    if (fast) {
        bool all = split.n_fresh == c.count;
        row_values(sub, c, name, all ? nullptr : split.fresh, split.n_fresh, values);
        uint64 inserted = 0;
        if (split.n_fresh == 0 ||
            insert_new(sub->backfill ? plans.insert_new_modes : plans.insert_new, values, &inserted,
                       &writer)) {
            done.rows = inserted;
            if (split.n_known > 0) {
                row_values(sub, c, name, split.known, split.n_known, values);
                worker::exec_kept(kWho, sub->backfill ? plans.insert_modes : plans.insert, values,
                                  false, SPI_OK_INSERT);
                done.rows += SPI_processed;
            }
            if (!cdc && (split.n_known > 0 || split.n_check > 0)) {
                // The known rows then the repeats to compare: one statement.
                memcpy(split.known + split.n_known, split.check, sizeof(int) * split.n_check);
                done.conflicts =
                    record_conflicts(c, name, split.known, split.n_known + split.n_check);
            }
        } else {
            fast = false;  // an unforeseen duplicate
        }
    }
    if (!fast) {
        row_values(sub, c, name, nullptr, c.count, values);
        done.rows = insert_all(sub, values, &writer);
        if (done.rows < static_cast<uint64>(c.count) && !cdc)
            done.conflicts = record_conflicts(c, name, nullptr, c.count);
    }
    // The next batch is tried the fast way unless this one held duplicates not foreseen.
    uint64 foreseen = static_cast<uint64>(split.n_known + split.n_check + split.repeats);
    sub->expect_new = done.rows + foreseen >= static_cast<uint64>(c.count);
    // The subscription's dead-letter topic, if any, gets the unparsable rows stored now.
    if (c.unparsable_rows > 0 && done.rows > 0)
        handlers::dead_letters::after_unparsable(name, c.unparsable_ids.get(c.unparsable_rows),
                                                 writer);
    return done;
}

// A batch stored below what this process stored before (a record read again), or its first in
// a lane (StoredOffsets cannot tell what another process stored there): each of its
// lanes' positions goes down to the batch's first offset there, in the batch's transaction
// (eventbox._inbox_stored_below(); the other batches need no position written: they store at or
// above the lane's next offset, which no pass raises a position past).
void stored_below(Subscription* sub, const Columns& c) {
    static SPIPlanPtr plan = nullptr;
    if (plan == nullptr) {
        Oid types[4] = {TEXTOID, TEXTARRAYOID, INT4ARRAYOID, INT8ARRAYOID};
        plan = prepare("SELECT eventbox._inbox_stored_below($1, $2, $3, $4)", 4, types);
    }
    Datum values[4] = {CStringGetTextDatum(sub->name.c_str()), c.topics.get(), c.partitions.get(),
                       c.offsets.get()};
    worker::exec_kept(kWho, plan, values, false, SPI_OK_SELECT);
}

void rows_committed(Subscription* sub) {
    call_cpp([&] { sub->recent.committed(); });
}

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
    if (sub->group) report_group_uncommitted();
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

}  // namespace

bool store_lane_offsets(const Subscription* sub, const std::vector<kafka::PartitionEnd>& ends) {
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

namespace {

// Stores the next offsets of the lanes of records [from, to) (and the positions to store);
// returns whether one was moved under us (eventbox.replay).
bool store_offsets(const Subscription* sub, std::size_t from, std::size_t to) {
    return store_lane_offsets(sub, state.partition_ends(sub, from, to));
}

// ---- a batch --------------------------------------------------------------------------------

// After the batch committed: the consumer, the counters and the handler workers learn of it.
void after_commit(Subscription* sub, std::size_t n, const Columns& c, const Inserted& done,
                  bool moved) {
    uint64 duplicates = static_cast<uint64>(c.count) - done.rows;
    rows_committed(sub);
    // Right after the commit: a handler worker that read the count before its pass saw these
    // rows (handlers/quiet.hpp).
    if (done.rows > 0) shmem::inbox_stored(sub->name.c_str());
    pgstat_report_stat(false);  // lets autovacuum and autoanalyze see the inbox
    // Membership 'group': the group learns these offsets next, and the next owner of a
    // partition starts there, so the rows must outlive a crash first (the worker commits
    // asynchronously).
    if (sub->group) XLogFlush(XactLastCommitEnd);
    state.committed(sub);
    if (moved) {
        // A stored offset was moved under us (eventbox.replay): continue from the table's.
        needs_reload = true;
    }
    shmem::count_messages(n);
    shmem::count_transport_ids(static_cast<uint64>(c.transport_ids));
    shmem::count_duplicates(duplicates);
    metrics::ingested(sub->name.c_str(), n, duplicates, static_cast<uint64>(c.transport_ids),
                      static_cast<uint64>(c.unparsable_rows), sub->skipped);
    metrics::ingest_conflicts(sub->name.c_str(), done.conflicts);
    shmem::wake_handlers();
}

// A Kafka batch, for Below.
struct KafkaBatch {
    Subscription* sub;
    rd_kafka_message_t* const* messages;
    int n;
};

bool kafka_below(const void* arg) {
    auto* b = static_cast<const KafkaBatch*>(arg);
    return state.stores_below(b->sub, b->messages, b->n, false);
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
    Columns columns(static_cast<int>(sub->order.size()));
    columns.records = static_cast<int>(to - from);
    build_columns(sub, messages, &columns, &store_context);
    KafkaBatch batch{sub, messages, columns.records};
    Inserted done = store_rows(sub, columns, Below{kafka_below, &batch});
    if (done.rows > 0 && state.stores_below(sub, messages, columns.records, true))
        stored_below(sub, columns);
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
