// What a pass holds in a lane: its advisory lock (a worker's, a session lock until the pass ends)
// and its claim, the messages a worker's pass took there, committed with their attempts before
// any of them runs; a later pass that finds a claim still waiting settles it (the attempt a crash
// cut short counts). PostgreSQL side (see handlers/pass_internal.hpp).
extern "C" {
#include "postgres.h"

#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/array.h"
#include "utils/builtins.h"
}

#include <cstring>

#include "handlers/pass_internal.hpp"
#include "handlers/runner.hpp"
#include "pg/shmem.hpp"

namespace eventbox::handlers {

namespace {

// The advisory lock of a lane, in a field4 of our own so it never meets users' advisory locks.
LOCKTAG lane_tag(const char* subscription, const char* topic, int32 partition) {
    LOCKTAG tag;
    uint32 key1 = hash_bytes(reinterpret_cast<const unsigned char*>(subscription),
                             static_cast<int>(strlen(subscription)));
    uint32 key2 =
        hash_bytes(reinterpret_cast<const unsigned char*>(topic), static_cast<int>(strlen(topic))) ^
        static_cast<uint32>(partition) * 2654435761u;
    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, key1, key2, 0x4542);
    return tag;
}

// Held session lane locks, to release after the pass (or after an error).
constexpr int kMaxHeld = 1024;
struct HeldLocks {
    LOCKTAG tags[kMaxHeld];
    int n = 0;
};
HeldLocks held;

// A lane's claim: what the last worker pass in it took (empty once their outcomes committed).
// By the primary key of eventbox.handler_claims, as the other claim statements.
KeptStatement claim_read_statement{
    "SELECT message_ids, attempts, positions, lower(running), upper(running)"
    "  FROM eventbox.handler_claims"
    " WHERE subscription = $1 AND topic = $2 AND \"partition\" = $3",
    3,
    {TEXTOID, TEXTOID, INT4OID},
    nullptr};

// Messages of a claim left by a crashed pass that still wait with the attempts they had then
// (no outcome committed): their attempt never finished and counts; dead when that was the
// last one ($3 = max_attempts). The others run alone next. (The status test is on
// coalesce(): a plain one could imply a partial index's predicate, and the planner walk that
// whole index instead of probing the ids.)
KeptStatement crash_statement{
    "UPDATE eventbox.inbox i SET attempts = i.attempts + 1, next_attempt_at = NULL, "
    "status = CASE WHEN i.attempts + 1 >= $3 THEN 'dead' ELSE i.status END, "
    "last_error = CASE WHEN i.attempts + 1 >= $3 THEN format('attempt %s never finished: the "
    "backend running it crashed or was killed', i.attempts + 1) ELSE i.last_error END "
    "FROM unnest($2::text[], $4::int4[]) AS u(id, attempts) "
    EVENTBOX_INBOX_BY_ID("x.ctid AS t", "")
    "WHERE i.ctid = x.t AND i.attempts = u.attempts "
    "  AND coalesce(i.status, '') IN ('received', 'retry') "
    "RETURNING i.status = 'dead', i.message_id",
    4, {TEXTOID, TEXTARRAYOID, INT4OID, INT4ARRAYOID}, nullptr};

// The message of a claim whose handler ran past eventbox.handler_timeout and ignored the cancel,
// its backend terminated (the note it left, see handler_call.cpp), still waiting with the
// attempts it had then ($3): the attempt failed with that error ($5), dead when it was the last
// one or the error is not retried ($6), else it runs again alone, like a crashed message. The
// crash statement, run next over the whole claim, passes over it (its attempts moved on). By
// the primary key.
KeptStatement timed_out_statement{
    "UPDATE eventbox.inbox i SET attempts = i.attempts + 1, next_attempt_at = NULL, "
    "status = CASE WHEN i.attempts + 1 >= $4 OR $6 THEN 'dead' ELSE i.status END, "
    "last_error = $5 "
    "FROM (SELECT $2::text AS id) u " EVENTBOX_INBOX_BY_ID("x.ctid AS t", "")
    "WHERE i.ctid = x.t AND i.attempts = $3 "
    "  AND coalesce(i.status, '') IN ('received', 'retry') "
    "RETURNING i.status = 'dead', i.message_id",
    6, {TEXTOID, TEXTOID, INT4OID, INT4OID, TEXTOID, BOOLOID}, nullptr};

// With each message's place in the pass's run order and the places of the first run
// transaction.
KeptStatement claim_write_statement{
    "INSERT INTO eventbox.handler_claims (subscription, topic, \"partition\", message_ids, "
    "attempts, positions, running) VALUES ($1, $2, $3, $4, $5, $6, int4range(0, $7)) "
    "ON CONFLICT (subscription, topic, \"partition\") "
    "DO UPDATE SET message_ids = EXCLUDED.message_ids, attempts = EXCLUDED.attempts, "
    "positions = EXCLUDED.positions, running = EXCLUDED.running",
    7,
    {TEXTOID, TEXTOID, INT4OID, TEXTARRAYOID, INT4ARRAYOID, INT4ARRAYOID, INT4OID},
    nullptr};

// The places of the run transaction that starts next, written by the one that commits before
// it (with its outcomes) in every claim of the pass.
KeptStatement claim_running_statement{
    "UPDATE eventbox.handler_claims c SET running = int4range($4, $5) "
    "FROM unnest($2::text[], $3::int4[]) AS u(topic, p) "
    "WHERE c.subscription = $1 AND c.topic = u.topic AND c.\"partition\" = u.p"
    "  AND c.message_ids <> '{}'",
    5,
    {TEXTOID, TEXTARRAYOID, INT4ARRAYOID, INT4OID, INT4OID},
    nullptr};

KeptStatement claim_clear_statement{
    "UPDATE eventbox.handler_claims c SET message_ids = '{}', attempts = '{}' "
    "FROM unnest($2::text[], $3::int4[]) AS u(topic, p) "
    "WHERE c.subscription = $1 AND c.topic = u.topic AND c.\"partition\" = u.p"
    "  AND c.message_ids <> '{}'",
    3,
    {TEXTOID, TEXTARRAYOID, INT4ARRAYOID},
    nullptr};

// The messages of the crash statement's result (SPI_tuptable) that went dead: their keys
// blocked and their dead letters sent. Returns how many.
int crashed_dead(Datum name) {
    bool isnull;
    pg::ArrayColumn dead_ids(static_cast<int>(Max(SPI_processed, 1)), TEXTOID);
    int dead = 0;
    for (uint64 r = 0; r < SPI_processed; ++r)
        if (DatumGetBool(SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1, &isnull)))
            dead_ids.set(dead++,
                         SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 2, &isnull));
    if (dead > 0) dead_letters::after_dead(name, dead_ids.get(dead));
    return dead;
}

