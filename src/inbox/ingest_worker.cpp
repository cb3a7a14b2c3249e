// An ingest background worker (eventbox.ingest_workers of them, each consuming its share of every
// subscription's partitions): one librdkafka consumer for all of its subscriptions (see
// kafka/consumer.hpp), so its threads, sockets and fds do not grow with them. Each poll's
// records are handed to the subscriptions that want them, and each subscription's share is
// written in one transaction per batch (inbox rows deduplicated with ON CONFLICT DO NOTHING, plus
// the partitions' next offsets; a batch with duplicates also compares them with the stored rows
// and lists those with another payload in eventbox.conflicts), then the handler workers are woken.
// After a batch without duplicates, the next one is first inserted without ON CONFLICT (see
// insert_new()). It sleeps on one
// WaitEventSet: its latch (set when subscriptions change), postmaster death, and the consumer's
// queue fd.
//
// A subscription whose batch cannot be stored (any ERROR) is rolled back alone, paused and retried
// with a backoff from its stored offsets; one that cannot read (an unknown or refused topic, an
// unresolvable start) is retried by the consumer. Either shows in eventbox.subscription_errors
// (the table eventbox.ingest_errors, written only when a subscription starts or stops failing)
// and in the log at a bounded rate; the other subscriptions go on.
//
// PostgreSQL-side code: C++ objects live on the heap behind `subscriptions` and are reached only
// through call_cpp(); no object with a destructor lives on these stack frames.
extern "C" {
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
}

#include <algorithm>
#include <string>
#include <vector>

#include "pg/guc.hpp"
#include "handlers/dead_letters.hpp"
#include "handlers/low_water.hpp"
#include "inbox/jsonb.hpp"
#include "inbox/record.hpp"
#include "kafka/consumer.hpp"
#include "kafka/options.hpp"
#include "pg/arrays.hpp"
#include "pg/boundary.hpp"
#include "pg/extension.hpp"
#include "metrics/counters.hpp"
#include "pg/shmem.hpp"
#include "workers/common.hpp"

using eventbox::pg::call_cpp;
using eventbox::pg::pg_guard;

