// The relay background worker: reads committed outbox rows, hands them to the Kafka producer and,
// once the broker has acknowledged them, deletes them (or marks them sent) in one short
// transaction per batch. It sleeps on one WaitEventSet: its latch (set by send() at COMMIT),
// postmaster death, and librdkafka's queue event fd.
//
// PostgreSQL-side code: C++ objects live on the heap behind the pointers below and are reached
// only through call_cpp(); no object with a destructor lives on these stack frames.
extern "C" {
#include "postgres.h"

#include "access/transam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/procarray.h"
#include "tcop/tcopprot.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"
}

#include <algorithm>
#include <climits>

#include "pg/guc.hpp"
#include "kafka/options.hpp"
#include "kafka/producer.hpp"
#include "pg/boundary.hpp"
#include "pg/extension.hpp"
#include "outbox/relay_dispatch.hpp"
#include "outbox/relay_recheck.hpp"
#include "outbox/http_client.hpp"
#include "outbox/http_relay.hpp"
#include "metrics/counters.hpp"
#include "pg/shmem.hpp"
#include "workers/common.hpp"

using eventbox::pg::call_cpp;
using eventbox::pg::pg_guard;
using eventbox::worker::now_ms;

namespace eventbox {

namespace {

// Heap-owned C++ state, destroyed in reset() and at exit (never by static destructors).
kafka::Producer* producer = nullptr;
relay::Dispatcher* dispatcher = nullptr;
relay::Rechecks* rechecks = nullptr;
std::vector<uint32_t>* writers = nullptr;
std::vector<int64_t>* scan_ids = nullptr;  // ids of the current claim scan
http::Client* http_client = nullptr;        // HTTP destinations (nullptr: none)
http::Router* router = nullptr;             // rows to HTTP or Kafka
uint64 http_generation = 0;                 // of the destinations http_client was built with

int64 cursor = 0;                  // highest id read by a claim scan
TimestampTz last_sweep = 0;        // last full re-read of pending rows
TimestampTz last_purge = 0;        // last retention purge
char* config_fingerprint = nullptr;  // settings the current producer was built with
bool announced_idle = false;
bool needs_reset = true;           // rebuild producer and dispatcher before the next pass
WaitEventSet* wait_set = nullptr;
MemoryContext batch_context = nullptr;
metrics::LocalHistogram* latency = nullptr;  // publish latencies of the outcomes being written

SPIPlanPtr claim_plan, range_plan, refetch_plan, delete_plan, tid_delete_plan, sent_plan,
    failed_plan, purge_plan, purge_failed_plan;

constexpr const char* kRowColumns =
    "SELECT id, message_id, topic, key, payload, headers, attempts, next_attempt_at, created_at, "
    "ctid FROM eventbox.outbox ";

SPIPlanPtr prepare(const char* sql, int nargs, Oid* types) {
    return worker::prepare_kept("eventbox relay", sql, nargs, types);
}

void prepare_plans() {
    if (claim_plan != nullptr) return;
    Oid claim_types[2] = {INT8OID, INT4OID};
    claim_plan = prepare(psprintf("%s WHERE status = 'pending' AND id > $1 ORDER BY id LIMIT $2",
                                  kRowColumns),
                         2, claim_types);
    Oid range_types[3] = {INT8OID, INT8OID, INT4OID};
    range_plan = prepare(psprintf("%s WHERE status = 'pending' AND id >= $1 AND id <= $2 "
                                  "ORDER BY id LIMIT $3",
                                  kRowColumns),
                         3, range_types);
    Oid ids_type[1] = {INT8ARRAYOID};
    refetch_plan = prepare(
        psprintf("%s WHERE id = ANY($1) AND status = 'pending' ORDER BY id", kRowColumns), 1,
        ids_type);
    // Acknowledged rows are deleted where they were read (a TID scan: no index descent per
    // row); the ids deleted are checked by the caller.
    Oid tids_type[1] = {TIDARRAYOID};
    tid_delete_plan =
        prepare("DELETE FROM eventbox.outbox WHERE ctid = ANY ($1) RETURNING id", 1, tids_type);
    // What was not found there is deleted by ranges of consecutive acked ids.
    Oid range_pair_types[2] = {INT8ARRAYOID, INT8ARRAYOID};
    delete_plan = prepare(
        "DELETE FROM eventbox.outbox o USING unnest($1::int8[], $2::int8[]) AS r(lo, hi) "
        "WHERE o.id BETWEEN r.lo AND r.hi",
        2, range_pair_types);
    Oid sent_types[3] = {INT8ARRAYOID, INT4ARRAYOID, INT8ARRAYOID};
    // HTTP deliveries report partition and offset -1: no Kafka position.
    sent_plan = prepare(
        "UPDATE eventbox.outbox o SET status = 'sent', sent_at = now(), attempts = o.attempts + 1, "
        "kafka_partition = nullif(u.p, -1), kafka_offset = nullif(u.o, -1), "
        "next_attempt_at = NULL, last_error = NULL "
        "FROM unnest($1::int8[], $2::int4[], $3::int8[]) AS u(id, p, o) "
        "WHERE o.id = ANY ($1) AND o.id = u.id",
        3, sent_types);
    Oid failed_types[4] = {INT8ARRAYOID, TEXTARRAYOID, INT8ARRAYOID, BOOLARRAYOID};
    failed_plan = prepare(
        "UPDATE eventbox.outbox o SET attempts = o.attempts + 1, last_error = u.err, "
        "next_attempt_at = now() + u.delay * interval '1 millisecond', "
        "status = CASE WHEN u.give_up THEN 'failed' ELSE o.status END "
        "FROM unnest($1::int8[], $2::text[], $3::int8[], $4::bool[]) AS u(id, err, delay, give_up) "
        "WHERE o.id = ANY ($1) AND o.id = u.id AND o.status = 'pending'",
        4, failed_types);
    // The ids to purge are an array, not an IN (subquery): a semi-join on id would let the
    // planner drive it with a whole scan of outbox_pkey (useful for merging), which it picks
    // when it planned on an empty outbox, and which then walks every dead row of a drained
    // backlog. `id = ANY (array)` can only be an index condition (the ordered subquery can only
    // read its partial index: sorts are off).
    Oid purge_types[2] = {INT4OID, INT4OID};
    purge_plan = prepare(
        "DELETE FROM eventbox.outbox WHERE id = ANY (ARRAY(SELECT id FROM eventbox.outbox "
        "WHERE status = 'sent' AND sent_at < now() - $1 * interval '1 second' "
        "ORDER BY sent_at LIMIT $2))",
        2, purge_types);
    // eventbox.dead_retention: failed rows (the relay gave up on them) by age.
    purge_failed_plan = prepare(
        "DELETE FROM eventbox.outbox WHERE id = ANY (ARRAY(SELECT id FROM eventbox.outbox "
        "WHERE status = 'failed' AND created_at < now() - $1 * interval '1 second' "
        "ORDER BY created_at LIMIT $2))",
        2, purge_types);
}

// Settings that require a new producer and dispatcher when they change.
char* current_fingerprint() {
    return MemoryContextStrdup(
        TopMemoryContext,
        psprintf("%s|%d|%d|%d|%d|%d|%d|%d|%d", guc::brokers, guc::max_message_bytes,
                 guc::relay_max_in_flight,
                 guc::relay_message_timeout_ms, guc::relay_linger_ms, guc::relay_retry_backoff_ms,
                 guc::relay_retry_backoff_max_ms, guc::relay_max_attempts, guc::relay_batch_size));
}

void rebuild_wait_set() {
    if (wait_set != nullptr) FreeWaitEventSet(wait_set);
    wait_set = CreateWaitEventSet(TopMemoryContext, 4);
    AddWaitEventToSet(wait_set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, nullptr);
    AddWaitEventToSet(wait_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, nullptr, nullptr);
    if (producer != nullptr)
        AddWaitEventToSet(wait_set, WL_SOCKET_READABLE, producer->event_fd(), nullptr, nullptr);
    if (http_client != nullptr)
        AddWaitEventToSet(wait_set, WL_SOCKET_READABLE, http_client->event_fd(), nullptr, nullptr);
}

// Drops all in-memory state; every pending row is read again from the outbox.
void destroy_state() {
    delete producer;
    producer = nullptr;
    delete dispatcher;
    dispatcher = nullptr;
    delete router;
    router = nullptr;
    delete http_client;
    http_client = nullptr;
    delete rechecks;
    rechecks = nullptr;
    delete writers;
    writers = nullptr;
    delete scan_ids;
    scan_ids = nullptr;
    cursor = 0;
}

void shutdown_relay(int, Datum) { destroy_state(); }

// (Re)creates the producer and dispatcher for the current settings; leaves the relay idle when
// eventbox.brokers is empty.
void reset() {
    destroy_state();
    if (config_fingerprint != nullptr) pfree(config_fingerprint);
    config_fingerprint = current_fingerprint();
    if (guc::brokers[0] != '\0') {
        // HTTP destinations together may hold half of the relay's in-flight rows (each an equal
        // share): endpoints that hang leave the other half to Kafka.
        http_client = http_relay::load_client(
            static_cast<std::size_t>(Max(guc::relay_max_in_flight / 2, 1)), &http_generation);
        call_cpp([] {
            kafka::ProducerConfig config;
            config.brokers = guc::brokers;
            config.options = parse_kafka_options(guc::kafka_options ? guc::kafka_options : "");
            config.message_timeout_ms = guc::relay_message_timeout_ms;
            config.linger_ms = guc::relay_linger_ms;
            config.max_in_flight_messages = guc::relay_max_in_flight;
            config.max_message_bytes = guc::max_message_bytes;
            relay::Limits limits;
            limits.max_in_flight = static_cast<std::size_t>(guc::relay_max_in_flight);
            limits.max_waiting = limits.max_in_flight * 10;
            limits.backoff_ms = guc::relay_retry_backoff_ms;
            limits.backoff_max_ms = guc::relay_retry_backoff_max_ms;
            limits.max_attempts = guc::relay_max_attempts;
            producer = new kafka::Producer(config);
            if (http_client != nullptr) router = new http::Router(*producer, *http_client);
            dispatcher = new relay::Dispatcher(
                router != nullptr ? static_cast<relay::Sink&>(*router) : *producer, limits);
            rechecks = new relay::Rechecks();
            writers = new std::vector<uint32_t>();
            scan_ids = new std::vector<int64_t>();
        });
        ereport(LOG, (errmsg("eventbox relay publishing to %s", guc::brokers)));
        announced_idle = false;
        shmem::set_state("running");
    } else {
        if (!announced_idle)
            ereport(LOG, (errmsg("eventbox relay idle: eventbox.brokers is empty"),
                          errhint("Set eventbox.brokers and reload the configuration.")));
        announced_idle = true;
        shmem::set_state("idle: no brokers");
    }
    rebuild_wait_set();
}

// Feeds delivery reports to the dispatcher.
void take_deliveries() {
    call_cpp([] {
        int64_t now = now_ms();
        for (const kafka::Delivery& d : producer->deliveries())
            dispatcher->on_delivery(d.id, d.err, d.permanent, d.counts, d.partition, d.offset,
                                    d.error, now);
        producer->deliveries().clear();
    });
}

// Canonical text of a uuid, written into `out` (37 bytes).
void format_uuid(const pg_uuid_t* uuid, char* out) {
    static const char hex[] = "0123456789abcdef";
    char* p = out;
    for (int i = 0; i < UUID_LEN; ++i) {
        if (i == 4 || i == 6 || i == 8 || i == 10) *p++ = '-';
        *p++ = hex[uuid->data[i] >> 4];
        *p++ = hex[uuid->data[i] & 15];
    }
    *p = '\0';
}

// Reads the headers of a row into a palloc'd array; returns the count.
std::size_t read_headers(Jsonb* jb, relay::Header** out) {
    *out = nullptr;
    uint32 count = JB_ROOT_COUNT(jb);
    if (count == 0 || !JB_ROOT_IS_OBJECT(jb)) return 0;
    auto* headers = static_cast<relay::Header*>(palloc(sizeof(relay::Header) * count));
    std::size_t n = 0;
    JsonbIterator* it = JsonbIteratorInit(&jb->root);
    JsonbValue key, value;
    JsonbIteratorToken token;
    while ((token = JsonbIteratorNext(&it, &key, true)) != WJB_DONE) {
        if (token != WJB_KEY) continue;
        JsonbIteratorNext(&it, &value, true);
        if (value.type != jbvString || n >= count) continue;
        headers[n].name = std::string_view(key.val.string.val, key.val.string.len);
        headers[n].value = std::string_view(value.val.string.val, value.val.string.len);
        ++n;
    }
    *out = headers;
    return n;
}

// Nothing is published before it is durable: a row committed asynchronously (a handler's
// send, a session with synchronous_commit off) could otherwise reach Kafka and then vanish in a
// crash. Every commit the pass's snapshot sees lies before publish_lsn (the WAL's insert
// position right after the snapshot was taken); the WAL is flushed up to it once, before the
// first row of the pass is offered (a pass with nothing to send flushes nothing).
XLogRecPtr publish_lsn = InvalidXLogRecPtr;

// The end of the WAL inserted so far, as a position XLogFlush() accepts. GetXLogInsertRecPtr()
// is where the next record will start: right after a page boundary that lies past the page
// header, which is not written yet, and flushing to it fails ("xlog flush request ... is not
// satisfied"): the relay's pass failed, and kept failing until other WAL was written, and rows
// it had in flight were published again.
XLogRecPtr inserted_wal_end() {
    XLogRecPtr next = GetXLogInsertRecPtr();
    if (XLogSegmentOffset(next, wal_segment_size) == SizeOfXLogLongPHD)
        return next - SizeOfXLogLongPHD;
    if (next % XLOG_BLCKSZ == SizeOfXLogShortPHD) return next - SizeOfXLogShortPHD;
    return next;
}

// Offers every row of the last SPI result to the dispatcher; returns the ids in order.
int64 offer_result(int64* last_id, std::vector<int64_t>* ids) {
    SPITupleTable* table = SPI_tuptable;
    TupleDesc desc = table->tupdesc;
    int64 now = now_ms();
    if (SPI_processed > 0 && publish_lsn != InvalidXLogRecPtr) {
        XLogFlush(publish_lsn);
        publish_lsn = InvalidXLogRecPtr;
    }
    // One pass over each tuple: SPI_getbinval() per column walked the row from its start for
    // every column behind a variable-length one.
    constexpr int kColumns = 10;
    if (desc->natts != kColumns) elog(ERROR, "eventbox relay: unexpected row shape");
    Datum v[kColumns];
    bool null[kColumns];
    for (uint64 i = 0; i < SPI_processed; ++i) {
        heap_deform_tuple(table->vals[i], desc, v, null);
        relay::Row row;
        row.id = DatumGetInt64(v[0]);
        char uuid_text[37];
        format_uuid(DatumGetUUIDP(v[1]), uuid_text);
        row.message_id = std::string_view(uuid_text, 36);
        text* topic = DatumGetTextPP(v[2]);
        row.topic = std::string_view(VARDATA_ANY(topic), VARSIZE_ANY_EXHDR(topic));
        if (!null[3]) {
            bytea* k = DatumGetByteaPP(v[3]);
            row.key = VARDATA_ANY(k);
            row.key_len = VARSIZE_ANY_EXHDR(k);
        }
        if (!null[4]) {
            bytea* p = DatumGetByteaPP(v[4]);
            row.payload = VARDATA_ANY(p);
            row.payload_len = VARSIZE_ANY_EXHDR(p);
        }
        relay::Header* headers;
        row.n_headers = read_headers(DatumGetJsonbP(v[5]), &headers);
        row.headers = headers;
        row.attempts = DatumGetInt32(v[6]);
        row.not_before_ms = null[7] ? 0 : DatumGetTimestampTz(v[7]) / 1000;
        row.created_ms = DatumGetTimestampTz(v[8]) / 1000;
        auto* tid = reinterpret_cast<ItemPointer>(DatumGetPointer(v[9]));
        row.tid = (static_cast<uint64>(ItemPointerGetBlockNumber(tid)) << 16) |
                  ItemPointerGetOffsetNumber(tid);
        call_cpp([&] {
            dispatcher->offer(row, now);
            if (ids != nullptr) ids->push_back(row.id);
        });
        *last_id = row.id;
    }
    return static_cast<int64>(SPI_processed);
}

ArrayType* int8_array(const int64* values, int n) {
    Datum* datums = static_cast<Datum*>(palloc(sizeof(Datum) * Max(n, 1)));
    for (int i = 0; i < n; ++i) datums[i] = Int64GetDatum(values[i]);
    return construct_array(datums, n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE);
}

void exec(SPIPlanPtr plan, Datum* values, bool read_only, int expected) {
    worker::exec_kept("eventbox relay", plan, values, read_only, expected);
}

// Deletes the rows of the sorted ids by ranges of consecutive ids (every id of a range
// acknowledged); returns how many it deleted.
uint64 delete_id_ranges(const int64* ids, int n) {
    if (n == 0) return 0;
    int64* los = static_cast<int64*>(palloc(sizeof(int64) * n));
    int64* his = static_cast<int64*>(palloc(sizeof(int64) * n));
    int runs = 0;
    for (int i = 0; i < n; ++i) {
        if (runs > 0 && ids[i] <= his[runs - 1] + 1) {
            his[runs - 1] = Max(his[runs - 1], ids[i]);
        } else {
            los[runs] = his[runs] = ids[i];
            ++runs;
        }
    }
    Datum values[2] = {PointerGetDatum(int8_array(los, runs)),
                       PointerGetDatum(int8_array(his, runs))};
    exec(delete_plan, values, false, SPI_OK_DELETE);
    return SPI_processed;
}

struct AckedRow {
    int64 id;
    uint64 tid;
};

// Deletes acknowledged rows at the tids they were read from (rows sorted by id), in a
// subtransaction; sets done[i] for each row deleted and returns their count. The acks of a
// pass come from many partitions: their ids are rarely consecutive (about two per range over
// 32 partitions), and a delete by id ranges descended the index and restarted a bitmap heap
// scan per range. A row updated since it was read (a failed attempt is written as a new
// version) is not found at its tid and is left to the caller. A tid that holds another row
// now (the row was deleted by someone else, its space vacuumed and reused) would delete that
// row: then the subtransaction is rolled back and every row is left to the caller.
uint64 delete_at_tids(const AckedRow* rows, int n, bool* done) {
    auto* tids = static_cast<ItemPointerData*>(palloc(sizeof(ItemPointerData) * n));
    Datum* datums = static_cast<Datum*>(palloc(sizeof(Datum) * n));
    int k = 0;
    for (int i = 0; i < n; ++i) {
        if (rows[i].tid == 0) continue;
        ItemPointerSet(&tids[k], static_cast<BlockNumber>(rows[i].tid >> 16),
                       static_cast<OffsetNumber>(rows[i].tid & 0xffff));
        datums[k] = PointerGetDatum(&tids[k]);
        ++k;
    }
    if (k == 0) return 0;
    Datum values[1] = {PointerGetDatum(
        construct_array(datums, k, TIDOID, sizeof(ItemPointerData), false, TYPALIGN_SHORT))};
    volatile uint64 deleted = 0;
    worker::Subtransaction sub = worker::begin_subtransaction();
    PG_TRY();
    {
        worker::exec_kept("eventbox relay", tid_delete_plan, values, false,
                          SPI_OK_DELETE_RETURNING, worker::Access::kTid);
        uint64 found = 0;
        bool foreign = false;
        for (uint64 r = 0; r < SPI_processed && !foreign; ++r) {
            bool isnull;
            int64 id = DatumGetInt64(
                SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1, &isnull));
            const AckedRow* hit = std::lower_bound(
                rows, rows + n, id, [](const AckedRow& a, int64 v) { return a.id < v; });
            if (hit == rows + n || hit->id != id || done[hit - rows]) {
                foreign = true;
            } else {
                done[hit - rows] = true;
                ++found;
            }
        }
        worker::end_subtransaction(sub, !foreign);
        if (foreign) {
            memset(done, 0, sizeof(bool) * n);
            ereport(LOG, (errmsg("eventbox relay: a row read for delivery was replaced at its "
                                 "place in the table; the acknowledged rows are deleted by id")));
        } else {
            deleted = found;
        }
    }
    PG_CATCH();
    {
        ReThrowError(worker::abort_subtransaction(sub));
    }
    PG_END_TRY();
    return deleted;
}

// Deletes the acknowledged rows (eventbox.outbox_retention 0): at their tids, the rest by id.
uint64 delete_acked(const relay::Acked* acked, int n) {
    auto* rows = static_cast<AckedRow*>(palloc(sizeof(AckedRow) * n));
    for (int i = 0; i < n; ++i) rows[i] = AckedRow{acked[i].id, acked[i].tid};
    std::sort(rows, rows + n, [](const AckedRow& a, const AckedRow& b) { return a.id < b.id; });
    bool* done = static_cast<bool*>(palloc0(sizeof(bool) * n));
    uint64 deleted = delete_at_tids(rows, n, done);
    int64* rest = static_cast<int64*>(palloc(sizeof(int64) * n));
    int m = 0;
    for (int i = 0; i < n; ++i)
        if (!done[i]) rest[m++] = rows[i].id;
    return deleted + delete_id_ranges(rest, m);
}

// Writes acknowledged and failed deliveries back to the outbox.
// Rows the outcomes written in the current transaction took out of 'pending' (sent, deleted,
// given up), for metrics::outbox_settled() once it committed.
uint64 settled_in_transaction = 0;

void write_outcomes() {
    settled_in_transaction = 0;
    const std::vector<relay::Acked>& acked = dispatcher->acked();
    int n = static_cast<int>(acked.size());
    if (n > 0) {
        // Delivery reports were taken just before this pass: "now" is when the acks arrived.
        int64 now = now_ms();
        latency->clear();
        for (int i = 0; i < n; ++i)
            if (acked[i].created_ms != 0) latency->observe_us((now - acked[i].created_ms) * 1000);
        if (guc::outbox_retention_s == 0) {
            settled_in_transaction += delete_acked(acked.data(), n);
        } else {
            int64* ids = static_cast<int64*>(palloc(sizeof(int64) * n));
            Datum* partitions = static_cast<Datum*>(palloc(sizeof(Datum) * n));
            int64* offsets = static_cast<int64*>(palloc(sizeof(int64) * n));
            for (int i = 0; i < n; ++i) {
                ids[i] = acked[i].id;
                partitions[i] = Int32GetDatum(acked[i].partition);
                offsets[i] = acked[i].offset;
            }
            Datum values[3] = {
                PointerGetDatum(int8_array(ids, n)),
                PointerGetDatum(construct_array(partitions, n, INT4OID, 4, true, TYPALIGN_INT)),
                PointerGetDatum(int8_array(offsets, n))};
            exec(sent_plan, values, false, SPI_OK_UPDATE);
            settled_in_transaction += SPI_processed;
        }
    }
    const std::vector<relay::Failed>& failed = dispatcher->failed();
    int m = static_cast<int>(failed.size());
    if (m > 0) {
        int64* ids = static_cast<int64*>(palloc(sizeof(int64) * m));
        Datum* errors = static_cast<Datum*>(palloc(sizeof(Datum) * m));
        int64* delays = static_cast<int64*>(palloc(sizeof(int64) * m));
        Datum* give_up = static_cast<Datum*>(palloc(sizeof(Datum) * m));
        for (int i = 0; i < m; ++i) {
            ids[i] = failed[i].id;
            errors[i] = CStringGetTextDatum(failed[i].error.c_str());
            delays[i] = failed[i].retry_in_ms;
            give_up[i] = BoolGetDatum(failed[i].give_up);
            settled_in_transaction += failed[i].give_up ? 1 : 0;
        }
        Datum values[4] = {
            PointerGetDatum(int8_array(ids, m)),
            PointerGetDatum(construct_array(errors, m, TEXTOID, -1, false, TYPALIGN_INT)),
            PointerGetDatum(int8_array(delays, m)),
            PointerGetDatum(construct_array(give_up, m, BOOLOID, 1, true, TYPALIGN_CHAR))};
        exec(failed_plan, values, false, SPI_OK_UPDATE);
        ereport(LOG, (errmsg("eventbox relay: %d message(s) failed delivery; first: %s", m,
                             failed[0].error.c_str())));
    }
}

bool xid_running(uint32_t xid) {
    return pg_guard([&] { return TransactionIdIsInProgress(static_cast<TransactionId>(xid)); });
}

// Re-reads pending rows in [lo, hi] (late commits, sweeps); what does not fit in the dispatcher
// now is scheduled again.
// Re-reads pending rows in [lo, hi] (late commits, sweeps). Returns false when the dispatcher
// ran out of room before the whole range was read.
bool read_range(int64 lo, int64 hi) {
    while (lo <= hi) {
        std::size_t room = call_cpp([] { return dispatcher->capacity(); });
        if (room == 0) return false;
        int limit = static_cast<int>(Min(room, static_cast<std::size_t>(guc::relay_batch_size)));
        Datum values[3] = {Int64GetDatum(lo), Int64GetDatum(hi), Int32GetDatum(limit)};
        exec(range_plan, values, true, SPI_OK_SELECT);
        int64 last = lo;
        int64 n = offer_result(&last, nullptr);
        if (n < limit) return true;
        lo = last + 1;
    }
    return true;
}

// One pass: write back outcomes, then read due, late and new rows and dispatch them.
// Returns true when more work is already waiting.
bool iterate() {
    bool more = false;
    int64 claimed = 0;
    // The outcomes this pass writes; rows offered below may add failures (refused by the
    // producer at once), which stay for the next pass.
    std::size_t acked = call_cpp([] { return dispatcher->acked().size(); });
    std::size_t failed = call_cpp([] { return dispatcher->failed().size(); });

    SetCurrentStatementStartTimestamp();  // now() of this transaction
    StartTransactionCommand();
    pg::lock_schema_or_exit();
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "eventbox relay: SPI_connect failed");
    prepare_plans();
    PushActiveSnapshot(GetTransactionSnapshot());
    write_outcomes();
    PopActiveSnapshot();

