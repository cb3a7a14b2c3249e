// A handler worker's low-water marks and the lanes it knows, PostgreSQL side (the marks
// themselves are LaneMarks, handlers/low_water.hpp; docs/design/handlers.md tells why).
//
// A lane range's mark is an offset below which it provably has no message to handle: the
// first row of a lane read that no filter narrowed (no key waiting or blocked, ordering not
// 'none', no kept messages without a handler). Only this worker handles the lane's messages
// while it holds the lane, and handling only takes rows out of the waiting set; what makes a
// row wait again below a mark (a requeue, a replay, a record stored again at a lower offset)
// bumps the shared inbox generation before and after its commit (shmem::inbox_generation()):
// the marks are dropped when the generation moved, at a pass's start, and after any read that
// used them (which is then read again without them). They are also dropped every
// kMarksMaxAgeMs, so that direct DML on eventbox.inbox is picked up late rather than never.
//
// The LaneMarks calls that cannot allocate are noexcept and made directly; the others hold the
// guard here (pg::call_cpp).
extern "C" {
#include "postgres.h"

#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
}

#include "handlers/pass_internal.hpp"
#include "pg/shmem.hpp"

namespace eventbox::handlers {

namespace {

constexpr int64 kMarksMaxAgeMs = 10000;

struct WorkerMarks {
    LaneMarks* lanes = nullptr;  // heap, made by the worker's first pass
    uint64 generation = 0;       // the inbox generation they hold for
    int64 since_ms = 0;          // when they were last dropped
    bool on = false;             // this pass reads from the marks and raises them
};
WorkerMarks marks;

// What a worker's pass read in each of its lanes (by pass lane number), to raise the live
// range's mark once the pass committed: an unfiltered read returned every waiting row from the
// mark up to its last one, in offset order, so the mark can move past the leading ones that got
// their final outcome (processed, ignored or dead), and past the last one read when all did.
// Without it the next read and probe would walk the entries of the batch handled before.
struct LaneRead {
    bool counted;        // an unfiltered live read of a known lane, without replay rows
    bool from_position;  // a live read, without replay rows, from the position (or below it)
    long position;       // in marks
    int n_read;
    int64* offsets;  // of the rows read, in the pass's memory
    bool* final;
    char* topic;  // the lane, in the pass's memory
    int32 partition;
    LanePosition durable;  // eventbox.inbox_positions as read before the lane
    bool replay_read;      // rows of the replay range were read
    int raised;  // leading rows with their final outcome that the mark was raised past already
};
constexpr int kMaxLaneReads = 1024;
struct LaneReads {
    LaneRead reads[kMaxLaneReads];
    int n = 0;
};
LaneReads lane_reads;

// Raises a lane's live mark here and in the marks the workers share.
void raise_live_mark(const char* subscription, std::size_t position, int64 mark) {
    marks.lanes->raise(subscription, position, false, mark);
    const char* topic = marks.lanes->topic(subscription, position).c_str();
    int32 partition = marks.lanes->partition(subscription, position);
    shmem::share_lane_mark(subscription, topic, partition, marks.generation, mark);
}

// The lanes a worker knows: the subscription's stored offsets, in the index's order (their
// primary key), with the next offset the ingest stores at in each (read at a pass when some
// lane was probed empty: one whose next offset did not move since is not probed).
KeptStatement lanes_statement{
    "SELECT topic, \"partition\", next_offset FROM eventbox.offsets WHERE subscription = $1"
    " ORDER BY topic, \"partition\"",
    1,
    {TEXTOID},
    nullptr};

// A lane's durable positions (eventbox.inbox_positions: live range with its version, replay
// range with its version) and its next offset to store, each NULL when it has no row: three
// probes of primary keys.
KeptStatement positions_statement{
    "SELECT l.position, l.version, r.position, o.next_offset, r.version FROM (SELECT) AS one"
    "  LEFT JOIN eventbox.inbox_positions l ON l.subscription = $1 AND l.topic = $2"
    "       AND l.\"partition\" = $3 AND l.replay = false"
    "  LEFT JOIN eventbox.inbox_positions r ON r.subscription = $1 AND r.topic = $2"
    "       AND r.\"partition\" = $3 AND r.replay = true"
    "  LEFT JOIN eventbox.offsets o ON o.subscription = $1 AND o.topic = $2"
    "       AND o.\"partition\" = $3",
    3,
    {TEXTOID, TEXTOID, INT4OID},
    nullptr};

// Raising a lane's live position to $5 (never past a lowering: $4 is the version the pass read
// with the position, and a lowering moves it), in the transaction of the pass's outcomes; or
// lowering it there, after a read that started below it at a due retry (read_lane()).
// The row is locked first without waiting: a lowering holding it wins anyway, and a pass that
// waited for it would hold the rows of its other lanes meanwhile, which a redrive over several
// lanes may want in another order (a deadlock). Index: inbox_positions_pkey.
KeptStatement lock_position_statement{
    "SELECT 1 FROM eventbox.inbox_positions p WHERE p.subscription = $1 AND p.topic = $2"
    " AND p.\"partition\" = $3 AND p.replay = false AND p.version = $4 AND p.position <> $5"
    " FOR UPDATE SKIP LOCKED",
    5,
    {TEXTOID, TEXTOID, INT4OID, INT8OID, INT8OID},
    nullptr};
KeptStatement advance_statement{
    "UPDATE eventbox.inbox_positions p SET position = $4 WHERE p.subscription = $1"
    " AND p.topic = $2 AND p.\"partition\" = $3 AND p.replay = false",
    4,
    {TEXTOID, TEXTOID, INT4OID, INT8OID},
    nullptr};
// Raising a lane's replay position ($5 as read with version $4 before the pass) to the range's
// first row that still waits, as this transaction sees it (the pass's own outcomes included),
// or past its last row when none waits; never past the lane's next offset to store ($6, as read
// with the position; the largest bigint without one). Replays are read from no low-water mark in a
// worker's memory, only from this position: without the raise every read and probe of the range
// would walk what was replayed before. The row is locked first without waiting, as for the live
// range; a lowering (reprocess() queueing a row) moves the version. Each walk starts at the
// position and crosses the rows the pass handled: inbox_replay_idx.
KeptStatement lock_replay_position_statement{
    "SELECT 1 FROM eventbox.inbox_positions p WHERE p.subscription = $1 AND p.topic = $2"
    " AND p.\"partition\" = $3 AND p.replay AND p.version = $4 AND p.position = $5"
    " FOR UPDATE SKIP LOCKED",
    5,
    {TEXTOID, TEXTOID, INT4OID, INT8OID, INT8OID},
    nullptr};
#define REPLAY_ROWS                                                                             \
    "FROM eventbox.inbox i WHERE i.subscription = $1 AND i.topic = $2 AND i.\"partition\" = $3" \
    " AND i.mode = 'replay' AND i.\"offset\" >= $5"
KeptStatement advance_replay_statement{
    "UPDATE eventbox.inbox_positions p SET position = t.target"
    "  FROM (SELECT least($6::int8, coalesce("
    "          (SELECT i.\"offset\" " REPLAY_ROWS
    " AND i.status IN ('received', 'retry')"
    "            ORDER BY i.\"offset\" LIMIT 1),"
    "          (SELECT i.\"offset\" + 1 " REPLAY_ROWS
    " ORDER BY i.\"offset\" DESC LIMIT 1)))"
    "        AS target) t"
    " WHERE p.subscription = $1 AND p.topic = $2 AND p.\"partition\" = $3 AND p.replay"
    "   AND p.version = $4 AND p.position = $5 AND t.target > $5",
    6,
    {TEXTOID, TEXTOID, INT4OID, INT8OID, INT8OID, INT8OID},
    nullptr};
#undef REPLAY_ROWS

// A lane without a position (the ingest writes none: docs/design/handlers.md, "Lane
// positions"): one at $4, unless a row was made meanwhile (a lowering's).
KeptStatement first_position_statement{
    "INSERT INTO eventbox.inbox_positions (subscription, topic, \"partition\", replay, position)"
    " VALUES ($1, $2, $3, false, $4)"
    " ON CONFLICT (subscription, topic, \"partition\", replay) DO NOTHING",
    4,
    {TEXTOID, TEXTOID, INT4OID, INT8OID},
    nullptr};

// Column `column` of SPI_tuptable's first row as an offset, kNoMark when NULL.
int64 offset_or_none(int column) {
    bool isnull;
    Datum d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, column, &isnull);
    return isnull ? kNoMark : DatumGetInt64(d);
}

// Learns the lanes and next offsets of the lanes read in SPI_tuptable.
void learn_lanes(const char* subscription, bool loaded) {
    if (loaded)
        marks.lanes->begin_next(subscription);
    else
        pg::call_cpp([&] { marks.lanes->begin_load(subscription); });
    long hint = 0;
    for (uint64 r = 0; r < SPI_processed; ++r) {
        HeapTuple row = SPI_tuptable->vals[r];
        TupleDesc desc = SPI_tuptable->tupdesc;
        char* topic = nullable_text(row, desc, 1);
        bool isnull;
        int32 partition = DatumGetInt32(SPI_getbinval(row, desc, 2, &isnull));
        Datum next_datum = SPI_getbinval(row, desc, 3, &isnull);
        int64 next = isnull ? kNoMark : DatumGetInt64(next_datum);
        if (!loaded)
            pg::call_cpp([&] {
                marks.lanes->learn(subscription, static_cast<long>(r) - 1, topic, partition);
            });
        long at = marks.lanes->set_next(subscription, hint, topic, partition, next);
        if (at >= 0) hint = at + 1;
        pfree(topic);
    }
}

// A lane range's durable position in a statement on lane ($1, $2, $3) (-1 without one): an
// InitPlan, which the inbox scan takes as an index condition.
#define LANE_POSITION(REPLAY)                                                               \
    "coalesce((SELECT p.position FROM eventbox.inbox_positions p WHERE p.subscription = $1" \
    " AND p.topic = $2 AND p.\"partition\" = $3 AND p.replay = " REPLAY "), -1)"

// Whether a lane a worker knows has work at or above its low-water marks ($4: live range,
// $5: replay range, read when $6) and its durable positions: one descent of the todo index
// each, which lands past the entries of the messages handled before. (A probe crossing a range of
// such entries walks them, whatever its bounds: a btree scan skips the killed ones before it checks
// a bound.) ORDER BY "offset" LIMIT 1 pins the index: only inbox_todo_idx (inbox_replay_idx) gives
// that order without a sort, which the workers turn off. An EXISTS would drop the ORDER BY,
// and on a small table the planner may find inbox_pkey as cheap: a scan of the
// subscription's rows from the first, past every message handled before. The second
// column is the lane's next offset to store, read in the same snapshot: a lane without
// work has none below it (next_known_lane()). (The position is not raised here: the probe
// holds no lane, and a write to a lane's position outside its holder's transactions took locks
// in another order than the holder's and deadlocked with it.)
KeptStatement known_lane_statement{
    "SELECT (SELECT 1 FROM eventbox.inbox i"
    "    WHERE i.subscription = $1 AND i.topic = $2 AND i.\"partition\" = $3"
    "      AND i.status IN ('received', 'retry') AND (i.mode = 'replay') IS FALSE"
    "      AND i.\"offset\" >= greatest($4, " LANE_POSITION("false") ")"
    "    ORDER BY i.\"offset\" LIMIT 1) IS NOT NULL"
    "  OR ($6 AND (SELECT 1 FROM eventbox.inbox i"
    "    WHERE i.subscription = $1 AND i.topic = $2 AND i.\"partition\" = $3"
    "      AND i.status IN ('received', 'retry') AND i.mode = 'replay'"
    "      AND i.\"offset\" >= greatest($5, " LANE_POSITION("true") ")"
    "    ORDER BY i.\"offset\" LIMIT 1) IS NOT NULL)"
    "  OR " EVENTBOX_LANE_LEFT_OUT("$2", "$3") ","
    " (SELECT o.next_offset FROM eventbox.offsets o"
    "   WHERE o.subscription = $1 AND o.topic = $2 AND o.\"partition\" = $3)",
    6,
    {TEXTOID, TEXTOID, INT4OID, INT8OID, INT8OID, BOOLOID},
    nullptr};
#undef LANE_POSITION

// Whether known lane (topic, partition) has work at or above its marks: false without a probe
// when the pass read that its live range is drained (and no replays wait), else one probe
// (known_lane_statement). A lane found without work has its live mark raised.
bool known_lane_has_work(Datum name, const char* subscription, const char* topic, int32 partition,
                         bool replays) {
    long position;
    LaneMark mark = lane_mark(subscription, topic, partition, &position);
    if (!replays && marks.on && position >= 0 &&
        marks.lanes->drained(subscription, static_cast<std::size_t>(position)))
        return false;
    MemoryContext keep = CurrentMemoryContext;
    Datum args[6] = {name,
                     CStringGetTextDatum(topic),
                     Int32GetDatum(partition),
                     Int64GetDatum(mark.live),
                     Int64GetDatum(mark.replay),
                     BoolGetDatum(replays)};
    // A snapshot of its own, taken after the pass read the inbox generation: a lane found
    // without work may have its mark raised (below).
    exec(known_lane_statement, args, false, SPI_OK_SELECT);
    MemoryContextSwitchTo(keep);
    bool isnull;
    HeapTuple row = SPI_tuptable->vals[0];
    if (DatumGetBool(SPI_getbinval(row, SPI_tuptable->tupdesc, 1, &isnull))) return true;
    // Nothing waits in the lane from its mark on: whatever waits later is stored at or above
    // the next offset (stored with the rows, in the same transaction), or made to wait
    // again by a change that moves the generation. Without this an idle worker would walk
    // the lane's handled entries at each probe once its marks were dropped.
    int64 next = DatumGetInt64(SPI_getbinval(row, SPI_tuptable->tupdesc, 2, &isnull));
    if (!isnull && marks.on && position >= 0 && marks_still_hold()) {
        if (next > mark.live)
            raise_live_mark(subscription, static_cast<std::size_t>(position), next);
        // Until the next offset moves, later passes need not probe the lane again.
        marks.lanes->probed_empty(subscription, static_cast<std::size_t>(position), next);
    }
    return false;
}

}  // namespace

