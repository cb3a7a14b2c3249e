// Running the messages a pass chose: a worker in run transactions of at most
// kMessagesPerTransaction messages, each committing its messages' outcomes with their handlers'
// effects; eventbox.process() in its caller's transaction. Each transaction's rows are fetched
// by their ctid, their handlers run together in one subtransaction until one fails, and what
// happened is recorded (outcomes.cpp). PostgreSQL side (see handlers/pass_internal.hpp).
extern "C" {
#include "postgres.h"

#include "access/heapam.h"
#include "access/table.h"
#include "access/xact.h"
#include "nodes/makefuncs.h"
#include "storage/bufmgr.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
}

#include <cstring>

#include "handlers/pass_internal.hpp"
#include "handlers/runner.hpp"
#include "metrics/counters.hpp"

namespace eventbox::handlers {

namespace {

// The inbox columns fetch_rows() reads and changes, by attribute number (0-based), looked up
// in the relation's descriptor each time (it can change with the schema).
struct InboxColumns {
    int subscription = -1, message_id = -1, status = -1, attempts = -1, next_attempt_at = -1,
        mode = -1;
};

InboxColumns inbox_columns(TupleDesc desc) {
    InboxColumns c;
    for (int a = 0; a < desc->natts; ++a) {
        Form_pg_attribute att = TupleDescAttr(desc, a);
        if (att->attisdropped) continue;
        const char* name = NameStr(att->attname);
        if (strcmp(name, "subscription") == 0)
            c.subscription = a;
        else if (strcmp(name, "message_id") == 0)
            c.message_id = a;
        else if (strcmp(name, "status") == 0)
            c.status = a;
        else if (strcmp(name, "attempts") == 0)
            c.attempts = a;
        else if (strcmp(name, "next_attempt_at") == 0)
            c.next_attempt_at = a;
        else if (strcmp(name, "mode") == 0)
            c.mode = a;
    }
    if (c.subscription < 0 || c.message_id < 0 || c.status < 0 || c.attempts < 0 ||
        c.next_attempt_at < 0 || c.mode < 0)
        elog(ERROR, "eventbox handlers: eventbox.inbox lacks a column the handler pass needs");
    return c;
}

bool text_equals(Datum d, const char* s) {
    text* t = DatumGetTextPP(d);
    std::size_t n = VARSIZE_ANY_EXHDR(t);
    return strlen(s) == n && memcmp(VARDATA_ANY(t), s, n) == 0;
}

// The row of chosen message `m` as its handlers see it (with the attempt that is running and no
// next_attempt_at), read at its ctid in `snapshot`; 0 when it is not the message's waiting row.
// *replay gets whether its mode is 'replay'.
Datum fetch_row(Relation rel, const InboxColumns& col, Snapshot snapshot, const char* subscription,
                const ChosenMessage& m, Datum* values, bool* nulls, bool* replay) {
    TupleDesc desc = RelationGetDescr(rel);
    HeapTupleData tuple;
    ItemPointerSet(&tuple.t_self, static_cast<BlockNumber>(m.tid >> 16),
                   static_cast<OffsetNumber>(m.tid & 0xFFFF));
    Buffer buffer = InvalidBuffer;
    if (!heap_fetch(rel, snapshot, &tuple, &buffer, false)) {
        if (BufferIsValid(buffer)) ReleaseBuffer(buffer);
        return (Datum)0;
    }
    heap_deform_tuple(&tuple, desc, values, nulls);
    bool runs =
        !nulls[col.subscription] && !nulls[col.message_id] && !nulls[col.status] &&
        text_equals(values[col.subscription], subscription) &&
        text_equals(values[col.message_id], m.id) &&
        (text_equals(values[col.status], "received") || text_equals(values[col.status], "retry"));
    Datum row = (Datum)0;
    if (runs) {
        *replay = !nulls[col.mode] && text_equals(values[col.mode], "replay");
        values[col.attempts] = Int32GetDatum(DatumGetInt32(values[col.attempts]) + 1);
        nulls[col.next_attempt_at] = true;
        HeapTuple shown = heap_form_tuple(desc, values, nulls);
        row = heap_copy_tuple_as_datum(shown, desc);
        heap_freetuple(shown);
    }
    ReleaseBuffer(buffer);
    return row;
}

// Fetches the rows of chosen messages [from, to) marked in `to_run` into rows[] (left 0 for
// one not found: an operator changed it meanwhile), and whether each is a replay into replays[].
// Each row is read where the lane read found it (its ctid) in the transaction's snapshot, like a
// TID scan, without a statement: nothing but the lane's holder updates these rows, and a row that
// was changed since (another version), or whose subscription, status or id differ (the table was
// rewritten), does not run. This cost a statement with a TID scan, a ROW() expression and two
// copies of every row before.
void fetch_rows(const Pass& p, const bool* to_run, int from, int to, Datum* rows, bool* replays) {
    RangeVar* rv = makeRangeVar(const_cast<char*>("eventbox"), const_cast<char*>("inbox"), -1);
    Relation rel = table_openrv(rv, AccessShareLock);
    TupleDesc desc = RelationGetDescr(rel);
    InboxColumns col = inbox_columns(desc);
    const char* subscription = TextDatumGetCString(p.setup.name);
    Snapshot snapshot = GetActiveSnapshot();
    Datum* values = static_cast<Datum*>(palloc(sizeof(Datum) * desc->natts));
    bool* nulls = static_cast<bool*>(palloc(sizeof(bool) * desc->natts));
    for (int c = from; c < to; ++c) {
        if (!to_run[c]) continue;
        Datum row = fetch_row(rel, col, snapshot, subscription, p.work.chosen(c), values, nulls,
                              &replays[c]);
        if (row != (Datum)0) rows[c] = row;
    }
    table_close(rel, NoLock);  // held to the end of the transaction, as a SELECT holds it
}

// Names the lane of chosen message `c` in the pass's errors.
void name_lane_of(Pass& p, int c) noexcept {
    LaneId lane = p.work.lane_id(p.work.lane_of_chosen(static_cast<std::size_t>(c)));
    name_lane(p, lane.topic, lane.partition);
}

// Chosen message `c` is the one whose handlers run next: in a worker's pass, which claimed it,
// a termination for running past the handler timeout leaves a note naming it.
void claim_running_chosen(const Pass& p, int c) noexcept {
    if (!p.own_transactions) return;
    ChosenMessage m = p.work.chosen(static_cast<std::size_t>(c));
    LaneId lane = p.work.lane_id(m.lane);
    claim_running(p.subscription, lane.topic, lane.partition, m.id, m.attempts);
}

// The handlers of chosen message `c` that take its event type, in `matching` (room for every
// handler); -1 when a failure earlier in the pass holds the message back.
int matching_handlers(const Pass& p, int c, HandlerRef** matching) {
    if (p.work.is_held_back(c, p.setup.options.ordering)) return -1;
    return handlers_taking(p.setup, p.work.chosen(c).event_type, matching);
}

// How a message's handlers ran in run_together(): `ran` false when they did not run there (or
// their run was rolled back with a later message's failure); error NULL when they succeeded.
struct RanTogether {
    bool ran;
    char* error;
    int64 duration_us;
};

// Adds the failed attempt of chosen message `c` (`m`) with `error` to `out`: retried after a
// backoff, dead once it was the last attempt or the error is one not retried.
void add_failure(Pass& p, int c, const ChosenMessage& m, Datum id, char* error, int64 duration_us,
                 Outcomes* out) {
    const Options& options = p.setup.options;
    int32 attempts = m.attempts + 1;
    bool refused = dead_letters::refuses(options.dead, error);
    bool dead = attempts >= options.max_attempts || refused;
    if (refused) error = psprintf("%s (not retried: non_retryable)", error);
    metrics::handler_failed(duration_us, dead);
    double unit = p.work.next_jitter();
    int64 delay = retry_delay_ms(attempts, options.backoff_ms, options.backoff_max_ms, unit);
    out->add_failed(id, CStringGetTextDatum(error), Int64GetDatum(delay), BoolGetDatum(dead));
    if (dead) count_final(m);
    p.work.mark_failed(static_cast<std::size_t>(c));
    if (!dead && p.now + delay < *p.next_due_ms) *p.next_due_ms = p.now + delay;
}

// Runs chosen message `c`, whose row was fetched, unless a failure earlier in the pass holds it
// back; adds its outcome to `out`. `matching` has room for every handler. With `ran`, its
// handlers ran already (run_together()) and that outcome is recorded. Returns whether it was
// handled (processed, ignored or failed).
bool run_chosen(Pass& p, int c, Datum row, HandlerRef** matching, Outcomes* out,
                const RanTogether* ran) {
    ChosenMessage m = p.work.chosen(c);
    Datum id = CStringGetTextDatum(m.id);
    int n_matching = matching_handlers(p, c, matching);
    if (n_matching < 0) return false;  // stays as it was, to follow the retry
    if (n_matching == 0) {
        out->add_ignored(id);
        count_final(m);
        metrics::handler_ignored(1);
        return true;
    }
    char* error;
    int64 duration_us;
    if (ran != nullptr) {
        error = ran->error;
        duration_us = ran->duration_us;
    } else {
        TimestampTz started = GetCurrentTimestamp();
        claim_running_chosen(p, c);
        error = run_message(row, matching, n_matching);
        duration_us = GetCurrentTimestamp() - started;
    }
    pfree(DatumGetPointer(row));
    if (error != nullptr) {
        add_failure(p, c, m, id, error, duration_us, out);
        return true;
    }
    auto tid = static_cast<ItemPointer>(palloc(sizeof(ItemPointerData)));
    ItemPointerSet(tid, static_cast<BlockNumber>(m.tid >> 16),
                   static_cast<OffsetNumber>(m.tid & 0xFFFF));
    out->add_processed(id, PointerGetDatum(tid));
    count_final(m);
    metrics::handler_processed(duration_us);
    return true;
}

// Runs the handlers of the fetched messages from `from` up to `to` in one subtransaction, rather
// than one each: a subtransaction per message (an xid with its lock and pg_subtrans entry, the
// settings' and resource owners' bookkeeping at its end) cost 5-19% of the handler workers' CPU
// per message with a trivial handler (paired runs). Messages held back or without a handler are
// left to run_chosen(). Each message run is recorded in ran[]; when every one succeeded, the
// subtransaction is released. When one fails, the subtransaction is rolled back with what the
// messages before it did: those are marked as not run (run_chosen() runs them again, each in a
// subtransaction of its own, as it runs the ones after it), and the failed one keeps its error.
// It is not run twice: its attempt saw what they did, as it would have after them, and failed.
void run_together(Pass& p, int from, int to, const Datum* rows, HandlerRef** matching,
                  RanTogether* ran) {
    volatile int at = from;
    volatile TimestampTz started = 0;
    worker::Subtransaction sub = worker::begin_subtransaction();
    PG_TRY();
    {
        for (int c = from; c < to; at = ++c) {
            if (rows[c] == (Datum)0) continue;
            int n_matching = matching_handlers(p, c, matching);
            if (n_matching <= 0) continue;
            name_lane_of(p, c);
            started = GetCurrentTimestamp();
            claim_running_chosen(p, c);
            call_handlers(rows[c], matching, n_matching);
            ran[c] = RanTogether{true, nullptr, GetCurrentTimestamp() - started};
        }
        name_lane(p, nullptr, -1);
        worker::end_subtransaction(sub, true);
    }
    PG_CATCH();
    {
        char* error = handlers_failed(sub);
        // Past the last message: releasing the subtransaction failed, not a handler.
        if (at == to) elog(ERROR, "eventbox handlers: %s", error);
        for (int c = from; c < at; ++c) ran[c].ran = false;
        ran[at] = RanTogether{true, error, GetCurrentTimestamp() - started};
    }
    PG_END_TRY();
}

// ---- batch handlers ---------------------------------------------------------------------------

// Calls the batch handlers `handlers` on the k rows of a chunk whose first message is chosen
// message `first`, in a subtransaction of their own; NULL when they succeeded (the
// subtransaction is released), else the error's text (it was rolled back).
char* call_chunk(Pass& p, int first, const Datum* chunk_rows, int k, HandlerRef* const* handlers,
                 int n_handlers) {
    char* volatile error = nullptr;
    name_lane_of(p, first);
    claim_running_chosen(p, first);
    worker::Subtransaction sub = worker::begin_subtransaction();
    PG_TRY();
    {
        call_batch_handlers(chunk_rows, k, handlers, n_handlers);
        worker::end_subtransaction(sub, true);
    }
    PG_CATCH();
    { error = handlers_failed(sub); }
    PG_END_TRY();
    return error;
}

// Runs the chunk of chosen messages members[0..k) (one lane's, in order, none held back) with one
// call of each of `handlers`, and records the outcomes in order. When the call fails, the chunk
// is split in two, and each half runs the same way (the second only with what a failure in the
// first does not hold back), until the failing message is alone: it alone fails its attempt
// (retried or dead by the subscription's policy), its neighbours are processed. Each half that
// succeeds is released before the next runs, so a message's effects are seen by the later
// ones, as in one call. `scratch` has room for every handler. Returns how many were handled.
int run_chunk(Pass& p, int* members, int k, const Datum* rows, HandlerRef* const* handlers,
              int n_handlers, HandlerRef** scratch, Outcomes* out) {
    Datum* chunk_rows = static_cast<Datum*>(palloc(sizeof(Datum) * k));
    for (int i = 0; i < k; ++i) chunk_rows[i] = rows[members[i]];
    TimestampTz started = GetCurrentTimestamp();
    char* error = call_chunk(p, members[0], chunk_rows, k, handlers, n_handlers);
    int64 duration_us = GetCurrentTimestamp() - started;
    pfree(chunk_rows);
    if (error == nullptr || k == 1) {
        int handled = 0;
        for (int i = 0; i < k; ++i) {
            RanTogether ran{true, error, duration_us / k};
            name_lane_of(p, members[i]);
            if (run_chosen(p, members[i], rows[members[i]], scratch, out, &ran)) ++handled;
        }
        return handled;
    }
    int half = k / 2;
    int handled = run_chunk(p, members, half, rows, handlers, n_handlers, scratch, out);
    int kept = 0;
    for (int i = half; i < k; ++i)
        if (!p.work.is_held_back(members[i], p.setup.options.ordering))
            members[half + kept++] = members[i];
    if (kept > 0)
        handled += run_chunk(p, members + half, kept, rows, handlers, n_handlers, scratch, out);
    return handled;
}

bool same_handlers(HandlerRef* const* a, HandlerRef* const* b, int n) {
    for (int i = 0; i < n; ++i)
        if (a[i] != b[i]) return false;
    return true;
}

bool all_batch(HandlerRef* const* handlers, int n) {
    for (int i = 0; i < n; ++i)
        if (!handlers[i]->batch) return false;
    return n > 0;
}

// Runs the fetched messages [from, to) of a subscription with batch handlers, recording their
// outcomes in order: a chunk is a run of consecutive messages of one lane and one mode whose
// handlers are the same batch handlers (run_chunk()); any other message runs alone
// (run_chosen(), batch handlers getting a one-element array). Returns how many were handled.
int run_chunks(Pass& p, int from, int to, Datum* rows, const bool* replays, Outcomes* out) {
    int room = Max(p.setup.n_handlers, 1);
    auto** first = static_cast<HandlerRef**>(palloc(sizeof(HandlerRef*) * room));
    auto** other = static_cast<HandlerRef**>(palloc(sizeof(HandlerRef*) * room));
    auto** scratch = static_cast<HandlerRef**>(palloc(sizeof(HandlerRef*) * room));
    int* members = static_cast<int*>(palloc(sizeof(int) * (to - from)));
    int handled = 0;
    for (int c = from; c < to; ++c) {
        if (rows[c] == (Datum)0) continue;
        int n = matching_handlers(p, c, first);
        if (n < 0) continue;  // held back: stays as it was, to follow the retry
        name_lane_of(p, c);
        if (!all_batch(first, n)) {
            if (run_chosen(p, c, rows[c], scratch, out, nullptr)) ++handled;
            continue;
        }
        std::size_t lane = p.work.lane_of_chosen(static_cast<std::size_t>(c));
        int k = 0;
        members[k++] = c;
        for (int d = c + 1; d < to; ++d) {
            if (rows[d] == (Datum)0) continue;
            if (p.work.lane_of_chosen(static_cast<std::size_t>(d)) != lane ||
                replays[d] != replays[c] || matching_handlers(p, d, other) != n ||
                !same_handlers(first, other, n))
                break;
            members[k++] = d;
        }
        int last = members[k - 1];
        handled += run_chunk(p, members, k, rows, first, n, scratch, out);
        c = last;
    }
    name_lane(p, nullptr, -1);
    return handled;
}

// Runs the fetched messages [from, to) of a subscription without batch handlers (or in a dry
// run): together until one fails (run_together()), then each alone, recording their outcomes
// in order. Returns how many were handled.
int run_singly(Pass& p, int from, int to, const Datum* rows, HandlerRef** matching,
               RanTogether* ran, Outcomes* out) {
    if (!dry_running()) run_together(p, from, to, rows, matching, ran);
    int handled = 0;
    for (int c = from; c < to; ++c) {
        if (rows[c] == (Datum)0) continue;  // handled meanwhile
        name_lane_of(p, c);
        const RanTogether* outcome = ran[c].ran ? &ran[c] : nullptr;
        if (run_chosen(p, c, rows[c], matching, out, outcome)) ++handled;
    }
    return handled;
}

// Ends a run transaction's batch of messages: the handlers' settings go; a worker records the
// batch's outcomes with its lanes' positions' rise, commits, raises its marks, and opens the
// next transaction, with room for the next outcomes. The next run transaction holds chosen
// messages [from, to): the pass's claims say so in the transaction that commits this one's
// outcomes.
void end_batch(Pass& p, Outcomes* out, int outcome_room, int from, int to) {
    unpin_handler_settings();
    if (!p.own_transactions) return;
    name_lane(p, nullptr, -1);
    record_outcomes(p.setup.name, *out);
    set_claims_running(p, from, to);
    // The lanes' positions and marks rise with the outcomes committed so far, not only at the
    // pass's end: the other worker's probes of these lanes start past them.
    advance_live_positions(p.setup.name);
    commit_run_transaction();
    raise_marks_after_commit(p.subscription);
    begin_run_transaction(p.memory);
    *out = Outcomes(outcome_room);
}

}  // namespace

void begin_run_transaction(MemoryContext memory) {
    worker::begin_work(kWho);
    MemoryContextSwitchTo(memory);
}

// The outcome commits asynchronously: lost in a crash, it is redone from its attempt (durable,
// counted before the run) together with the effects it carried, and the relay flushes the WAL
// before it publishes what a handler sent. Only the attempt count must be on disk before a
// handler runs.
void commit_run_transaction() {
    (void)set_config_option("synchronous_commit", "off", PGC_SUSET, PGC_S_SESSION, GUC_ACTION_LOCAL,
                            true, 0, false);
    worker::end_work();
}

// Where the run transaction of chosen messages [from, n_chosen) ends. Without batch handlers
// (or in a dry run) after kMessagesPerTransaction messages: each may take a subtransaction of
// its own. With them, a chunk takes one subtransaction whatever its size, so a transaction ends
// after kBatchMessagesPerTransaction messages, or before, once it would hold more than
// kMessagesPerTransaction subtransactions: counted before the run
// as a chunk per run of one lane's messages with the same batch handlers (two per lane, for its
// live and replay messages), and one per message some plain handler takes. A failed chunk's
// halves are subtransactions too, but rolled back ones leave the cache.
int transaction_end(const Pass& p, int from, int n_chosen, bool chunks, HandlerRef** scratch,
                    HandlerRef** previous) {
    if (!chunks) return Min(n_chosen, from + kMessagesPerTransaction);
    int units = 0, n_previous = -1;
    std::size_t lane = SIZE_MAX;
    for (int c = from; c < n_chosen; ++c) {
        ChosenMessage m = p.work.chosen(c);
        int n = handlers_taking(p.setup, m.event_type, scratch);
        bool batch = all_batch(scratch, n);
        int cost = 0;
        if (!batch)
            cost = 1;
        else if (m.lane != lane)
            cost = 2;
        else if (n != n_previous || !same_handlers(scratch, previous, n))
            cost = 1;
        if (c > from &&
            (units + cost > kMessagesPerTransaction || c - from >= kBatchMessagesPerTransaction))
            return c;
        units += cost;
        lane = m.lane;
        n_previous = batch ? n : -1;
        for (int i = 0; i < n && batch; ++i) previous[i] = scratch[i];
    }
    return n_chosen;
}

namespace {

// Whether the pass runs its messages in chunks (batch handlers). A dry run reports each message
// on its own: batch handlers get one-element arrays there.
bool runs_chunks(const Pass& p) {
    return p.setup.any_batch && !dry_running();
}

}  // namespace

int first_run_end(const Pass& p, int n_chosen) {
    if (n_chosen == 0) return 0;
    int room = Max(p.setup.n_handlers, 1);
    auto** scratch = static_cast<HandlerRef**>(palloc(sizeof(HandlerRef*) * room));
    auto** previous = static_cast<HandlerRef**>(palloc(sizeof(HandlerRef*) * room));
    int end = transaction_end(p, 0, n_chosen, runs_chunks(p), scratch, previous);
    pfree(scratch);
    pfree(previous);
    return end;
}

// In lane order, fetching each transaction's rows first; a failure holds back the rest of its
// lane (or key) in this pass. A transaction's messages run together (run_together()) until one
// fails, or, with batch handlers, in chunks (run_chunks()), which a transaction holds as many
// messages of as its subtransactions allow (transaction_end()). A worker records the outcomes of
// each transaction's messages and commits it; process() records all of its own in the caller's
// transaction. The first transaction ends at first_end (first_run_end(), the end the claims
// recorded).
int run_messages(Pass& p, int n_chosen, const bool* to_run, int first_end) {
    bool chunks = runs_chunks(p);
    int outcome_room =
        p.own_transactions && !chunks ? Min(n_chosen, kMessagesPerTransaction) : n_chosen;
    Outcomes out(outcome_room);
    Datum* rows = static_cast<Datum*>(palloc0(sizeof(Datum) * n_chosen));
    bool* replays = static_cast<bool*>(palloc0(sizeof(bool) * n_chosen));
    HandlerRef** matching =
        static_cast<HandlerRef**>(palloc(sizeof(HandlerRef*) * Max(p.setup.n_handlers, 1)));
    RanTogether* ran = static_cast<RanTogether*>(palloc0(sizeof(RanTogether) * n_chosen));
    int room = Max(p.setup.n_handlers, 1);
    auto** scratch = static_cast<HandlerRef**>(palloc(sizeof(HandlerRef*) * room));
    auto** previous = static_cast<HandlerRef**>(palloc(sizeof(HandlerRef*) * room));
    int handled = 0;
    // The handlers' settings are pinned around their calls only (from each batch's fetch to its
    // end): eventbox's own statements run with the worker's (or _process()'s) search_path,
    // pg_catalog first.
    for (int from = 0, to = 0; from < n_chosen; from = to) {
        to = from == 0 ? first_end : transaction_end(p, from, n_chosen, chunks, scratch, previous);
        if (from > 0) end_batch(p, &out, outcome_room, from, to);
        fetch_rows(p, to_run, from, to, rows, replays);
        pin_handler_settings();
        handled += chunks ? run_chunks(p, from, to, rows, replays, &out)
                          : run_singly(p, from, to, rows, matching, ran, &out);
    }
    unpin_handler_settings();  // n_chosen > 0 here: the loop pinned them
    name_lane(p, nullptr, -1);
    record_outcomes(p.setup.name, out);
    return handled;
}

}  // namespace eventbox::handlers