namespace eventbox {

namespace {

// One enabled subscription; its records come from the worker's consumer.
struct Subscription {
    std::string name;
    std::string fingerprint;  // settings it was added to the consumer with
    int id = 0;               // in the consumer
    inbox::Options options;
    std::size_t batch_size = 1000;
    bool backfill = false;  // created with backfill => true: rows get a mode
    std::vector<inbox::Classified> rows;  // the current batch, classified
    std::vector<int> order;               // its rows by message id (see store_chunk())
    bool fresh = true;  // paused in the consumer until reload() gives it its stored offsets
    // The last batch had no duplicates: the next one is tried without ON CONFLICT (insert_new()).
    bool expect_new = true;
    // A batch that could not be stored: paused until retry_at_ms, then read again from the
    // stored offsets; failing until a batch is stored (or it stays quiet a while after resuming).
    bool failing = false;
    int attempts = 0;
    int backoff_ms = 0;
    int64_t retry_at_ms = 0;
    int64_t resumed_at_ms = 0;
    std::string error;     // why its last batch failed
    std::string recorded;  // its error as in eventbox.ingest_errors ("" = no row)
    int recorded_attempts = 0;
};

// What the subscriptions table says, read before (re)building consumers.
struct Wanted {
    std::string name, fingerprint, group_id, message_id_field;
    std::vector<std::string> topics;
    bool start_latest;
    bool fingerprint_ids;  // message_id_rule 'fingerprint'
    bool backfill;         // backfill => true
    int64_t created_ms;  // Unix epoch ms: where start_from 'latest' starts
    int batch_size;
};

kafka::Consumer* consumer = nullptr;
// What this process stored, lane by lane: a batch storing below it (replay(), a seek, the
// first batch after a start) drops the handler workers' low-water marks at its commit.
handlers::StoredOffsets* stored_offsets = nullptr;
std::string consumer_fingerprint;  // brokers and worker count it was built for
std::vector<Subscription*>* subscriptions = nullptr;
std::vector<Wanted>* wanted = nullptr;
std::size_t round_size = 1000;  // records read per poll: the largest batch size
int member = 0;   // this worker's index among the ingest workers
int members = 1;  // eventbox.ingest_workers, as of the last reload
uint64 loaded_generation = 0;
bool needs_reload = true;
bool announced_idle = false;
WaitEventSet* wait_set = nullptr;
TimestampTz last_batch_at = 0;  // end of the last batch with messages
MemoryContext batch_context = nullptr;
SPIPlanPtr insert_plan, insert_modes_plan, insert_new_plan, insert_new_modes_plan, offsets_plan,
    stored_plan, error_set_plan, error_clear_plan, errors_sync_plan, conflicts_plan;
// Lines about single subscriptions, at most 5 a minute of each kind: added, moved or recovered;
// failing.
worker::LogRate subscription_log_rate{5, 60000};
worker::LogRate failure_log_rate{5, 60000};

constexpr int kMaxBackoffMs = 60000;
constexpr int64_t kQuietAfterResumeMs = 5000;

void destroy_state() {
    if (subscriptions != nullptr) {
        for (Subscription* s : *subscriptions) delete s;
        delete subscriptions;
        subscriptions = nullptr;
    }
    delete consumer;
    consumer = nullptr;
    consumer_fingerprint.clear();
}

void shutdown_ingest(int, Datum) { destroy_state(); }

SPIPlanPtr prepare(const char* sql, int nargs, Oid* types) {
    return worker::prepare_kept("eventbox ingest", sql, nargs, types);
}

void prepare_plans() {
    if (insert_plan != nullptr) return;
    Oid insert_types[12] = {TEXTOID,       TEXTARRAYOID, TEXTARRAYOID, INT4ARRAYOID,
                            INT8ARRAYOID,  BYTEAARRAYOID, JSONBARRAYOID, JSONBARRAYOID,
                            BYTEAARRAYOID, TEXTARRAYOID, TEXTARRAYOID, TEXTARRAYOID};
    // unnest() in the select list: the rows stream from the arrays (ProjectSet); unnest() in
    // FROM would first copy them all into a tuplestore (~12% of the statement at 1 KiB).
    // The subscription row is locked KEY SHARE until the batch commits: drop_subscription()
    // (which locks it FOR UPDATE) waits for a batch being stored, and a batch waits for a drop
    // in progress and then finds the subscription gone. Checked with the statement's snapshot
    // alone, a batch stored during an uncommitted drop committed rows after the drop had
    // deleted the subscription's rows, and a subscription created again under that name took
    // its messages for duplicates of those orphans.
#define INSERT_ROWS(MODE_COLUMN, MODE_VALUES)                                                 \
    "INSERT INTO eventbox.inbox (subscription, message_id, topic, \"partition\", \"offset\", "      \
    "key, headers, payload, raw_payload, event_type, status, last_error" MODE_COLUMN ") "        \
    "SELECT $1, unnest($2::text[]), unnest($3::text[]), unnest($4::int4[]), "                  \
    "unnest($5::int8[]), unnest($6::bytea[]), unnest($7::jsonb[]), unnest($8::jsonb[]), "       \
    "unnest($9::bytea[]), unnest($10::text[]), unnest($11::text[]), unnest($12::text[])"        \
    MODE_VALUES " "                                                                            \
    "WHERE EXISTS (SELECT 1 FROM eventbox.subscriptions s WHERE s.name = $1 FOR KEY SHARE)"
#define ON_CONFLICT " ON CONFLICT (subscription, message_id) DO NOTHING"
    insert_plan = prepare(INSERT_ROWS("", "") ON_CONFLICT, 12, insert_types);
    // A batch expected to hold only new messages (insert_new()): the same rows without ON
    // CONFLICT, which spares each row the arbiter's probe of inbox_pkey before its insertion and
    // the speculative insertion's extra WAL record (~30% of the statement at 200 B); inbox_pkey
    // still refuses a duplicate, at its insertion.
    insert_new_plan = prepare(INSERT_ROWS("", ""), 12, insert_types);
    // The same for a backfill subscription, with each row's mode ($13) (and the same lock).
    Oid insert_modes_types[13] = {TEXTOID,       TEXTARRAYOID,  TEXTARRAYOID,  INT4ARRAYOID,
                                  INT8ARRAYOID,  BYTEAARRAYOID, JSONBARRAYOID, JSONBARRAYOID,
                                  BYTEAARRAYOID, TEXTARRAYOID,  TEXTARRAYOID,  TEXTARRAYOID,
                                  TEXTARRAYOID};
    insert_modes_plan = prepare(INSERT_ROWS(", mode", ", unnest($13::text[])") ON_CONFLICT, 13,
                                insert_modes_types);
    insert_new_modes_plan =
        prepare(INSERT_ROWS(", mode", ", unnest($13::text[])"), 13, insert_modes_types);
#undef ON_CONFLICT
#undef INSERT_ROWS
    // Conflicting duplicates, looked for only when the insert above left records out: those
    // whose id is in the inbox under another transport identity (not the row this batch
    // stored, not a redelivery of the stored record) with another payload. Each is listed once.
    Oid conflicts_types[7] = {TEXTOID,      TEXTARRAYOID,  TEXTARRAYOID, INT4ARRAYOID,
                              INT8ARRAYOID, JSONBARRAYOID, BYTEAARRAYOID};
    conflicts_plan = prepare(
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
        7, conflicts_types);
    // Compare-and-set: a stored offset someone else moved (eventbox.replay) is left alone, and
    // the worker notices from the row count and moves the subscription to the table's offsets.
    // backfill_until ($7) is written once, with the partition's first row.
    Oid offsets_types[7] = {TEXTOID,      TEXTARRAYOID, INT4ARRAYOID, INT8ARRAYOID,
                            INT8ARRAYOID, INT8ARRAYOID, INT8ARRAYOID};
    offsets_plan = prepare(
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
        7, offsets_types);
    // Every subscription's stored offsets at once (a reload reads them all).
    stored_plan = prepare(
        "SELECT subscription, topic, \"partition\", next_offset, "
        "coalesce(backfill_until, -1) FROM eventbox.offsets", 0,
        nullptr);
    Oid set_types[5] = {TEXTOID, INT4OID, TEXTOID, INT4OID, TIMESTAMPTZOID};
    error_set_plan = prepare(
        "INSERT INTO eventbox.ingest_errors AS e (subscription, worker, error, attempts, "
        "next_retry_at) VALUES ($1, $2, $3, $4, $5) "
        "ON CONFLICT (subscription, worker) DO UPDATE SET error = excluded.error, "
        "attempts = excluded.attempts, next_retry_at = excluded.next_retry_at, "
        "updated_at = now()",
        5, set_types);
    Oid clear_types[2] = {TEXTOID, INT4OID};
    error_clear_plan = prepare(
        "DELETE FROM eventbox.ingest_errors WHERE subscription = $1 AND worker = $2", 2,
        clear_types);
    // Rows this worker no longer stands behind (after a restart, a change or a drop), and those
    // of workers that no longer run.
    Oid sync_types[3] = {INT4OID, TEXTARRAYOID, INT4OID};
    errors_sync_plan = prepare(
        "DELETE FROM eventbox.ingest_errors WHERE (worker = $1 AND subscription <> ALL ($2)) "
        "OR worker >= $3",
        3, sync_types);
}

void rebuild_wait_set() {
    if (wait_set != nullptr) FreeWaitEventSet(wait_set);
    wait_set = CreateWaitEventSet(TopMemoryContext, 3);
    AddWaitEventToSet(wait_set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, nullptr);
    AddWaitEventToSet(wait_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, nullptr, nullptr);
    if (consumer != nullptr)
        AddWaitEventToSet(wait_set, WL_SOCKET_READABLE, consumer->event_fd(), nullptr, nullptr);
}

char* text_at(HeapTuple tuple, TupleDesc desc, int column) {
    bool isnull;
    Datum d = SPI_getbinval(tuple, desc, column, &isnull);
    return isnull ? pstrdup("") : TextDatumGetCString(d);
}

// Reads the enabled subscriptions into `wanted` (inside a transaction).
void read_wanted() {
    int rc = SPI_execute(
        "SELECT name, array_to_string(topics, ','), coalesce(group_id, ''), start_from, "
        "coalesce(message_id_field, ''), batch_size, "
        "(extract(epoch FROM created_at) * 1000)::int8, message_id_rule = 'fingerprint', "
        "backfill "
        "FROM eventbox.subscriptions "
        "WHERE enabled ORDER BY name",
        true, 0);
    if (rc != SPI_OK_SELECT) elog(ERROR, "eventbox ingest: reading subscriptions failed");
    call_cpp([] { wanted->clear(); });
    char* database = get_database_name(MyDatabaseId);
    for (uint64 i = 0; i < SPI_processed; ++i) {
        HeapTuple tuple = SPI_tuptable->vals[i];
        TupleDesc desc = SPI_tuptable->tupdesc;
        char* name = text_at(tuple, desc, 1);
        char* topics = text_at(tuple, desc, 2);
        char* group = text_at(tuple, desc, 3);
        char* start_from = text_at(tuple, desc, 4);
        char* field = text_at(tuple, desc, 5);
        bool isnull;
        int batch = DatumGetInt32(SPI_getbinval(tuple, desc, 6, &isnull));
        int64 created_ms = DatumGetInt64(SPI_getbinval(tuple, desc, 7, &isnull));
        bool fingerprint_ids = DatumGetBool(SPI_getbinval(tuple, desc, 8, &isnull));
        bool backfill = DatumGetBool(SPI_getbinval(tuple, desc, 9, &isnull));
        call_cpp([&] {
            Wanted w;
            w.name = name;
            w.group_id = group[0] ? std::string(group) : "eventbox." + std::string(database) + "." + name;
            w.message_id_field = field;
            w.start_latest = std::string_view(start_from) == "latest";
            w.created_ms = created_ms;
            w.batch_size = batch;
            w.fingerprint_ids = fingerprint_ids;
            w.backfill = backfill;
            std::string list = topics;
            for (std::size_t start = 0; start <= list.size();) {
                std::size_t comma = list.find(',', start);
                if (comma == std::string::npos) comma = list.size();
                w.topics.push_back(list.substr(start, comma - start));
                start = comma + 1;
            }
            w.fingerprint = list + "|" + w.group_id + "|" + start_from + "|" + field + "|" +
                            std::to_string(batch) + (fingerprint_ids ? "|fingerprint" : "") +
                            (backfill ? "|backfill" : "");
            wanted->push_back(std::move(w));
        });
    }
}

// Adds wanted[i] to the consumer (paused until its stored offsets are read).
Subscription* start_subscription(std::size_t i) {
    return call_cpp([&] {
        const Wanted& w = (*wanted)[i];
        auto* s = new Subscription();
        s->name = w.name;
        s->fingerprint = w.fingerprint;
        s->options.message_id_field = w.message_id_field;
        s->options.fingerprint_ids = w.fingerprint_ids;
        s->options.max_message_bytes = static_cast<std::size_t>(guc::max_message_bytes);
        s->batch_size = static_cast<std::size_t>(w.batch_size);
        kafka::SubscriptionConfig config;
        config.name = w.name;
        config.group_id = w.group_id;
        config.topics = w.topics;
        config.start_latest = w.start_latest;
        config.latest_since_ms = w.created_ms;
        config.backfill = w.backfill;
        s->backfill = w.backfill;
        s->id = consumer->add_subscription(config);
        return s;
    });
}

// Logs a line about one subscription, at most `rate` allows.
void log_subscription(const char* fmt, const char* name, const char* what,
                      worker::LogRate& rate = subscription_log_rate) {
    int held_back = 0;
    if (!worker::log_allowed(rate, &held_back)) return;
    ereport(LOG, (errmsg_internal(fmt, name, what),
                  held_back ? errdetail("%d similar messages suppressed.", held_back) : 0));
}

// Brings the consumer and its subscriptions in line with the subscriptions table.
void reload() {
    if (wanted == nullptr) wanted = call_cpp([] { return new std::vector<Wanted>(); });
    if (subscriptions == nullptr)
        subscriptions = call_cpp([] { return new std::vector<Subscription*>(); });
    if (guc::brokers[0] == '\0') {
        destroy_state();
        subscriptions = call_cpp([] { return new std::vector<Subscription*>(); });
        if (!announced_idle)
            ereport(LOG, (errmsg("eventbox ingest idle: eventbox.brokers is empty"),
                          errhint("Set eventbox.brokers and reload the configuration.")));
        announced_idle = true;
        shmem::set_state("idle: no brokers");
        rebuild_wait_set();
        return;
    }
    announced_idle = false;
    members = guc::ingest_workers;
    loaded_generation = shmem::subscriptions_generation();
    // A consumer built for other brokers or another share of the partitions starts over.
    bool rebuild = call_cpp([] {
        std::string fingerprint = std::string(guc::brokers) + "|" + std::to_string(members);
        bool changed = consumer != nullptr && fingerprint != consumer_fingerprint;
        consumer_fingerprint = fingerprint;
        return changed;
    });
    if (rebuild) {
        destroy_state();
        subscriptions = call_cpp([] { return new std::vector<Subscription*>(); });
    }
    if (consumer == nullptr) {
        consumer = call_cpp([] {
            kafka::ConsumerConfig config;
            config.brokers = guc::brokers;
            config.options = parse_kafka_options(guc::kafka_options ? guc::kafka_options : "");
            config.member = member;
            config.members = members;
            config.group_id = "pg_eventbox-ingest";
            consumer_fingerprint = std::string(guc::brokers) + "|" + std::to_string(members);
            return new kafka::Consumer(config);
        });
    }
    SetCurrentStatementStartTimestamp();  // now() of this transaction
    StartTransactionCommand();
    pg::lock_schema_or_exit();
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "eventbox ingest: SPI_connect failed");
    PushActiveSnapshot(GetTransactionSnapshot());
    prepare_plans();
    read_wanted();
    int64 now = worker::now_ms();
    // Subscriptions gone or changed leave the consumer; settings read per record follow
    // reloads; failing ones whose retry is due read their stored offsets again.
    call_cpp([&] {
        std::vector<Subscription*> keep;
        for (Subscription* s : *subscriptions) {
            bool still = false;
            for (const Wanted& w : *wanted)
                if (w.name == s->name && w.fingerprint == s->fingerprint) still = true;
            if (still) {
                keep.push_back(s);
            } else {
                consumer->remove_subscription(s->id);
                delete s;
            }
        }
        *subscriptions = std::move(keep);
        for (Subscription* s : *subscriptions) {
            s->options.max_message_bytes = static_cast<std::size_t>(guc::max_message_bytes);
            if (s->failing && consumer->paused(s->id) && now >= s->retry_at_ms) s->fresh = true;
        }
    });
    std::size_t n_wanted = call_cpp([] { return wanted->size(); });
    for (std::size_t i = 0; i < n_wanted; ++i) {
        bool running = call_cpp([&] {
            for (Subscription* s : *subscriptions)
                if (s->name == (*wanted)[i].name) return true;
            return false;
        });
        if (running) continue;
        Subscription* sub = start_subscription(i);
        call_cpp([&] { subscriptions->push_back(sub); });
    }
    // Stored offsets: the source of every fresh subscription's positions; a running one whose
    // offsets differ from what it stored was moved (eventbox.replay) and continues from there.
    worker::exec_kept("eventbox ingest", stored_plan, nullptr, true, SPI_OK_SELECT);
    struct Lookup {
        std::map<std::string, Subscription*> by_name;
        std::vector<Subscription*> moved;
    };
    Lookup* lookup = call_cpp([] {
        auto* l = new Lookup();
        for (Subscription* s : *subscriptions) l->by_name[s->name] = s;
        return l;
    });
    for (uint64 r = 0; r < SPI_processed; ++r) {
        HeapTuple tuple = SPI_tuptable->vals[r];
        TupleDesc desc = SPI_tuptable->tupdesc;
        bool isnull;
        char* name = text_at(tuple, desc, 1);
        char* topic = text_at(tuple, desc, 2);
        int32 partition = DatumGetInt32(SPI_getbinval(tuple, desc, 3, &isnull));
        int64 next = DatumGetInt64(SPI_getbinval(tuple, desc, 4, &isnull));
        int64 until = DatumGetInt64(SPI_getbinval(tuple, desc, 5, &isnull));
        call_cpp([&] {
            auto it = lookup->by_name.find(name);
            if (it == lookup->by_name.end()) return;
            Subscription* s = it->second;
            if (s->fresh) {
                if (!consumer->paused(s->id)) consumer->pause(s->id);
                consumer->set_stored_offset(s->id, topic, partition, next, until);
            } else if (!consumer->paused(s->id) &&
                       consumer->set_stored_offset(s->id, topic, partition, next) &&
                       (lookup->moved.empty() || lookup->moved.back() != s)) {
                lookup->moved.push_back(s);
            }
        });
        pfree(name);
        pfree(topic);
    }
    std::size_t n_moved = call_cpp([&] { return lookup->moved.size(); });
    for (std::size_t k = 0; k < n_moved; ++k) {
        Subscription* sub = call_cpp([&] {
            Subscription* s = lookup->moved[k];
            consumer->seek_to_stored(s->id);
            return s;
        });
        log_subscription("eventbox ingest: subscription \"%s\" continues from its changed "
                         "stored offsets%s", sub->name.c_str(), "");
    }
    call_cpp([&] { delete lookup; });
    // Fresh subscriptions (new, or failing ones whose retry is due) start from those offsets.
    std::size_t n_subs = call_cpp([] { return subscriptions->size(); });
    for (std::size_t k = 0; k < n_subs; ++k) {
        Subscription* sub = call_cpp([&] { return (*subscriptions)[k]; });
        if (!sub->fresh) continue;
        bool retry = call_cpp([&] {
            if (!consumer->paused(sub->id)) consumer->pause(sub->id);  // no stored offsets
            consumer->resume(sub->id);
            sub->fresh = false;
            sub->resumed_at_ms = now;
            return sub->failing;
        });
        if (!retry)
            log_subscription("eventbox ingest: consuming subscription \"%s\"%s", sub->name.c_str(),
                             members > 1 ? psprintf(" (worker %d of %d)", member + 1, members) : "");
    }
    // eventbox.ingest_errors: only rows of the subscriptions this worker sees failing.
    {
        int n_failing = call_cpp([] {
            int n = 0;
            for (Subscription* s : *subscriptions) n += s->recorded.empty() ? 0 : 1;
            return n;
        });
        pg::ArrayColumn names(n_failing, TEXTOID);
        int j = 0;
        for (std::size_t k = 0; k < n_subs; ++k) {
            Subscription* sub = call_cpp([&] { return (*subscriptions)[k]; });
            if (!sub->recorded.empty() && j < n_failing)
                names.set(j++, CStringGetTextDatum(sub->name.c_str()));
        }
        Datum values[3] = {Int32GetDatum(member), names.get(), Int32GetDatum(members)};
        worker::exec_kept("eventbox ingest", errors_sync_plan, values, false, SPI_OK_DELETE);
    }
    PopActiveSnapshot();
    SPI_finish();
    CommitTransactionCommand();
    call_cpp([] {
        round_size = 1;
        for (Subscription* s : *subscriptions) round_size = std::max(round_size, s->batch_size);
    });
    shmem::set_state(n_wanted ? "running" : "idle: no subscriptions");
    rebuild_wait_set();
}

bytea* to_bytea(const void* data, std::size_t len) {
    auto* b = static_cast<bytea*>(palloc(VARHDRSZ + len));
    SET_VARSIZE(b, VARHDRSZ + len);
    if (len > 0) memcpy(VARDATA(b), data, len);
    return b;
}

// Stores records [from, to) of `sub`'s batch (and the positions to store) in one transaction;
// returns the number of records.
// Whether the batch's records (in the consumer's order: by partition, offsets rising) store
// some lane's rows at offsets not above what this process stored there before.
// With `record`, records the batch's offsets (StoredOffsets::store()); without, only tells.
bool stores_below(const std::string& subscription, rd_kafka_message_t* const* messages, int n,
                  bool record = true) {
    return call_cpp([&] {
        if (stored_offsets == nullptr) stored_offsets = new handlers::StoredOffsets();
        bool below = false;
        for (int k = 0; k < n;) {
            rd_kafka_message_t* first = messages[k];
            int last = k;
            while (last + 1 < n && messages[last + 1]->rkt == first->rkt &&
                   messages[last + 1]->partition == first->partition)
                ++last;
            const char* topic = rd_kafka_topic_name(first->rkt);
            below |= record ? stored_offsets->store(subscription, topic, first->partition,
                                                    first->offset, messages[last]->offset)
                            : stored_offsets->below(subscription, topic, first->partition,
                                                    first->offset);
            k = last + 1;
        }
        return below;
    });
}

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
        worker::exec_kept("eventbox ingest", plan, values, false, SPI_OK_INSERT);
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

std::size_t store_chunk(Subscription* sub, std::size_t from, std::size_t to) {
    std::size_t n = to - from;
    // Classify in C++, then build the columns here.
    call_cpp([&] {
        // The rows of earlier batches are reused: their strings keep their buffers.
        if (sub->rows.size() < n) sub->rows.resize(n);
        std::vector<inbox::KafkaHeader> headers;
        const std::vector<rd_kafka_message_t*>& batch = consumer->batch(sub->id);
        for (std::size_t i = 0; i < n; ++i) {
            rd_kafka_message_t* msg = batch[from + i];
            headers.clear();
            rd_kafka_headers_t* hdrs = nullptr;
            rd_kafka_resp_err_t herr = rd_kafka_message_headers(msg, &hdrs);
            if (herr == RD_KAFKA_RESP_ERR_NO_ERROR) {
                const char* name;
                const void* value;
                size_t size;
                for (size_t idx = 0;
                     rd_kafka_header_get_all(hdrs, idx, &name, &value, &size) ==
                     RD_KAFKA_RESP_ERR_NO_ERROR;
                     ++idx)
                    headers.push_back(inbox::KafkaHeader{name, static_cast<const char*>(value), size});
            }
            inbox::Record record;
            record.topic = rd_kafka_topic_name(msg->rkt);
            record.partition = msg->partition;
            record.offset = msg->offset;
            record.value = static_cast<const char*>(msg->payload);
            record.value_len = msg->len;
            record.headers = headers.data();
            record.n_headers = headers.size();
            // NOENT: the record has no headers. Anything else: it has some we cannot read.
            if (herr != RD_KAFKA_RESP_ERR_NO_ERROR && herr != RD_KAFKA_RESP_ERR__NOENT) {
                record.headers_unreadable = true;
                record.headers_error = rd_kafka_err2str(herr);
            }
            inbox::classify(record, sub->options, sub->rows[i]);
        }
        // Rows go in by message id: ingest workers inserting the same ids at once (a message
        // republished to partitions of two workers; a partition read by its old and new owner
        // while eventbox.ingest_workers changes) then wait for each other in one order, never
        // in a cycle. Every worker sorts, whatever it believes the worker count is.
        sub->order.resize(n);
        for (std::size_t k = 0; k < n; ++k) sub->order[k] = static_cast<int>(k);
        std::stable_sort(sub->order.begin(), sub->order.end(), [&](int a, int b) {
            return sub->rows[a].message_id < sub->rows[b].message_id;
        });
    });
    rd_kafka_message_t* const* messages = call_cpp([&] { return consumer->batch(sub->id).data() + from; });

    SetCurrentStatementStartTimestamp();  // now() of this transaction
    StartTransactionCommand();
    pg::lock_schema_or_exit();
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "eventbox ingest: SPI_connect failed");
    PushActiveSnapshot(GetTransactionSnapshot());
    prepare_plans();
    int count = static_cast<int>(n);
    pg::ArrayColumn ids(count, TEXTOID), topics(count, TEXTOID), partitions(count, INT4OID),
        offsets(count, INT8OID), keys(count, BYTEAOID), headers(count, JSONBOID),
        payloads(count, JSONBOID), raws(count, BYTEAOID), types(count, TEXTOID),
        statuses(count, TEXTOID), notes(count, TEXTOID), modes(count, TEXTOID);
    pg::ArrayColumn unparsable_ids(count, TEXTOID);  // for the dead-letter topic
    Datum live = CStringGetTextDatum("live"), backfill = CStringGetTextDatum("backfill");
    int transport_ids = 0;
    int unparsable_rows = 0;
    // Values most rows share are made once (the arrays copy them).
    Datum received = CStringGetTextDatum("received");
    Datum unparsable = CStringGetTextDatum("unparsable");
    rd_kafka_topic_t* topic_of = nullptr;
    Datum topic = 0;
    const std::string* type_of = nullptr;
    Datum type = 0;
    for (int i = 0; i < count; ++i) {
        int k = sub->order[i];
        rd_kafka_message_t* msg = messages[k];
        inbox::Classified& row = sub->rows[k];
        ids.set(i, PointerGetDatum(
                       cstring_to_text_with_len(row.message_id.data(), row.message_id.size())));
        transport_ids += row.transport_id ? 1 : 0;
        if (msg->rkt != topic_of) {
            topic_of = msg->rkt;
            topic = CStringGetTextDatum(rd_kafka_topic_name(msg->rkt));
        }
        topics.set(i, topic);
        partitions.set(i, Int32GetDatum(msg->partition));
        offsets.set(i, Int64GetDatum(msg->offset));
        if (msg->key != nullptr) keys.set(i, PointerGetDatum(to_bytea(msg->key, msg->key_len)));
        headers.set(i, inbox::headers_jsonb(row));
        std::string* note = &row.note;
        Datum payload;
        if (row.parsable &&
            inbox::payload_jsonb(row, static_cast<const char*>(msg->payload), msg->len, &payload,
                                 note)) {
            payloads.set(i, payload);
        } else {
            if (row.parsable) row.raw_len = msg->len;  // jsonb refused what looked like JSON
            row.parsable = false;
            if (!row.raw_null) raws.set(i, PointerGetDatum(to_bytea(msg->payload, row.raw_len)));
            notes.set(i, CStringGetTextDatum(row.note.c_str()));
        }
        if (row.event_type) {
            if (type_of == nullptr || *type_of != *row.event_type) {
                type_of = &*row.event_type;
                type = PointerGetDatum(cstring_to_text_with_len(type_of->data(), type_of->size()));
            }
            types.set(i, type);
        }
        statuses.set(i, row.parsable ? received : unparsable);
        if (sub->backfill) {
            // Below the partition's boundary: in the partition when the subscription was created.
            int64 until = call_cpp([&] {
                return consumer->backfill_until(sub->id, rd_kafka_topic_name(msg->rkt),
                                                msg->partition);
            });
            modes.set(i, msg->offset < until ? backfill : live);
        }
        if (!row.parsable) unparsable_ids.set(unparsable_rows++, ids.value(i));
    }
    Datum name = CStringGetTextDatum(sub->name.c_str());
    Datum values[12] = {name,           ids.get(),     topics.get(),   partitions.get(),
                        offsets.get(),  keys.get(),    headers.get(),  payloads.get(),
                        raws.get(),     types.get(),   statuses.get(), notes.get()};
    uint64 inserted = 0;
    uint64 conflicts = 0;
    TransactionId writer = InvalidTransactionId;  // the xmin of the rows inserted now
    if (count > 0) {
        Datum mode_values[13];
        Datum* args = values;
        if (sub->backfill) {
            memcpy(mode_values, values, sizeof values);
            mode_values[12] = modes.get();
            args = mode_values;
        }
        // A batch below what this process stored in a lane (eventbox.replay(), a seek, the
        // first one after a start) goes straight to ON CONFLICT: it may hold only duplicates,
        // and a refused attempt would leave its rows' dead versions behind.
        if (!sub->expect_new || stores_below(sub->name, messages, count, false) ||
            !insert_new(sub->backfill ? insert_new_modes_plan : insert_new_plan, args, &inserted,
                        &writer)) {
            worker::exec_kept("eventbox ingest", sub->backfill ? insert_modes_plan : insert_plan,
                              args, false, SPI_OK_INSERT);
            inserted = SPI_processed;
            writer = GetCurrentTransactionIdIfAny();
        }
        sub->expect_new = inserted == static_cast<uint64>(count);
        // The subscription's dead-letter topic, if any, gets the unparsable rows stored now.
        if (unparsable_rows > 0 && inserted > 0)
            handlers::dead_letters::after_unparsable(name, unparsable_ids.get(unparsable_rows),
                                                     writer);
        // Only a batch with duplicates pays for comparing them with the stored rows.
        if (inserted < static_cast<uint64>(count)) {
            Datum conflict_values[7] = {name,      values[1], values[2], values[3],
                                        values[4], values[7], values[8]};
            worker::exec_kept("eventbox ingest", conflicts_plan, conflict_values, false,
                              SPI_OK_INSERT);
            conflicts = SPI_processed;
        }
    }