// The periodic drop moves the generation: the marks the workers share go too.
void begin_marks(int64 now) {
    if (marks.lanes == nullptr) marks.lanes = pg::call_cpp([] { return new LaneMarks(); });
    if (now - marks.since_ms >= kMarksMaxAgeMs) shmem::inbox_generation_bump();
    shmem::InboxGeneration g = shmem::inbox_generation();
    if (g.generation != marks.generation || now - marks.since_ms >= kMarksMaxAgeMs) {
        marks.lanes->drop_all();  // the lanes are loaded again
        marks.generation = g.generation;
        marks.since_ms = now;
    }
    // A change between its two bumps may become visible to this pass's reads unannounced.
    marks.on = g.in_flight == 0;
}

void marks_off() noexcept {
    marks.on = false;
}

bool marks_on() noexcept {
    return marks.on;
}

// After a read: whether no change that could make rows wait below the marks may have become
// visible since the pass read the generation. If one may have, the marks are dropped and not
// used for the rest of the pass.
bool marks_still_hold() {
    if (shmem::inbox_generation().generation == marks.generation) return true;
    marks.lanes->drop_marks();
    marks.on = false;
    return false;
}

bool lanes_loaded(const char* subscription) noexcept {
    return marks.lanes != nullptr && marks.lanes->loaded(subscription);
}