// The id of the message of claim (ids, attempts) that `note` names, if it holds it still with
// the attempts it had then.
bool noted_message(const shmem::HandlerTimeoutNote& note, ArrayType* ids, ArrayType* attempts,
                   Datum* id) {
    Datum *id_values, *attempt_values;
    int n_ids, n_attempts;
    deconstruct_array(ids, TEXTOID, -1, false, TYPALIGN_INT, &id_values, nullptr, &n_ids);
    deconstruct_array(attempts, INT4OID, 4, true, TYPALIGN_INT, &attempt_values, nullptr,
                      &n_attempts);
    for (int k = 0; k < n_ids && k < n_attempts; ++k) {
        text* t = DatumGetTextPP(id_values[k]);
        uint64 hash = hash_bytes_extended(reinterpret_cast<const unsigned char*>(VARDATA_ANY(t)),
                                          static_cast<int>(VARSIZE_ANY_EXHDR(t)), 0);
        if (hash == note.message_hash && DatumGetInt32(attempt_values[k]) == note.attempts) {
            *id = id_values[k];
            return true;
        }
    }
    return false;
}

// The claimed message whose handler ran past its timeout, when its terminated backend left a
// note for lane `lane`: its attempt counts with that error. Returns how many went dead (0, 1).
int settle_timed_out(Pass& p, LaneId lane, ArrayType* ids, ArrayType* attempts) {
    shmem::HandlerTimeoutNote note;
    Datum id;
    if (!shmem::take_handler_timeout_note(p.subscription, lane.topic, lane.partition, &note) ||
        !noted_message(note, ids, attempts, &id))
        return 0;
    char* error = timeout_termination_error(note.timeout_ms);
    bool refused = dead_letters::refuses(p.setup.options.dead, error);
    if (refused) error = psprintf("%s (not retried: non_retryable)", error);
    Datum args[6] = {p.setup.name,
                     id,
                     Int32GetDatum(note.attempts),
                     Int32GetDatum(p.setup.options.max_attempts),
                     CStringGetTextDatum(error),
                     BoolGetDatum(refused)};
    exec(timed_out_statement, args, false, SPI_OK_UPDATE_RETURNING);
    return crashed_dead(p.setup.name);
}