    // Which gaps are read for the last time must be decided before the snapshot is taken.
    TimestampTz now = GetCurrentTimestamp();
    bool sweep = TimestampDifferenceExceeds(last_sweep, now, guc::relay_sweep_interval_s * 1000);
    if (sweep) last_sweep = now;
    int n_ranges = 0;
    relay::IdRange* ranges = nullptr;
    call_cpp([&] {
        if (sweep && cursor > 0) rechecks->add(1, cursor, {});
        const std::vector<relay::IdRange>& pass = rechecks->begin_pass(xid_running);
        n_ranges = static_cast<int>(pass.size());
        if (n_ranges > 0) {
            ranges = static_cast<relay::IdRange*>(
                pg_guard([&] { return palloc(sizeof(relay::IdRange) * pass.size()); }));
            std::copy(pass.begin(), pass.end(), ranges);
        }
    });

    PushActiveSnapshot(GetTransactionSnapshot());
    // Read after the snapshot: a row it sees that committed after a destination change is
    // never routed by the old destinations (the generation moves before that change commits).
    if (http_relay::generation() != http_generation) {
        PopActiveSnapshot();
        SPI_finish();
        CommitTransactionCommand();
        call_cpp([&] { dispatcher->clear_outcomes(acked, failed); });
        shmem::count_messages(acked);
        if (acked > 0) metrics::relay_published(acked, *latency);
        if (failed > 0) metrics::relay_failures(failed);
        metrics::outbox_settled(settled_in_transaction);
        needs_reset = true;
        return true;
    }
    publish_lsn = inserted_wal_end();
    // Writers read after the snapshot: any id this scan cannot see yet belongs to one of them.
    call_cpp([] { shmem::outbox_writers(*writers); });