long known_lane(const char* subscription, const char* topic, int32 partition) noexcept {
    return marks.lanes == nullptr ? -1 : marks.lanes->find(subscription, topic, partition);
}

bool unknown_work(const char* subscription) noexcept {
    return marks.lanes != nullptr && marks.lanes->unknown_work(subscription);
}

void set_unknown_work(const char* subscription, bool found) {
    pg::call_cpp([&] { marks.lanes->set_unknown_work(subscription, found); });
}

// Those of eventbox.offsets, in the index's order (ORDER BY in SQL: the database collation's),
// learned unless they are loaded already, and at every pass the next offset the ingest stores at
// in each. Every lane the ingest worker stores into has a row there, written with its first
// rows, and its first batch in a lane drops the marks (StoredOffsets), which reloads the lanes.
//
// An idle subscription's lanes are then passed over without a probe each (nothing was stored in
// them since a probe found them empty: LaneMarks::drained()): one statement per pass instead of
// one per lane, which cost the workers' passes over every busy subscription's messages ~20 us
// per message with three idle subscriptions of 128 lanes each beside them.
void read_lanes(Datum name, const char* subscription) {
    bool loaded = marks.lanes->loaded(subscription);
    // A busy subscription's lanes were not found empty: each is probed, and the read would be
    // work on the hot path for nothing.
    if (loaded && !marks.lanes->any_probed_empty(subscription)) {
        marks.lanes->begin_next(subscription);
        return;
    }
    MemoryContext keep = CurrentMemoryContext;
    Datum args[1] = {name};
    // A snapshot of its own, taken after the pass read the inbox generation (begin_marks()):
    // a lane whose first batch committed in between is seen, and the next offsets are fresh.
    exec(lanes_statement, args, false, SPI_OK_SELECT);
    MemoryContextSwitchTo(keep);
    learn_lanes(subscription, loaded);
}