// How many chosen messages of lane l run (to_run[]), in a worker's pass; none in process().
int runs_in_lane(const Pass& p, std::size_t l, const bool* to_run, int n_chosen) {
    int n = 0;
    for (int c = 0; p.own_transactions && c < n_chosen; ++c)
        if (to_run[c] && p.work.lane_of_chosen(c) == l) ++n;
    return n;
}

// Narrows claim (*ids, *attempts) to the messages a crash may have cut short: those whose place
// in the pass's run order (`positions`) lies in [from, to), the run transaction that was in
// flight. The run transactions before it committed (a message of theirs that still waits was
// held back by an earlier failure and never ran); those after it never started.
void narrow_to_running(Datum* ids, Datum* attempts, ArrayType* positions, int32 from, int32 to) {
    Datum *id_values, *attempt_values, *place_values;
    int n_ids, n_attempts, n_places;
    deconstruct_array(DatumGetArrayTypeP(*ids), TEXTOID, -1, false, TYPALIGN_INT, &id_values,
                      nullptr, &n_ids);
    deconstruct_array(DatumGetArrayTypeP(*attempts), INT4OID, 4, true, TYPALIGN_INT,
                      &attempt_values, nullptr, &n_attempts);
    deconstruct_array(positions, INT4OID, 4, true, TYPALIGN_INT, &place_values, nullptr, &n_places);
    int n = Min(n_ids, Min(n_attempts, n_places));
    pg::ArrayColumn kept_ids(Max(n, 1), TEXTOID), kept_attempts(Max(n, 1), INT4OID);
    int k = 0;
    for (int i = 0; i < n; ++i) {
        int32 place = DatumGetInt32(place_values[i]);
        if (place < from || place >= to) continue;
        kept_ids.set(k, id_values[i]);
        kept_attempts.set(k++, attempt_values[i]);
    }
    *ids = kept_ids.get(k);
    *attempts = kept_attempts.get(k);
}

}  // namespace

bool try_lock_lane(const char* subscription, const char* topic, int32 partition, bool session) {
    LOCKTAG tag = lane_tag(subscription, topic, partition);
    if (session && held.n >= kMaxHeld) return false;
    LockAcquireResult r = LockAcquire(&tag, ExclusiveLock, session, true);
    if (r == LOCKACQUIRE_NOT_AVAIL) return false;
    if (session) held.tags[held.n++] = tag;
    return true;
}

// A message whose attempt a crash cut short runs alone, and one such message at a time in the
// database: a crash it causes again then cuts short no other one's attempt (a parallel pass
// runs only messages that have not crashed).
bool try_lock_suspects(bool session) {
    if (session && held.n >= kMaxHeld) return false;
    LOCKTAG tag;
    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, 0, 0x4543);
    if (LockAcquire(&tag, ExclusiveLock, session, true) == LOCKACQUIRE_NOT_AVAIL) return false;
    if (session) held.tags[held.n++] = tag;
    return true;
}

void release_lane_locks() {
    for (int i = 0; i < held.n; ++i) LockRelease(&held.tags[i], ExclusiveLock, true);
    held.n = 0;
}

// Those with no message chosen and no claim settled (which stays locked until it commits).
void release_unused_lanes(const Pass& p) {
    std::size_t n_lanes = p.work.lane_count();
    for (std::size_t l = 0; l < n_lanes; ++l) {
        if (!p.work.is_locked(l) || p.work.lane_in_use(l)) continue;
        LaneId lane = p.work.lane_id(l);
        LOCKTAG tag = lane_tag(p.subscription, lane.topic, lane.partition);
        LockRelease(&tag, ExclusiveLock, true);
        for (int i = 0; i < held.n; ++i)
            if (memcmp(&held.tags[i], &tag, sizeof tag) == 0) {
                held.tags[i] = held.tags[--held.n];
                break;
            }
    }
}