    // Rows whose retry or turn has come.
    int n_refetch = 0;
    int64* refetch_ids = nullptr;
    call_cpp([&] {
        const std::vector<int64_t>& due =
            dispatcher->due_ids(now_ms(), static_cast<std::size_t>(guc::relay_batch_size));
        n_refetch = static_cast<int>(due.size());
        if (n_refetch > 0) {
            refetch_ids = static_cast<int64*>(pg_guard([&] { return palloc(sizeof(int64) * due.size()); }));
            std::copy(due.begin(), due.end(), refetch_ids);
        }
    });
    if (n_refetch > 0) {
        Datum values[1] = {PointerGetDatum(int8_array(refetch_ids, n_refetch))};
        exec(refetch_plan, values, true, SPI_OK_SELECT);
        int64 last = 0;
        offer_result(&last, nullptr);
        call_cpp([] { dispatcher->refetch_done(); });
    }

    // Gaps first, then new rows, in one snapshot: a row that committed late is offered before
    // any row of its key that committed after it.
    int fully_read = 0;
    while (fully_read < n_ranges && read_range(ranges[fully_read].lo, ranges[fully_read].hi))
        ++fully_read;
    call_cpp([&] { rechecks->end_pass(static_cast<std::size_t>(fully_read)); });

    // New rows above the cursor, only when every gap was read whole in this snapshot.
    std::size_t room = call_cpp([] { return dispatcher->capacity(); });
    if (fully_read == n_ranges && room > 0) {
        int limit = static_cast<int>(Min(room, static_cast<std::size_t>(guc::relay_batch_size)));
        Datum values[2] = {Int64GetDatum(cursor), Int32GetDatum(limit)};
        exec(claim_plan, values, true, SPI_OK_SELECT);
        int64 last = cursor;
        call_cpp([] { scan_ids->clear(); });
        claimed = offer_result(&last, scan_ids);
        call_cpp([] {
            relay::IdRange gaps = relay::scan_gaps(cursor, *scan_ids);
            rechecks->add(gaps.lo, gaps.hi, *writers);
        });
        cursor = last;
        more = claimed == limit;
    }
    PopActiveSnapshot();

