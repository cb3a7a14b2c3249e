// Finding lanes with work by the plain probe, and reading the messages of a lane the pass holds:
// the first ones of its live range from the low-water mark, then its queued replays, leaving out
// those that cannot run now. PostgreSQL side (see handlers/pass_internal.hpp).
extern "C" {
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
}

#include "handlers/pass_internal.hpp"
#include "pg/shmem.hpp"

namespace eventbox::handlers {

namespace {

// The next lane with work after ($2, $3) (up to ($4, $5) inclusive in the second statement):
// a pass looks for lanes only as far as it needs them. The lanes' ranges come from
// eventbox.inbox_positions in key order (its primary key), each with one descent of
// inbox_todo_idx from its position, below which no row waits but those a read left out: handled
// rows above it are walked (their status is on the row), those below are not; the left-out ones
// as the probes look for them (EVENTBOX_LANE_LEFT_OUT). ORDER BY "offset" LIMIT 1 rather than
// EXISTS, which drops the ORDER BY and lets inbox_pkey look as cheap (the workers turn sorts off).
#define NEXT_LANE(UPTO) \
    "SELECT p.topic, p.\"partition\" FROM eventbox.inbox_positions p"                           \
    " WHERE p.subscription = $1 AND (p.topic, p.\"partition\") > ($2, $3)" UPTO                 \
    "   AND ((SELECT 1 FROM eventbox.inbox i"                                                   \
    "         WHERE i.subscription = $1 AND i.topic = p.topic"                                  \
    "           AND i.\"partition\" = p.\"partition\" AND (i.mode = 'replay') = p.replay"       \
    "           AND i.\"offset\" >= p.position AND i.status IN ('received', 'retry')"           \
    "         ORDER BY i.\"offset\" LIMIT 1) IS NOT NULL"                                       \
    "   OR " EVENTBOX_LANE_LEFT_OUT("p.topic", "p.\"partition\"") ")"                           \
    " ORDER BY p.topic, p.\"partition\" LIMIT 1"
KeptStatement next_lane_statement{NEXT_LANE(""), 3, {TEXTOID, TEXTOID, INT4OID}, nullptr};
KeptStatement next_lane_upto_statement{NEXT_LANE(" AND (p.topic, p.\"partition\") <= ($4, $5)"),
                                       5,
                                       {TEXTOID, TEXTOID, INT4OID, TEXTOID, INT4OID},
                                       nullptr};
#undef NEXT_LANE

// Keys of a lane that wait for a retry (ordering 'key'). The inner ORDER BY (a subquery
// with one is planned on its own) pins inbox_retry_idx, the only index in that order: the
// todo index or inbox_pkey would walk the lane's (the subscription's) backlog.
KeptStatement waiting_keys_statement{
    "SELECT DISTINCT w.key FROM (SELECT i.key FROM eventbox.inbox i"
    " WHERE i.subscription = $1 AND i.topic = $2 AND i.\"partition\" = $3"
    "   AND i.status = 'retry' AND i.next_attempt_at > clock_timestamp()"
    " ORDER BY i.next_attempt_at) w",
    3,
    {TEXTOID, TEXTOID, INT4OID},
    nullptr};

// A locked lane's first messages, read after the lock was taken. Messages that cannot run
// now are left out so they do not use up the limit: without a handler when they are kept
// ($5; $9: a handler takes every type, $10: the types handlers take), behind a waiting
// message of their key ($6, $7: ordering 'key'), or waiting themselves when nothing waits
// behind them ($8: ordering 'none'). A read starts at the range's low-water mark or durable
// position, the higher ($11, an index condition: the descent lands past the entries of the
// messages handled before; -1 without either), or lower, at the range's first message below
// it whose retry is due: a position passes the messages a read left out (docs/design/
// handlers.md, "Left out"), and one that waited for its retry and the messages of its key
// behind it are read from there. The inner ORDER BY pins inbox_retry_idx for that look-up (a
// descent to the lane's due retries, usually none).
#define LANE_READ(MODE, RMODE)                                                               \
    "SELECT i.message_id, i.key, i.event_type, i.attempts, i.next_attempt_at, i.ctid,"       \
    "       i.\"offset\""                                                                    \
    "  FROM eventbox.inbox i"                                                                \
    " WHERE i.subscription = $1 AND i.topic = $2 AND i.\"partition\" = $3"                   \
    "   AND i.status IN ('received', 'retry') AND " MODE                                     \
    "   AND i.\"offset\" >= least($11, coalesce((SELECT min(w.\"offset\") FROM ("            \
    "         SELECT r.\"offset\" FROM eventbox.inbox r"                                     \
    "          WHERE r.subscription = $1 AND r.topic = $2 AND r.\"partition\" = $3"          \
    "            AND r.next_attempt_at <= clock_timestamp() AND " RMODE                      \
    "            AND r.status IN ('received', 'retry') AND r.\"offset\" < $11"               \
    "          ORDER BY r.next_attempt_at) w), $11))"                                        \
    "   AND (NOT $5 OR $9 OR i.event_type = ANY ($10))"                                      \
    "   AND (i.key IS NULL OR NOT i.key = ANY ($6))"                                         \
    "   AND NOT ($7 AND i.key IS NULL)"                                                      \
    "   AND (NOT $8 OR i.next_attempt_at IS NULL OR i.next_attempt_at <= clock_timestamp())" \
    " ORDER BY i.\"offset\" LIMIT $4"
#define LANE_READ_TYPES                                                                        \
    {                                                                                          \
        TEXTOID, TEXTOID, INT4OID, INT4OID, BOOLOID, BYTEAARRAYOID, BOOLOID, BOOLOID, BOOLOID, \
            TEXTARRAYOID, INT8OID                                                              \
    }
// Live (and backfill) messages first, an index range of inbox_todo_idx of their own (IS
// FALSE: the planner turns it into an index condition, where NOT or <> would not be) from the
// position, the status tested on the row (the index holds every row); then,
// with the room left, the messages queued by eventbox.reprocess(), through inbox_replay_idx:
// a replay never holds a lane's live messages back by more than the pass it shares with
// them, and reading either costs what the batch costs, whatever is queued.
KeptStatement lane_statement{
    LANE_READ("(i.mode = 'replay') IS FALSE", "(r.mode = 'replay') IS FALSE"), 11, LANE_READ_TYPES,
    nullptr};
KeptStatement replay_lane_statement{LANE_READ("i.mode = 'replay'", "r.mode = 'replay'"), 11,
                                    LANE_READ_TYPES, nullptr};
#undef LANE_READ_TYPES
#undef LANE_READ

// The keys whose messages a read of the lane leaves out, as a bytea[] Datum (*n gets how
// many): with ordering 'key', those of messages waiting for a retry (*null_key_waits: one
// without a key waits); with on_dead 'block_key', those a dead message holds back.
Datum held_back_keys(const Pass& p, Datum topic, int32 partition, int* n, bool* null_key_waits) {
    bool isnull;
    int n_waiting = 0;
    Datum* waiting = nullptr;
    *null_key_waits = false;
    if (p.setup.options.ordering == Ordering::kKey) {
        Datum wargs[3] = {p.setup.name, topic, Int32GetDatum(partition)};
        exec(waiting_keys_statement, wargs, false, SPI_OK_SELECT);
        waiting = static_cast<Datum*>(palloc(sizeof(Datum) * Max(SPI_processed, 1)));
        for (uint64 r = 0; r < SPI_processed; ++r) {
            Datum key = SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1, &isnull);
            if (isnull)
                *null_key_waits = true;
            else
                waiting[n_waiting++] = key;
        }
    }
    if (p.setup.options.dead.block_key)
        dead_letters::add_blocked_keys(p.setup.name, topic, partition, &waiting, &n_waiting);
    pg::ArrayColumn waiting_keys(n_waiting, BYTEAOID);
    for (int k = 0; k < n_waiting; ++k) waiting_keys.set(k, waiting[k]);
    *n = n_waiting;
    return waiting_keys.get();
}

// Runs a lane read from `mark` (or from the range's durable position `floor`, when higher); if
// the marks may no longer hold once it ran, again from the position. Returns whether the rows
// read started at the position.
bool exec_lane_read(KeptStatement& statement, Datum* args, int64 mark, int64 floor) {
    args[10] = Int64GetDatum(Max(mark, floor));
    exec(statement, args, false, SPI_OK_SELECT);
    if (marks_on() && !marks_still_hold() && mark > floor) {
        args[10] = Int64GetDatum(floor);
        exec(statement, args, false, SPI_OK_SELECT);
        return true;
    }
    return mark <= floor;
}

// The offset of the first row of a lane read in SPI_tuptable (column 7).
int64 first_offset_read() {
    bool isnull;
    return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 7, &isnull));
}

