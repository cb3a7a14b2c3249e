// Recording what happened to the messages a pass chose: processed, ignored (no handler takes
// them), failed (to retry after a backoff) or dead, each kind with one statement per run
// transaction, in the transaction that carries the handlers' effects. PostgreSQL side (see
// handlers/pass_internal.hpp).
extern "C" {
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/memutils.h"
}

#include <cstring>

#include "handlers/pass_internal.hpp"

namespace eventbox::handlers {

namespace {

// Processed rows are found by the ctid their fetch in the same transaction read them at
// (a TID scan: no index probe, no join); the ids come back, and a row another transaction
// updated since is marked by its id (processed_by_id_statement: the primary key, one probe per
// id). Both mark the same way.
#define MARK_PROCESSED                                                              \
    "UPDATE eventbox.inbox i SET status = 'processed', attempts = i.attempts + 1, " \
    "next_attempt_at = NULL, processed_at = now() "
KeptStatement processed_statement{
    MARK_PROCESSED "WHERE i.ctid = ANY ($2::tid[]) AND i.subscription = $1 RETURNING i.message_id",
    2,
    {TEXTOID, TIDARRAYOID},
    nullptr};
KeptStatement processed_by_id_statement{MARK_PROCESSED
                                        "FROM unnest($2::text[]) AS u(id) " EVENTBOX_INBOX_BY_ID(
                                            "x.ctid AS t", "") "WHERE i.ctid = x.t",
                                        2,
                                        {TEXTOID, TEXTARRAYOID},
                                        nullptr};
#undef MARK_PROCESSED

// By the primary key, one probe per id (EVENTBOX_INBOX_BY_ID), as the failed ones.
KeptStatement ignored_statement{
    "UPDATE eventbox.inbox i SET status = 'ignored', processed_at = now() "
    "FROM unnest($2::text[]) AS u(id) " EVENTBOX_INBOX_BY_ID("x.ctid AS t",
                                                             "") "WHERE i.ctid = x.t",
    2,
    {TEXTOID, TEXTARRAYOID},
    nullptr};

KeptStatement failed_statement{
    "UPDATE eventbox.inbox i SET status = CASE WHEN u.dead THEN 'dead' ELSE 'retry' END, "
    "attempts = i.attempts + 1, last_error = u.err, "
    "next_attempt_at = CASE WHEN u.dead THEN NULL "
    "                  ELSE clock_timestamp() + u.delay * interval '1 millisecond' END "
    "FROM unnest($2::text[], $3::text[], $4::int8[], $5::bool[]) AS u(id, err, delay, "
    "dead) " EVENTBOX_INBOX_BY_ID("x.ctid AS t", "") "WHERE i.ctid = x.t",
    5,
    {TEXTOID, TEXTARRAYOID, TEXTARRAYOID, INT8ARRAYOID, BOOLARRAYOID},
    nullptr};

// Marks processed the rows of `o` that a TID scan did not find where their fetch read them
// (another transaction updated them since), by their ids. SPI_tuptable holds the ids it found.
void mark_moved_processed(Datum name, const Outcomes& o) {
    uint64 n_found = SPI_processed;
    char** found = static_cast<char**>(palloc(sizeof(char*) * Max(n_found, 1)));
    for (uint64 r = 0; r < n_found; ++r)
        found[r] = nullable_text(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1);
    pg::ArrayColumn moved(o.n_processed, TEXTOID);
    int n_moved = 0;
    for (int k = 0; k < o.n_processed; ++k) {
        char* id = TextDatumGetCString(o.processed.value(k));
        bool seen = false;
        for (uint64 r = 0; r < n_found && !seen; ++r) seen = strcmp(found[r], id) == 0;
        if (!seen) moved.set(n_moved++, o.processed.value(k));
    }
    if (n_moved == 0) return;
    Datum args[2] = {name, moved.get(n_moved)};
    exec(processed_by_id_statement, args, false, SPI_OK_UPDATE);
}

// The failed messages of `o` that went dead: their keys blocked and their dead letters sent
// (dead_letters::after_dead()) in the transaction that marks them.
void record_dead(Datum name, const Outcomes& o) {
    pg::ArrayColumn dead_ids(o.n_failed, TEXTOID);
    int n_dead = 0;
    for (int k = 0; k < o.n_failed; ++k)
        if (DatumGetBool(o.failed_dead.value(k))) dead_ids.set(n_dead++, o.failed_ids.value(k));
    if (n_dead > 0) dead_letters::after_dead(name, dead_ids.get(n_dead));
}

}  // namespace

void record_outcomes(Datum name, const Outcomes& o) {
    if (o.n_processed > 0) {
        Datum args[2] = {name, o.processed_tids.get(o.n_processed)};
        exec(processed_statement, args, false, SPI_OK_UPDATE_RETURNING, worker::Access::kTid);
        if (SPI_processed < static_cast<uint64>(o.n_processed)) mark_moved_processed(name, o);
    }
    if (o.n_ignored > 0) {
        Datum args[2] = {name, o.ignored.get(o.n_ignored)};
        exec(ignored_statement, args, false, SPI_OK_UPDATE);
    }
    if (o.n_failed > 0) {
        Datum args[5] = {name, o.failed_ids.get(o.n_failed), o.failed_errors.get(o.n_failed),
                         o.failed_delays.get(o.n_failed), o.failed_dead.get(o.n_failed)};
        exec(failed_statement, args, false, SPI_OK_UPDATE);
        record_dead(name, o);
    }
}

int ignore_unhandled(Pass& p, int n_chosen, bool* to_run, int* n_to_run) {
    pg::ArrayColumn unhandled_ids(Max(n_chosen, 1), TEXTOID);
    int n_unhandled = 0;
    *n_to_run = 0;
    for (int c = 0; c < n_chosen; ++c) {
        ChosenMessage m = p.work.chosen(c);
        if (!m.handled) {
            unhandled_ids.set(n_unhandled++, CStringGetTextDatum(m.id));
            count_final(m);
        } else {
            to_run[c] = true;
            ++*n_to_run;
        }
    }
    if (n_unhandled > 0) {
        Datum ignore_args[2] = {p.setup.name, unhandled_ids.get()};
        exec(ignored_statement, ignore_args, false, SPI_OK_UPDATE);
        MemoryContextSwitchTo(p.memory);
    }
    return n_unhandled;
}

}  // namespace eventbox::handlers