// The first lane after `after` (up to `upto` inclusive) with work at or above its marks.
// Returns false when there is none, and also when `after` or `upto` is not a known lane.
bool next_known_lane(Datum name, const char* subscription, const char* after_topic,
                     int32 after_partition, const char* upto_topic, int32 upto_partition,
                     bool replays, char** topic, int32* partition) {
    long n = static_cast<long>(marks.lanes->count(subscription));
    long after = -1, upto = -1;
    if (after_partition >= 0) after = marks.lanes->find(subscription, after_topic, after_partition);
    if (upto_topic != nullptr) upto = marks.lanes->find(subscription, upto_topic, upto_partition);
    if ((after_partition >= 0 && after < 0) || (upto_topic != nullptr && upto < 0)) return false;
    for (long k = after + 1; k < n && (upto_topic == nullptr || k <= upto); ++k) {
        CHECK_FOR_INTERRUPTS();
        auto position = static_cast<std::size_t>(k);
        char* k_topic = pstrdup(marks.lanes->topic(subscription, position).c_str());
        int32 k_partition = marks.lanes->partition(subscription, position);
        if (known_lane_has_work(name, subscription, k_topic, k_partition, replays)) {
            *topic = k_topic;
            *partition = k_partition;
            return true;
        }
        pfree(k_topic);
    }
    return false;
}