// Adds the messages SPI_tuptable holds (a lane read) to lane l of the pass.
void add_lane_rows(Pass& p, std::size_t l) {
    bool isnull;
    for (uint64 r = 0; r < SPI_processed; ++r) {
        HeapTuple tuple = SPI_tuptable->vals[r];
        TupleDesc desc = SPI_tuptable->tupdesc;
        char* id = nullable_text(tuple, desc, 1);
        Datum key = SPI_getbinval(tuple, desc, 2, &isnull);
        bytea* key_bytes = isnull ? nullptr : DatumGetByteaPP(key);
        char* type = nullable_text(tuple, desc, 3);
        int32 attempts = DatumGetInt32(SPI_getbinval(tuple, desc, 4, &isnull));
        Datum next = SPI_getbinval(tuple, desc, 5, &isnull);
        int64 not_before = isnull ? 0 : DatumGetTimestampTz(next) / 1000;
        bool next_null = isnull;
        auto tid =
            reinterpret_cast<ItemPointer>(DatumGetPointer(SPI_getbinval(tuple, desc, 6, &isnull)));
        uint64 packed = (static_cast<uint64>(ItemPointerGetBlockNumber(tid)) << 16) |
                        ItemPointerGetOffsetNumber(tid);
        MessageRow row{id,
                       key_bytes ? VARDATA_ANY(key_bytes) : nullptr,
                       key_bytes ? VARSIZE_ANY_EXHDR(key_bytes) : 0,
                       type,
                       attempts,
                       !next_null,
                       not_before,
                       packed};
        p.work.add_message(l, row);
    }
}

}  // namespace