// The claimed messages of the run transaction in flight that still wait have their attempt
// counted (dead when it was the last); a claim without places (written before 0.6.0) counts
// every message that still waits.
int settle_claim(Pass& p, std::size_t l) {
    LaneId lane = p.work.lane_id(l);
    Datum args[3] = {p.setup.name, CStringGetTextDatum(lane.topic), Int32GetDatum(lane.partition)};
    exec(claim_read_statement, args, false, SPI_OK_SELECT);
    if (SPI_processed == 0) return 0;
    HeapTuple row = SPI_tuptable->vals[0];
    TupleDesc desc = SPI_tuptable->tupdesc;
    bool isnull, no_places, no_from, no_to;
    Datum ids = SPI_getbinval(row, desc, 1, &isnull);
    Datum attempts = SPI_getbinval(row, desc, 2, &isnull);
    Datum places = SPI_getbinval(row, desc, 3, &no_places);
    int32 from = DatumGetInt32(SPI_getbinval(row, desc, 4, &no_from));
    int32 to = DatumGetInt32(SPI_getbinval(row, desc, 5, &no_to));
    ArrayType* id_array = DatumGetArrayTypeP(ids);
    if (ArrayGetNItems(ARR_NDIM(id_array), ARR_DIMS(id_array)) == 0) return 0;
    p.work.set_had_claim(l);
    ArrayType* place_array = no_places ? nullptr : DatumGetArrayTypeP(places);
    int dead = settle_timed_out(p, lane, id_array, DatumGetArrayTypeP(attempts));
    if (place_array != nullptr && !no_from && !no_to)
        narrow_to_running(&ids, &attempts, place_array, from, to);
    Datum crash_args[4] = {p.setup.name, ids, Int32GetDatum(p.setup.options.max_attempts),
                           attempts};
    exec(crash_statement, crash_args, false, SPI_OK_UPDATE_RETURNING);
    return dead + crashed_dead(p.setup.name);
}

// A worker's pass claims the messages it runs (`own_transactions`), each with its place in the
// pass's run order, and the places [0, first_end) of its first run transaction; a claim it
// settled is then emptied, or replaced.
void write_claims(Pass& p, const bool* to_run, int first_end) {
    std::size_t n_lanes = p.work.lane_count();
    int n_chosen = static_cast<int>(p.work.chosen_count());
    for (std::size_t l = 0; l < n_lanes; ++l) {
        if (!p.work.is_locked(l)) continue;
        int n = runs_in_lane(p, l, to_run, n_chosen);
        if (n == 0 && !p.work.had_claim(l)) continue;
        pg::ArrayColumn ids(n, TEXTOID), attempts(n, INT4OID), places(n, INT4OID);
        n = 0;
        for (int c = 0; p.own_transactions && c < n_chosen; ++c) {
            if (!to_run[c]) continue;
            ChosenMessage m = p.work.chosen(c);
            if (m.lane != l) continue;
            ids.set(n, CStringGetTextDatum(m.id));
            attempts.set(n, Int32GetDatum(m.attempts));
            places.set(n, Int32GetDatum(c));
            ++n;
        }
        LaneId lane = p.work.lane_id(l);
        name_lane(p, lane.topic, lane.partition);
        Datum args[7] = {p.setup.name,
                         CStringGetTextDatum(lane.topic),
                         Int32GetDatum(lane.partition),
                         ids.get(),
                         attempts.get(),
                         places.get(),
                         Int32GetDatum(first_end)};
        exec(claim_write_statement, args, false, SPI_OK_INSERT);
    }
    name_lane(p, nullptr, -1);
}

namespace {

// The lanes whose messages the pass chose, as the (topics, partitions) arguments of the claim
// statements that follow the pass's runs (NULL for the other lanes).
void chosen_lanes(const Pass& p, Datum* topics_out, Datum* partitions_out) {
    std::size_t n_lanes = p.work.lane_count();
    pg::ArrayColumn topics(static_cast<int>(Max(n_lanes, 1)), TEXTOID),
        partitions(static_cast<int>(Max(n_lanes, 1)), INT4OID);
    for (std::size_t l = 0; l < n_lanes; ++l) {
        if (!p.work.lane_has_chosen(l)) continue;
        LaneId lane = p.work.lane_id(l);
        topics.set(static_cast<int>(l), CStringGetTextDatum(lane.topic));
        partitions.set(static_cast<int>(l), Int32GetDatum(lane.partition));
    }
    *topics_out = topics.get();
    *partitions_out = partitions.get();
}

}  // namespace

void set_claims_running(Pass& p, int from, int to) {
    Datum args[5] = {p.setup.name, 0, 0, Int32GetDatum(from), Int32GetDatum(to)};
    chosen_lanes(p, &args[1], &args[2]);
    exec(claim_running_statement, args, false, SPI_OK_UPDATE);
}

// With the last outcomes of a worker's pass.
void clear_claims(Pass& p) {
    Datum args[3] = {p.setup.name, 0, 0};
    chosen_lanes(p, &args[1], &args[2]);
    exec(claim_clear_statement, args, false, SPI_OK_UPDATE);
}

}  // namespace eventbox::handlers