    if (inserted > 0 && stores_below(sub->name, messages, count))
        shmem::inbox_requeued_at_commit();

    const std::vector<kafka::PartitionEnd>* ends =
        call_cpp([&] { return &consumer->partition_ends(sub->id, from, to); });
    int m = static_cast<int>(ends->size());
    pg::ArrayColumn end_topics(m, TEXTOID), end_partitions(m, INT4OID), end_offsets(m, INT8OID),
        end_high(m, INT8OID), end_previous(m, INT8OID), end_until(m, INT8OID);
    for (int i = 0; i < m; ++i) {
        const kafka::PartitionEnd& end = (*ends)[i];
        end_topics.set(i, CStringGetTextDatum(end.topic.c_str()));
        end_partitions.set(i, Int32GetDatum(end.partition));
        end_offsets.set(i, Int64GetDatum(end.next_offset));
        if (end.high_watermark >= 0) end_high.set(i, Int64GetDatum(end.high_watermark));
        if (end.previous >= 0) end_previous.set(i, Int64GetDatum(end.previous));
        if (end.backfill_until >= 0) end_until.set(i, Int64GetDatum(end.backfill_until));
    }
    Datum offset_values[7] = {name,           end_topics.get(), end_partitions.get(),
                              end_offsets.get(), end_high.get(),   end_previous.get(),
                              end_until.get()};
    worker::exec_kept("eventbox ingest", offsets_plan, offset_values, false, SPI_OK_INSERT);
    bool moved = SPI_processed < static_cast<uint64>(m);
    PopActiveSnapshot();
    SPI_finish();
    CommitTransactionCommand();
    // Right after the commit: a handler worker that read the count before its pass saw these
    // rows (handlers/quiet.hpp).
    if (inserted > 0) shmem::inbox_stored(sub->name.c_str());
    pgstat_report_stat(false);  // lets autovacuum and autoanalyze see the inbox