LaneMark lane_mark(const char* subscription, const char* topic, int32 partition, long* position) {
    *position = -1;
    if (marks.lanes == nullptr) return LaneMark{};
    *position = marks.lanes->find(subscription, topic, partition);
    if (!marks.on || *position < 0) return LaneMark{};
    LaneMark mark = marks.lanes->mark(subscription, static_cast<std::size_t>(*position));
    // Another worker may have taken the lane further.
    mark.live =
        Max(mark.live, shmem::shared_lane_mark(subscription, topic, partition, marks.generation));
    return mark;
}

// The offset of the first row is column 7 of SPI_tuptable; a filtered read leaves the mark.
void raise_mark(const char* subscription, long position, bool replay, bool filtered) {
    if (!marks.on || position < 0 || filtered || SPI_processed == 0) return;
    bool isnull;
    int64 first =
        DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 7, &isnull));
    if (replay)
        marks.lanes->raise(subscription, static_cast<std::size_t>(position), true, first);
    else
        raise_live_mark(subscription, static_cast<std::size_t>(position), first);
}

void forget_lane_reads() noexcept {
    lane_reads.n = 0;
}

LanePosition lane_position(Datum name, const char* topic, int32 partition) {
    MemoryContext keep = CurrentMemoryContext;
    Datum args[3] = {name, CStringGetTextDatum(topic), Int32GetDatum(partition)};
    exec(positions_statement, args, false, SPI_OK_SELECT);
    MemoryContextSwitchTo(keep);
    LanePosition at;
    at.live = offset_or_none(1);
    at.version = offset_or_none(2);
    at.replay = offset_or_none(3);
    at.next = offset_or_none(4);
    at.replay_version = offset_or_none(5);
    return at;
}