    // Sent rows past eventbox.outbox_retention, also when it is 0: rows kept under an earlier
    // setting would stay forever otherwise (the probe of the empty partial index costs nothing).
    // Failed rows past eventbox.dead_retention, when set.
    if (TimestampDifferenceExceeds(last_purge, now, 1000)) {
        Datum values[2] = {Int32GetDatum(guc::outbox_retention_s),
                           Int32GetDatum(guc::relay_batch_size)};
        PushActiveSnapshot(GetTransactionSnapshot());
        exec(purge_plan, values, false, SPI_OK_DELETE);
        uint64 purged = SPI_processed;
        bool full = purged == static_cast<uint64>(guc::relay_batch_size);
        if (guc::dead_retention_s > 0) {
            values[0] = Int32GetDatum(guc::dead_retention_s);
            exec(purge_failed_plan, values, false, SPI_OK_DELETE);
            purged += SPI_processed;
            full = full || SPI_processed == static_cast<uint64>(guc::relay_batch_size);
        }
        PopActiveSnapshot();
        metrics::purged(metrics::PurgedTable::kOutbox, purged);
        if (full) more = true;
        else last_purge = now;
    }

    SPI_finish();
    CommitTransactionCommand();
    pgstat_report_stat(false);  // lets autovacuum see the deletes
    more = call_cpp([&] {
        dispatcher->clear_outcomes(acked, failed);
        return !dispatcher->failed().empty();
    }) || more;
    shmem::count_messages(acked);
    if (acked > 0) metrics::relay_published(acked, *latency);
    if (failed > 0) metrics::relay_failures(failed);
    metrics::outbox_settled(settled_in_transaction);
    return more;
}

}  // namespace

}  // namespace eventbox