    call_cpp([&] { consumer->committed(sub->id); });
    if (moved) {
        // A stored offset was moved under us (eventbox.replay): continue from the table's.
        needs_reload = true;
    }
    shmem::count_messages(n);
    shmem::count_transport_ids(static_cast<uint64>(transport_ids));
    shmem::count_duplicates(n - inserted);
    metrics::ingested(sub->name.c_str(), n, n - inserted, static_cast<uint64>(transport_ids),
                      static_cast<uint64>(unparsable_rows));
    metrics::ingest_conflicts(sub->name.c_str(), conflicts);
    shmem::wake_handlers();
    return n;
}

// Stores `sub`'s records of the last poll, batch_size records per transaction; returns how many.
std::size_t store(Subscription* sub) {
    std::size_t total = call_cpp([&] { return consumer->batch(sub->id).size(); });
    bool pinned = call_cpp([&] { return consumer->has_positions_to_store(sub->id); });
    if (total == 0 && !pinned) return 0;
    std::size_t from = 0;
    do {
        std::size_t to = Min(from + sub->batch_size, total);
        store_chunk(sub, from, to);
        MemoryContextReset(batch_context);
        from = to;
    } while (from < total);
    return total;
}

// A batch of `sub` failed with `message`: it is paused (the others go on) and read again from
// its stored offsets after a backoff.
void subscription_failed(Subscription* sub, const char* message) {
    int backoff_ms = call_cpp([&] {
        consumer->pause(sub->id);
        sub->failing = true;
        sub->attempts += 1;
        sub->backoff_ms = std::min(std::max(sub->backoff_ms * 2, 1000), kMaxBackoffMs);
        sub->retry_at_ms = worker::now_ms() + sub->backoff_ms;
        sub->error = message;
        return sub->backoff_ms;
    });
    shmem::record_error(message);
    int held_back = 0;
    if (worker::log_allowed(failure_log_rate, &held_back))
        ereport(LOG, (errmsg("eventbox ingest: subscription \"%s\" could not store a batch: %s",
                             sub->name.c_str(), message),
                      errdetail("It is read again from its stored offsets in %d s (attempt %d); "
                                "the other subscriptions go on.%s",
                                backoff_ms / 1000, sub->attempts,
                                held_back ? psprintf(" %d similar messages suppressed.", held_back)
                                          : ""),
                      errhint("See eventbox.subscription_errors.")));
}