// The live read in SPI_tuptable (its offsets in column 7) of pass lane l.
void note_lane_read(std::size_t l, long position, bool counted, bool from_position,
                    const LaneId& lane, const LanePosition& durable, MemoryContext memory) {
    if (l >= static_cast<std::size_t>(kMaxLaneReads)) return;
    while (lane_reads.n <= static_cast<int>(l)) lane_reads.reads[lane_reads.n++] = LaneRead{};
    LaneRead r{counted,
               from_position,
               position,
               static_cast<int>(SPI_processed),
               nullptr,
               nullptr,
               MemoryContextStrdup(memory, lane.topic),
               lane.partition,
               durable,
               false,
               0};
    if ((counted || from_position) && r.n_read > 0) {
        r.offsets = static_cast<int64*>(MemoryContextAlloc(memory, sizeof(int64) * r.n_read));
        r.final = static_cast<bool*>(MemoryContextAllocZero(memory, sizeof(bool) * r.n_read));
        bool isnull;
        for (int k = 0; k < r.n_read; ++k)
            r.offsets[k] = DatumGetInt64(
                SPI_getbinval(SPI_tuptable->vals[k], SPI_tuptable->tupdesc, 7, &isnull));
    }
    lane_reads.reads[l] = r;
}

void uncount_lane_read(std::size_t l) noexcept {
    if (l >= static_cast<std::size_t>(lane_reads.n)) return;
    lane_reads.reads[l].counted = false;
    lane_reads.reads[l].from_position = false;
}

void note_replay_read(std::size_t l) noexcept {
    if (l >= static_cast<std::size_t>(lane_reads.n)) return;
    lane_reads.reads[l].replay_read = true;
}

// A chosen message got its final outcome.
void count_final(const ChosenMessage& m) noexcept {
    if (m.lane >= static_cast<std::size_t>(lane_reads.n)) return;
    LaneRead& r = lane_reads.reads[m.lane];
    if (r.final != nullptr && m.index < static_cast<std::size_t>(r.n_read)) r.final[m.index] = true;
}

