// The relay's reads (see outbox/relay_worker.hpp): outbox rows due again, rows of late commits
// below the cursor, and new rows above it, each offered to the dispatcher as it is read. Nothing
// is offered before the WAL that made it visible is flushed.
#include "outbox/relay_worker.hpp"

extern "C" {
#include "access/htup_details.h"
#include "access/transam.h"
#include "access/twophase.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/uuid.h"
}

#include <algorithm>
#include <string_view>

#include "core/base64.hpp"
#include "inbox/raw_headers.hpp"
#include "pg/guc.hpp"
#include "workers/common.hpp"

namespace eventbox::relay_worker {

int64 cursor = 0;

namespace {

SPIPlanPtr claim_plan, range_plan, refetch_plan, prepared_plan, prepared_writers_plan;

// The rotated tables and eventbox.outbox_held directly, not through the view eventbox.outbox
// (docs/design/outbox-rotation.md), merged in id order: the rotated rows not settled (at or
// above the settled position W or in a stored gap, not held, in no ack row; `low` is the lower
// of W and the lowest gap, an index bound) and every held row, each with the transaction that
// wrote the version read (second, fixed-width: read without walking the row, see
// wal_to_flush()) and the kind of the row: 0 a rotated row, 1 a held row waiting to be sent (its
// columns are outbox_held's: a user may have changed them), 2 a held row given up or cancelled
// (not offered; a claim steps over it); last, the rotated table a rotated row is in
// (relay::Row::table: its ack row needs no lookup), -1 for a held row. Held rows are read
// whatever W is: W passes them, their copy in the rotated tables is settled. A
// restarted relay (cursor 0) thus reads a key's held row before its later rows: ids in order.
// Each branch has its own ORDER BY and LIMIT, so that both are planned as ordered index scans
// (the rotated tables' as a merge of their primary keys) and merged, each bounded by the batch;
// without them the join branch is planned unordered and sorted whole. A row above the highest
// held id and the highest acknowledged id is probed in neither (each a backward index step, once
// per statement): new rows, the bulk of every claim, then cost no probe (the anti-joins into
// outbox_held and the 3 ack tables took 8 buffer hits a row: a claim of 1,000 new rows took
// 2.3 ms with them, 0.9 ms without). Rows below the highest acknowledged id (gaps re-read while
// their writers run, rows due again, everything after a restart) are looked up in one hash of
// the ids acknowledged at or above the read's lowest id, built once per statement (a hashed
// NOT IN over eventbox._acked_ids(), whose ROWS keeps it hashed): probed one by one, each row read
// every ack row above it, detoasting its array, and with two writers whose transactions overlap
// a gap's re-read cost 2.6 ms a statement, 40 us a row (bench/NOTEBOOK.md, 2026-11-29, "gaps
// re-read").
// %1$s: the id condition of a branch; %2$s: the other branch's; %3$s: the LIMIT clause; %4$s:
// the lowest id the read can return.
constexpr const char* kRowsSql =
    "SELECT * FROM (("
    "SELECT r.id, r.row_xmin, r.message_id, r.topic, r.key, r.payload, r.headers, 0 AS attempts, "
    "NULL::timestamptz AS next_attempt_at, r.created_at, r.cause_subscription, "
    "r.cause_received_at, 0 AS kind, r.n::int4 AS n "
    "FROM eventbox._outbox_rows r "
    "WHERE %1$s AND r.id >= coalesce((SELECT least(s.settled_below, lower(s.gaps)) "
    "FROM eventbox.outbox_state s WHERE s.n = -1), 0) "
    "AND (r.id >= coalesce((SELECT s.settled_below FROM eventbox.outbox_state s "
    "WHERE s.n = -1), 0) OR (SELECT s.gaps FROM eventbox.outbox_state s WHERE s.n = -1) @> r.id) "
    "AND (r.id > (SELECT coalesce(max(h.id), 0) FROM eventbox.outbox_held h) "
    "OR NOT EXISTS (SELECT FROM eventbox.outbox_held h WHERE h.id = r.id)) "
    "AND (r.id > (SELECT coalesce(max(a.max_id), 0) FROM eventbox._outbox_acks a) "
    "OR r.id NOT IN (SELECT eventbox._acked_ids(%4$s))) ORDER BY r.id%3$s"
    ") UNION ALL ("
    "SELECT h.id, h.xmin, h.message_id, h.topic, h.key, h.payload, h.headers, h.attempts, "
    "h.next_attempt_at, h.created_at, h.cause_subscription, h.cause_received_at, "
    "CASE WHEN h.status = 'pending' THEN 1 ELSE 2 END, -1 "
    "FROM eventbox.outbox_held h WHERE %2$s ORDER BY h.id%3$s"
    ")) AS o ORDER BY id%3$s";

char* rows_sql(const char* condition, const char* limit, const char* lowest) {
    char* rotated = psprintf(condition, "r.id");
    char* held = psprintf(condition, "h.id");
    return psprintf(kRowsSql, rotated, held, limit, lowest);
}

}  // namespace

void prepare_read_plans() {
    if (claim_plan != nullptr) return;
    Oid claim_types[2] = {INT8OID, INT4OID};
    // A claim reads nothing below `low` either: after a restart (cursor 0) the hash then holds
    // the ids acknowledged above it, not every ack row the tables keep.
    claim_plan =
        worker::prepare_kept(kWho,
                             rows_sql("%s > $1", " LIMIT $2",
                                      "greatest($1, (SELECT least(s.settled_below, lower(s.gaps)) "
                                      "FROM eventbox.outbox_state s WHERE s.n = -1))"),
                             2, claim_types);
    Oid range_types[3] = {INT8OID, INT8OID, INT4OID};
    range_plan = worker::prepare_kept(
        kWho, rows_sql("%1$s >= $1 AND %1$s <= $2", " LIMIT $3", "$1"), 3, range_types);
    Oid ids_type[1] = {INT8ARRAYOID};
    refetch_plan = worker::prepare_kept(
        kWho, rows_sql("%s = ANY ($1)", "", "(SELECT min(x) FROM unnest($1) AS x)"), 1, ids_type);
    // Whether a transaction is prepared, from shared memory (the function, not the view: the
    // view joins pg_authid, which only a superuser may read).
    prepared_plan = worker::prepare_kept(
        kWho, "SELECT 1 FROM pg_catalog.pg_prepared_xact() LIMIT 1", 0, nullptr);
    // Those of them that hold a lock on this database's outbox id sequence: every writer of a
    // row draws its id from it (next_outbox_id(), the column's default), nextval() keeps a
    // RowExclusiveLock on it to the end of the transaction, and a prepared transaction keeps
    // that, also across a restart. The sequence, not the table: it is the same whichever table
    // a row goes to (docs/design/outbox-rotation.md), and a transaction that only deleted or
    // updated outbox rows is no writer. A prepared transaction's locks are those without a
    // pid, tied to its xid's lock by their virtual transaction (its backend's while it runs,
    // "-1/<xid>" once recovered).
    prepared_writers_plan = worker::prepare_kept(
        kWho,
        "WITH l AS MATERIALIZED (SELECT locktype, relation, database, transactionid, "
        "virtualtransaction FROM pg_catalog.pg_locks WHERE pid IS NULL) "
        "SELECT t.transactionid::text::int8 FROM l t JOIN l r USING (virtualtransaction) "
        "WHERE t.locktype = 'transactionid' AND r.locktype = 'relation' "
        "AND r.relation = 'eventbox.outbox_id_seq'::regclass "
        "AND r.database = (SELECT oid FROM pg_catalog.pg_database "
        "WHERE datname = pg_catalog.current_database())",
        0, nullptr);
}

void exec(SPIPlanPtr plan, Datum* values, bool read_only, int expected) {
    worker::exec_kept(kWho, plan, values, read_only, expected);
}

ArrayType* int8_array(const int64* values, int n) {
    Datum* datums = static_cast<Datum*>(palloc(sizeof(Datum) * Max(n, 1)));
    for (int i = 0; i < n; ++i) datums[i] = Int64GetDatum(values[i]);
    return construct_array(datums, n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE);
}

namespace {

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

// The headers a dead letter carries as they came (inbox/raw_headers.hpp), from the value of its
// __eventbox.raw_headers header: decoded into palloc'd memory, or -1 (with *bytes unset) when
// that value is not their base64, which then goes out as the plain header it is.
long expanded_headers(const JsonbValue& value, std::string_view* bytes) {
    std::string_view text(value.val.string.val, value.val.string.len);
    auto* buffer = static_cast<char*>(palloc(base64_decoded_bound(text.size())));
    long len = decode_base64(text, buffer);
    if (len < 0) return -1;
    std::string_view decoded(buffer, static_cast<std::size_t>(len));
    long n = inbox::count_raw_headers(decoded);
    if (n >= 0) *bytes = decoded;
    return n;
}

// Reads the headers of a row into a palloc'd array; returns the count. A dead letter's original
// headers (kRawHeadersHeader) come first, in their order, without a message_id header (the
// relay's own names the row); then the row's other headers.
std::size_t read_headers(Jsonb* jb, relay::Header** out) {
    *out = nullptr;
    uint32 count = JB_ROOT_COUNT(jb);
    if (count == 0 || !JB_ROOT_IS_OBJECT(jb)) return 0;
    std::string_view raw;
    long n_raw = 0;
    JsonbValue key, value;
    JsonbIteratorToken token;
    JsonbIterator* it = JsonbIteratorInit(&jb->root);
    while ((token = JsonbIteratorNext(&it, &key, true)) != WJB_DONE) {
        if (token != WJB_KEY) continue;
        JsonbIteratorNext(&it, &value, true);
        std::string_view name(key.val.string.val, key.val.string.len);
        if (name == inbox::kRawHeadersHeader && value.type == jbvString)
            n_raw = std::max(n_raw, expanded_headers(value, &raw));
    }
    std::size_t capacity = count + static_cast<std::size_t>(n_raw);
    auto* headers = static_cast<relay::Header*>(palloc(sizeof(relay::Header) * capacity));
    std::size_t n = 0;
    inbox::RawHeader h;
    while (inbox::next_raw_header(&raw, &h)) {
        if (h.name == "message_id") continue;
        headers[n].name = h.name;
        // A null value keeps a null data pointer; an empty one does not.
        headers[n].value =
            h.value == nullptr ? std::string_view() : std::string_view(h.value, h.value_len);
        ++n;
    }
    it = JsonbIteratorInit(&jb->root);
    while ((token = JsonbIteratorNext(&it, &key, true)) != WJB_DONE) {
        if (token != WJB_KEY) continue;
        JsonbIteratorNext(&it, &value, true);
        if (value.type != jbvString || n >= capacity) continue;
        std::string_view name(key.val.string.val, key.val.string.len);
        if (n_raw > 0 && name == inbox::kRawHeadersHeader) continue;
        headers[n].name = name;
        headers[n].value = std::string_view(value.val.string.val, value.val.string.len);
        ++n;
    }
    *out = headers;
    return n;
}

// Nothing is published before it is durable: a row committed asynchronously (a handler's
// send, a session with synchronous_commit off) could otherwise reach Kafka and then vanish in a
// crash. Every commit the pass's snapshot sees lies before publish_lsn (the WAL's insert
// position right after the snapshot was taken), the pass's own writes too: flushing to it is
// always enough, and is what a row this pass wrote itself waits for (see wal_to_flush()).
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

// The WAL the rows of the last SPI result wait for before any of them is offered: the commit
// records of the transactions that wrote them, where these committed asynchronously. The commit
// log keeps, for each group of transactions, the end of the latest asynchronous commit record
// among them until that is flushed (the bound PostgreSQL itself checks before it sets a hint
// bit); a synchronous commit was flushed before it became visible. So the relay waits for no
// WAL of its own (its outcomes, its own asynchronous commits) and, when every row it offers
// came from a synchronous commit, flushes nothing: with the insert position as the bound, each
// pass that wrote outcomes and offered rows waited for a flush of the WAL it had just written
// (bench/NOTEBOOK.md, 2026-11-29, "the relay's own WAL"). A row version this very transaction
// wrote (a row it held, read again) waits for everything before the snapshot, as before.
XLogRecPtr wal_to_flush(TupleDesc desc) {
    XLogRecPtr need = InvalidXLogRecPtr;
    TransactionId last = InvalidTransactionId;
    for (uint64 i = 0; i < SPI_processed; ++i) {
        bool null;
        Datum d = heap_getattr(SPI_tuptable->vals[i], 2, desc, &null);
        TransactionId writer = null ? InvalidTransactionId : DatumGetTransactionId(d);
        if (writer == last || !TransactionIdIsNormal(writer)) continue;  // frozen: long durable
        last = writer;
        if (TransactionIdIsCurrentTransactionId(writer)) return publish_lsn;
        need = Max(need, TransactionIdGetCommitLSN(writer));
    }
    return need;
}

// Offers every row of the last SPI result to the dispatcher but held rows not to be sent (and,
// for the claim scan `scan`, records every id); *last_id gets the last row's id. Returns the
// rows read.
int64 offer_result(int64* last_id, bool scan) {
    SPITupleTable* table = SPI_tuptable;
    TupleDesc desc = table->tupdesc;
    int64 now = worker::now_ms();
    constexpr int kColumns = 14;
    if (desc->natts != kColumns) elog(ERROR, "eventbox relay: unexpected row shape");
    XLogRecPtr flush = wal_to_flush(desc);
    if (flush != InvalidXLogRecPtr) XLogFlush(flush);
    // One pass over each tuple: SPI_getbinval() per column walked the row from its start for
    // every column behind a variable-length one.
    Datum v[kColumns];
    bool null[kColumns];
    for (uint64 i = 0; i < SPI_processed; ++i) {
        heap_deform_tuple(table->vals[i], desc, v, null);
        int32 kind = DatumGetInt32(v[12]);
        if (kind == 2) {
            // Held and given up or cancelled: not sent; a claim steps over it (no gap).
            int64 id = DatumGetInt64(v[0]);
            if (scan) rechecks.scanned(id);
            *last_id = id;
            continue;
        }
        relay::Row row;
        row.id = DatumGetInt64(v[0]);
        char uuid_text[37];
        format_uuid(DatumGetUUIDP(v[2]), uuid_text);
        row.message_id = std::string_view(uuid_text, 36);
        text* topic = DatumGetTextPP(v[3]);
        row.topic = std::string_view(VARDATA_ANY(topic), VARSIZE_ANY_EXHDR(topic));
        if (!null[4]) {
            bytea* k = DatumGetByteaPP(v[4]);
            row.key = VARDATA_ANY(k);
            row.key_len = VARSIZE_ANY_EXHDR(k);
        }
        if (!null[5]) {
            bytea* p = DatumGetByteaPP(v[5]);
            row.payload = VARDATA_ANY(p);
            row.payload_len = VARSIZE_ANY_EXHDR(p);
        }
        relay::Header* headers;
        row.n_headers = read_headers(DatumGetJsonbP(v[6]), &headers);
        row.headers = headers;
        row.attempts = DatumGetInt32(v[7]);
        row.not_before_ms = null[8] ? 0 : DatumGetTimestampTz(v[8]) / 1000;
        row.created_ms = DatumGetTimestampTz(v[9]) / 1000;
        row.table = static_cast<int16_t>(DatumGetInt32(v[13]));
        row.held = kind == 1;
        if (!null[10] && !null[11]) {
            text* sub = DatumGetTextPP(v[10]);
            row.cause_subscription = std::string_view(VARDATA_ANY(sub), VARSIZE_ANY_EXHDR(sub));
            row.cause_received_ms = DatumGetTimestampTz(v[11]) / 1000;
        }
        dispatcher.offer(row, now);
        if (scan) rechecks.scanned(row.id);
        *last_id = row.id;
    }
    return static_cast<int64>(SPI_processed);
}

// The outbox writers running now (after the pass's snapshot): the writers' slots, and the
// prepared transactions that drew an outbox id (they hold a lock on its sequence). A transaction
// that drew an id and was prepared leaves its backend's slot once that backend draws an id for
// its next transaction; it is still running (it may commit at any time, from any session, also
// after a restart), so its gap must not be forgotten. Prepared transactions that never wrote to
// the outbox (another application's, another database's) are not writers: one left prepared for
// days would keep every gap of its time otherwise.
void read_writers() {
    rechecks.read_writers();
    if (max_prepared_xacts <= 0) return;
    exec(prepared_plan, nullptr, true, SPI_OK_SELECT);
    if (SPI_processed == 0) return;  // the usual case: pg_locks is not read
    exec(prepared_writers_plan, nullptr, true, SPI_OK_SELECT);
    int m = static_cast<int>(SPI_processed);
    if (m == 0) return;
    auto* xids = static_cast<uint32*>(palloc(sizeof(uint32) * m));
    for (int i = 0; i < m; ++i) {
        bool isnull;
        Datum d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull);
        xids[i] = isnull ? InvalidTransactionId : static_cast<uint32>(DatumGetInt64(d));
    }
    rechecks.add_writers(xids, m);
}

// How many rows a read may ask for now: what the dispatcher has room for, at most a batch.
int read_limit(std::size_t room) {
    return static_cast<int>(Min(room, static_cast<std::size_t>(guc::relay_batch_size)));
}

// Rows whose retry or turn has come.
void refetch_due() {
    int n = 0;
    int64* ids =
        dispatcher.due_ids(worker::now_ms(), static_cast<std::size_t>(guc::relay_batch_size), &n);
    if (n == 0) return;
    Datum values[1] = {PointerGetDatum(int8_array(ids, n))};
    exec(refetch_plan, values, true, SPI_OK_SELECT);
    int64 last = 0;
    offer_result(&last, false);
    dispatcher.refetch_done();
}

// Re-reads pending rows in [lo, hi] (late commits). Returns false when the dispatcher
// ran out of room before the whole range was read.
bool read_range(int64 lo, int64 hi) {
    while (lo <= hi) {
        std::size_t room = dispatcher.capacity();
        if (room == 0) {
            read_lacked_room = true;
            return false;
        }
        int limit = read_limit(room);
        Datum values[3] = {Int64GetDatum(lo), Int64GetDatum(hi), Int32GetDatum(limit)};
        exec(range_plan, values, true, SPI_OK_SELECT);
        int64 last = lo;
        int64 n = offer_result(&last, false);
        if (n < limit) return true;
        lo = last + 1;
    }
    return true;
}

// New rows above the cursor, when the dispatcher has room; the gaps the scan saw are recorded
// for the next passes. Returns true when it filled its batch.
bool claim_new() {
    std::size_t room = dispatcher.capacity();
    if (room == 0) {
        read_lacked_room = true;
        return false;
    }
    int limit = read_limit(room);
    Datum values[2] = {Int64GetDatum(cursor), Int32GetDatum(limit)};
    exec(claim_plan, values, true, SPI_OK_SELECT);
    int64 last = cursor;
    rechecks.start_scan();
    int64 claimed = offer_result(&last, true);
    rechecks.end_scan(cursor);
    cursor = last;
    return claimed == limit;
}

}  // namespace

bool read_lacked_room = false;

bool read_rows(const relay::IdRange* ranges, int n_ranges) {
    read_lacked_room = false;
    publish_lsn = inserted_wal_end();
    // Writers read after the snapshot: any id this scan cannot see yet belongs to one of them.
    read_writers();
    refetch_due();
    // Gaps first, then new rows, in one snapshot: a row that committed late is offered before
    // any row of its key that committed after it.
    int fully_read = 0;
    while (fully_read < n_ranges && read_range(ranges[fully_read].lo, ranges[fully_read].hi))
        ++fully_read;
    rechecks.end_pass(fully_read);
    // New rows above the cursor, only when every gap was read whole in this snapshot.
    return fully_read == n_ranges && claim_new();
}

}  // namespace eventbox::relay_worker