// Stores `sub`'s records; an ERROR is rolled back and recorded on `sub` alone. Returns false
// when the batch failed.
bool store_isolated(Subscription* sub, std::size_t* stored) {
    MemoryContext context = CurrentMemoryContext;
    volatile bool ok = true;
    PG_TRY();
    {
        *stored = store(sub);
    }
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
    return ok;
}

// What eventbox.ingest_errors should say about `sub` ("" = nothing).
const std::string& wanted_error(Subscription* sub) {
    return sub->failing ? sub->error : consumer->problem(sub->id);
}

// Whether eventbox.ingest_errors says something else (another error, or another attempt).
bool error_changed(Subscription* sub) {
    return wanted_error(sub) != sub->recorded ||
           (sub->failing ? sub->attempts : 0) != sub->recorded_attempts;
}

// Writes the subscriptions' errors that changed since they were last written, in one
// transaction, and logs them (at a bounded rate). Rows change only when a subscription starts
// or stops failing, or fails again after its backoff.
void record_errors() {
    bool due = call_cpp([] {
        for (Subscription* s : *subscriptions)
            if (error_changed(s)) return true;
        return false;
    });
    if (!due) return;
    SetCurrentStatementStartTimestamp();
    StartTransactionCommand();
    pg::lock_schema_or_exit();
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "eventbox ingest: SPI_connect failed");
    PushActiveSnapshot(GetTransactionSnapshot());
    prepare_plans();
    std::size_t n_subs = call_cpp([] { return subscriptions->size(); });
    for (std::size_t k = 0; k < n_subs; ++k) {
        Subscription* sub = call_cpp([&] { return (*subscriptions)[k]; });
        bool changed = call_cpp([&] { return error_changed(sub); });
        if (!changed) continue;
        const char* error = call_cpp([&] { return wanted_error(sub).c_str(); });
        Datum name = CStringGetTextDatum(sub->name.c_str());
        if (error[0] == '\0') {
            Datum values[2] = {name, Int32GetDatum(member)};
            worker::exec_kept("eventbox ingest", error_clear_plan, values, false, SPI_OK_DELETE);
            log_subscription("eventbox ingest: subscription \"%s\" is consumed again%s",
                             sub->name.c_str(), "");
        } else {
            bool paused = call_cpp([&] { return consumer->paused(sub->id); });
            Datum values[5] = {name, Int32GetDatum(member), CStringGetTextDatum(error),
                               Int32GetDatum(sub->failing ? sub->attempts : 0),
                               TimestampTzGetDatum(sub->retry_at_ms * 1000)};
            char nulls[5] = {' ', ' ', ' ', ' ', sub->failing && paused ? ' ' : 'n'};
            int rc = SPI_execute_plan(error_set_plan, values, nulls, false, 0);
            if (rc != SPI_OK_INSERT) elog(ERROR, "eventbox ingest: recording an error failed");
            if (!sub->failing && sub->recorded.empty())  // failures were logged when they happened
                log_subscription("eventbox ingest: subscription \"%s\" cannot be consumed: %s",
                                 sub->name.c_str(), error, failure_log_rate);
        }
        call_cpp([&] {
            sub->recorded = wanted_error(sub);
            sub->recorded_attempts = sub->failing ? sub->attempts : 0;
        });
    }
    PopActiveSnapshot();
    SPI_finish();
    CommitTransactionCommand();
}

}  // namespace

}  // namespace eventbox