namespace {

// Where a live read lets its range's mark (position) rise once its messages' outcomes commit:
// past the leading ones that got their final outcome, past the last one read when all did;
// kNoMark when the first did not.
int64 mark_after(const LaneRead& r) noexcept {
    if (r.final == nullptr) return kNoMark;
    int done = 0;
    while (done < r.n_read && r.final[done]) ++done;
    if (done == 0) return kNoMark;
    return done == r.n_read ? r.offsets[r.n_read - 1] + 1 : r.offsets[done];
}

// The replay range's raise (advance_replay_statement) for a read that took rows of it.
void advance_replay_position(Datum name, const LaneRead& r) {
    if (!r.replay_read || r.durable.replay_version < 0) return;
    Datum topic = CStringGetTextDatum(r.topic);
    Datum args[6] = {name,
                     topic,
                     Int32GetDatum(r.partition),
                     Int64GetDatum(r.durable.replay_version),
                     Int64GetDatum(r.durable.replay),
                     Int64GetDatum(r.durable.next == kNoMark ? PG_INT64_MAX : r.durable.next)};
    exec(lock_replay_position_statement, args, false, SPI_OK_SELECT);
    if (SPI_processed != 1) return;
    exec(advance_replay_statement, args, false, SPI_OK_UPDATE);
}

// Raises the live position of lane read `r` (see advance_positions()) and remembers the raise,
// so that a later transaction of the same pass raises it only further.
void advance_live_position(Datum name, LaneRead& r, bool marks_hold) {
    if (!r.from_position && !(r.counted && marks_hold)) return;
    int64 mark = mark_after(r);
    if (mark != kNoMark && r.durable.next != kNoMark) mark = Min(mark, r.durable.next);
    if (mark == kNoMark || mark <= r.durable.live) return;
    MemoryContext keep = CurrentMemoryContext;
    Datum topic = CStringGetTextDatum(r.topic);
    bool raised = false;
    if (r.durable.version < 0) {
        Datum args[4] = {name, topic, Int32GetDatum(r.partition), Int64GetDatum(mark)};
        exec(first_position_statement, args, false, SPI_OK_INSERT);
        raised = SPI_processed == 1;
    } else {
        Datum args[5] = {name, topic, Int32GetDatum(r.partition), Int64GetDatum(r.durable.version),
                         Int64GetDatum(mark)};
        exec(lock_position_statement, args, false, SPI_OK_SELECT);
        if (SPI_processed == 1) {
            args[3] = Int64GetDatum(mark);
            exec(advance_statement, args, false, SPI_OK_UPDATE);
            raised = true;
        }
    }
    MemoryContextSwitchTo(keep);
    // A lowering since the read holds the row or moved its version: no later raise of this pass
    // can pass the version check either, so nothing is remembered.
    if (raised) r.durable.live = mark;
}

}  // namespace

// In the transaction that commits a pass's last outcomes (a worker's, or eventbox.process()'s
// caller's): the same rise as the marks', for reads that started at the position or at a mark
// that still holds, never past the lane's next offset to store as read with the position (the
// ingest's inserts above it write no position: see the inbox_inserted trigger).
void advance_positions(Datum name) {
    if (lane_reads.n == 0) return;
    bool marks_hold = marks.on && marks_still_hold();
    MemoryContext keep = CurrentMemoryContext;
    for (int l = 0; l < lane_reads.n; ++l) {
        LaneRead& r = lane_reads.reads[l];
        advance_replay_position(name, r);
        MemoryContextSwitchTo(keep);
        advance_live_position(name, r, marks_hold);
    }
}

// In a worker's run transaction that commits outcomes before the pass's last (a pass of 256
// messages commits every 64): the live positions' rise as far as the outcomes so far take it.
// The other worker probes the lanes this one holds (it cannot take them, but it looks for work
// in them): without the rise its probe would start at the position this pass read and, the
// mark being a HOT update that leaves the handled rows' index entries live, pay a heap visit
// for each row the pass handled so far. The replay range's rise waits for the last outcomes (it
// compares the position read before the pass).
void advance_live_positions(Datum name) {
    if (lane_reads.n == 0) return;
    bool marks_hold = marks.on && marks_still_hold();
    for (int l = 0; l < lane_reads.n; ++l)
        advance_live_position(name, lane_reads.reads[l], marks_hold);
}

// After a worker's pass committed outcomes: each run transaction's, so that a lane's shared mark
// follows its handled rows through a pass (another worker's probe of the lane meanwhile would
// walk their index entries from an older mark), and the pass's last. Each lane's walk goes on
// from where the previous commit's stopped, and a lane whose mark did not move is left alone.
void raise_marks_after_commit(const char* subscription) {
    if (!marks.on || lane_reads.n == 0 || !marks_still_hold()) return;
    for (int l = 0; l < lane_reads.n; ++l) {
        LaneRead& r = lane_reads.reads[l];
        if (!r.counted || r.final == nullptr) continue;
        int done = r.raised;
        while (done < r.n_read && r.final[done]) ++done;
        if (done == r.raised) continue;
        r.raised = done;
        int64 mark = done == r.n_read ? r.offsets[r.n_read - 1] + 1 : r.offsets[done];
        raise_live_mark(subscription, static_cast<std::size_t>(r.position), mark);
    }
}

}  // namespace eventbox::handlers