extern "C" PGDLLEXPORT void eventbox_relay_main(Datum);

extern "C" void eventbox_relay_main(Datum arg) {
    using namespace eventbox;
    worker::setup_signals();
    BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(arg), InvalidOid, 0);
    worker::apply_worker_settings(true);
    shmem::attach_worker(shmem::Role::kRelay);
    before_shmem_exit(shutdown_relay, 0);
    batch_context = AllocSetContextCreate(TopMemoryContext, "eventbox relay batch",
                                          ALLOCSET_DEFAULT_SIZES);
    latency = static_cast<metrics::LocalHistogram*>(
        MemoryContextAllocZero(TopMemoryContext, sizeof(metrics::LocalHistogram)));

    static int error_backoff_ms = 0;  // static: survives the longjmp back to sigsetjmp
    sigjmp_buf local_sigjmp_buf;
    if (sigsetjmp(local_sigjmp_buf, 1) != 0) {
        // An ERROR in a batch: start over from the outbox after a backoff.
        worker::recover_from_error(batch_context, nullptr, &error_backoff_ms);
        needs_reset = true;
    }
    PG_exception_stack = &local_sigjmp_buf;

    for (;;) {
        if (needs_reset) {
            reset();
            needs_reset = false;
        }
        bool more = false;
        MemoryContextSwitchTo(batch_context);
        if (producer != nullptr) {
            call_cpp([] { producer->poll(); });
            worker::emit_kafka_logs(*producer, "eventbox relay");
            if (call_cpp([] { return producer->fatal(); })) {
                ereport(LOG, (errmsg("eventbox relay: recreating the Kafka producer after a "
                                     "fatal error")));
                needs_reset = true;
                continue;
            }
            take_deliveries();
            if (http_client != nullptr) http_relay::take_outcomes(*http_client, *dispatcher);
            more = iterate();
            if (needs_reset) continue;
            error_backoff_ms = 0;
        }
        MemoryContextSwitchTo(TopMemoryContext);
        MemoryContextReset(batch_context);

        long timeout = guc::relay_poll_interval_ms;
        if (producer != nullptr) {
            int64 due = call_cpp([] { return dispatcher->next_due_ms(); });
            if (due != INT64_MAX) timeout = Min(timeout, Max(due - now_ms(), 0L));
            if (!call_cpp([] { return rechecks->empty(); })) timeout = Min(timeout, 250L);
            if (http_client != nullptr) {
                long http_due = call_cpp([] { return http_client->timeout_ms(now_ms()); });
                if (http_due >= 0) timeout = Min(timeout, http_due);
            }
        }
        if (more) timeout = 0;
        WaitEvent event;
        (void)WaitEventSetWait(wait_set, timeout, &event, 1, PG_WAIT_EXTENSION);
        ResetLatch(MyLatch);
        CHECK_FOR_INTERRUPTS();
        if (worker::reload_if_requested()) {
            char* fingerprint = current_fingerprint();
            if (strcmp(fingerprint, config_fingerprint) != 0) {
                ereport(LOG, (errmsg("eventbox relay: settings changed; restarting the producer")));
                needs_reset = true;
            }
            pfree(fingerprint);
        }
    }
}