extern "C" PGDLLEXPORT void eventbox_ingest_main(Datum);

extern "C" void eventbox_ingest_main(Datum arg) {
    using namespace eventbox;
    worker::setup_signals();
    memcpy(&member, MyBgworkerEntry->bgw_extra, sizeof member);
    BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(arg), InvalidOid, 0);
    // Safe asynchronously: a lost commit loses inbox rows and their offsets together, and they
    // are read from Kafka again.
    worker::apply_worker_settings(true);
    shmem::attach_worker(shmem::Role::kIngest, member);
    before_shmem_exit(shutdown_ingest, 0);
    batch_context = AllocSetContextCreate(TopMemoryContext, "eventbox ingest batch",
                                          ALLOCSET_DEFAULT_SIZES);

    static int error_backoff_ms = 0;  // static: survives the longjmp back to sigsetjmp
    sigjmp_buf local_sigjmp_buf;
    if (sigsetjmp(local_sigjmp_buf, 1) != 0) {
        // An ERROR outside a subscription's batch (building the consumer, reading the
        // subscriptions, recording errors): rebuild everything from the stored offsets (records
        // in memory were not stored and are read again) after a backoff.
        worker::recover_from_error(batch_context, destroy_state, &error_backoff_ms);
        needs_reload = true;
    }
    PG_exception_stack = &local_sigjmp_buf;

    for (;;) {
        MemoryContextSwitchTo(batch_context);
        // Failing subscriptions whose backoff is over are read again from their stored offsets.
        bool retry_due = call_cpp([] {
            if (subscriptions == nullptr || consumer == nullptr) return false;
            int64 now = worker::now_ms();
            for (Subscription* s : *subscriptions)
                if (s->failing && consumer->paused(s->id) && now >= s->retry_at_ms) return true;
            return false;
        });
        if (needs_reload || retry_due ||
            shmem::subscriptions_generation() != loaded_generation) {
            needs_reload = false;
            reload();
        }
        bool more = false, worked = false;
        std::size_t n = call_cpp([] { return consumer ? consumer->poll(round_size) : 0; });
        if (consumer != nullptr) worker::emit_kafka_logs(*consumer, "eventbox ingest");
        if (n >= round_size) more = true;
        std::size_t n_subs = call_cpp([] { return subscriptions ? subscriptions->size() : 0; });
        int64 now = worker::now_ms();
        for (std::size_t i = 0; i < n_subs; ++i) {
            Subscription* sub = call_cpp([&] { return (*subscriptions)[i]; });
            std::size_t stored = 0;
            if (store_isolated(sub, &stored)) {
                if (stored > 0) worked = true;
                // A subscription that failed is well again once it stores records, or stays
                // quiet for a while after resuming.
                if (sub->failing && !call_cpp([&] { return consumer->paused(sub->id); }) &&
                    (stored > 0 || now - sub->resumed_at_ms >= kQuietAfterResumeMs))
                    call_cpp([&] {
                        sub->failing = false;
                        sub->attempts = 0;
                        sub->backoff_ms = 0;
                        sub->error.clear();
                    });
            }
            MemoryContextReset(batch_context);
            CHECK_FOR_INTERRUPTS();
        }
        call_cpp([] {
            if (consumer != nullptr) consumer->release();
        });
        if (n_subs > 0) error_backoff_ms = 0;
        if (subscriptions != nullptr && consumer != nullptr) record_errors();
        MemoryContextSwitchTo(TopMemoryContext);
        MemoryContextReset(batch_context);
        // PostgreSQL holds table statistics back while flushes would come less than a second
        // apart (by the last commit's time, which stands still while the worker is idle): after
        // a second without batches they are flushed, so autovacuum sees the last ones too.
        if (worked)
            last_batch_at = GetCurrentTimestamp();
        else if (TimestampDifferenceExceeds(last_batch_at, GetCurrentTimestamp(), 1000))
            pgstat_report_stat(true);

        WaitEvent event;
        (void)WaitEventSetWait(wait_set, more ? 0 : 1000, &event, 1, PG_WAIT_EXTENSION);
        ResetLatch(MyLatch);
        CHECK_FOR_INTERRUPTS();
        if (worker::reload_if_requested()) needs_reload = true;
    }
}