bool next_lane(Datum name, const char* after_topic, int32 after_partition, const char* upto_topic,
               int32 upto_partition, char** topic, int32* partition) {
    MemoryContext keep = CurrentMemoryContext;
    Datum args[5] = {name, CStringGetTextDatum(after_topic), Int32GetDatum(after_partition),
                     upto_topic ? CStringGetTextDatum(upto_topic) : (Datum)0,
                     Int32GetDatum(upto_partition)};
    exec(upto_topic ? next_lane_upto_statement : next_lane_statement, args, true, SPI_OK_SELECT);
    MemoryContextSwitchTo(keep);
    if (SPI_processed == 0) return false;
    bool isnull;
    *topic = nullable_text(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
    *partition =
        DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
    return true;
}

// With a snapshot taken after the lock: what another pass handled before releasing the lane is
// not read again.
void read_lane(Pass& p, std::size_t l, int per_lane) {
    const Options& options = p.setup.options;
    LaneId lane = p.work.lane_id(l);
    Datum topic = CStringGetTextDatum(lane.topic);
    int n_held_back;
    bool null_key_waits;
    Datum held_back = held_back_keys(p, topic, lane.partition, &n_held_back, &null_key_waits);
    // Whether a filter of the read may leave out a message that waits: then the rows it returns
    // are not the range's first waiting ones, and its marks stay where they are.
    bool filtered = n_held_back > 0 || null_key_waits || options.ordering == Ordering::kNone ||
                    (options.unhandled_keep && !p.setup.any_type);
    // Before the reads: a change that makes a row wait below the position and commits after
    // this moves the version the pass's raise of the position compares (advance_positions()).
    LanePosition durable = lane_position(p.setup.name, lane.topic, lane.partition);
    long position = -1;
    LaneMark mark = lane_mark(p.subscription, lane.topic, lane.partition, &position);
    Datum args[11] = {p.setup.name,
                      topic,
                      Int32GetDatum(lane.partition),
                      Int32GetDatum(per_lane),
                      BoolGetDatum(options.unhandled_keep),
                      held_back,
                      BoolGetDatum(null_key_waits),
                      BoolGetDatum(options.ordering == Ordering::kNone),
                      BoolGetDatum(p.setup.any_type),
                      p.setup.handled_types,
                      Int64GetDatum(kNoMark)};
    bool from_position = exec_lane_read(lane_statement, args, mark.live, durable.live);
    int n_read = static_cast<int>(SPI_processed);
    int64 first = n_read > 0 ? first_offset_read() : kNoMark;
    if (n_read > 0 && first < DatumGetInt64(args[10])) {
        // From a due retry below the mark or position: the messages of its key that reads left
        // out behind it wait above it, and the rise may lower the position to where this read
        // leaves them; the marks (above them) go at commit.
        durable.live = first;
        shmem::inbox_requeued_at_commit();
        note_lane_read(l, position, false, true, lane, durable, p.memory);
    } else {
        raise_mark(p.subscription, position, false, filtered);
        // A filtered read raises the position past what it left out (see LANE_READ), not the
        // marks: those are dropped with every change that lets left-out messages run.
        note_lane_read(l, position, marks_on() && position >= 0 && !filtered, from_position, lane,
                       durable, p.memory);
    }
    add_lane_rows(p, l);
    if (options.replays && n_read < per_lane) {
        args[3] = Int32GetDatum(per_lane - n_read);
        exec_lane_read(replay_lane_statement, args, marks_on() ? mark.replay : kNoMark,
                       durable.replay);
        raise_mark(p.subscription, position, true, filtered);
        // Replays mix in (the candidates' order is no longer the live rows' alone).
        if (SPI_processed > 0) {
            uncount_lane_read(l);
            note_replay_read(l);
        }
        add_lane_rows(p, l);
    }
    p.work.seal_lane(l);
}

}  // namespace eventbox::handlers
