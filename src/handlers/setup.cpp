// What a pass knows of its subscription, read at its start: its options (ordering, attempts,
// backoff, what becomes of messages no handler takes, the failure workflow's), its handlers in
// registration order, and what the lane reads derive from them. PostgreSQL side (see
// handlers/pass_internal.hpp).
extern "C" {
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/memutils.h"
}

#include "handlers/pass_internal.hpp"

namespace eventbox::handlers {

namespace {

// The subscription's row, by its primary key, and whether replays wait in it.
KeptStatement options_statement{
    "SELECT ordering, max_attempts, (extract(epoch FROM backoff) * 1000)::int8, "
    "(extract(epoch FROM backoff_max) * 1000)::int8, unhandled = 'keep', "
    // Per replay range of eventbox.inbox_positions (a lane has one once something was queued
    // for a replay in it), one probe of inbox_replay_idx from its position: lanes are read for
    // replays only while some wait. (ORDER BY ... LIMIT 1 rather than EXISTS, which drops the
    // ORDER BY: only that index gives the order without a sort, the workers turn sorts off, so
    // no statistics can pick inbox_pkey and walk the subscription's rows.)
    "EXISTS (SELECT 1 FROM eventbox.inbox_positions p"
    "         WHERE p.subscription = $1 AND p.replay"
    "           AND (SELECT 1 FROM eventbox.inbox i"
    "                 WHERE i.subscription = $1 AND i.topic = p.topic"
    "                   AND i.\"partition\" = p.\"partition\" AND i.mode = 'replay'"
    "                   AND i.\"offset\" >= p.position AND i.status IN ('received', 'retry')"
    "                 ORDER BY i.\"offset\" LIMIT 1) IS NOT NULL) "
    "FROM eventbox.subscriptions WHERE name = $1 AND enabled",
    1,
    {TEXTOID},
    nullptr};

// Reads the subscription's options; returns false when it is gone or disabled.
bool read_options(Datum name, Options* options) {
    Datum args[1] = {name};
    exec(options_statement, args, true, SPI_OK_SELECT);
    if (SPI_processed == 0) return false;
    HeapTuple t = SPI_tuptable->vals[0];
    TupleDesc d = SPI_tuptable->tupdesc;
    bool isnull;
    options->ordering = ordering_from(nullable_text(t, d, 1));
    options->max_attempts = DatumGetInt32(SPI_getbinval(t, d, 2, &isnull));
    options->backoff_ms = DatumGetInt64(SPI_getbinval(t, d, 3, &isnull));
    options->backoff_max_ms = DatumGetInt64(SPI_getbinval(t, d, 4, &isnull));
    options->unhandled_keep = DatumGetBool(SPI_getbinval(t, d, 5, &isnull));
    options->replays = DatumGetBool(SPI_getbinval(t, d, 6, &isnull));
    return true;
}

// The subscription's handlers (a few rows), through handlers_unique, whose first column is the
// subscription.
KeptStatement handlers_statement{
    "SELECT event_type, coalesce(pg_catalog.to_regprocedure(handler)::oid, 0), run_as::oid, "
    "registered_by::oid, handler, batch "
    "FROM eventbox.handlers WHERE subscription = $1 ORDER BY created_at, handler",
    1,
    {TEXTOID},
    nullptr};

// The subscription's handlers, in registration order (in `memory`); *n gets how many.
HandlerRef* load_handlers(Datum name, MemoryContext memory, int* n) {
    Datum args[1] = {name};
    exec(handlers_statement, args, true, SPI_OK_SELECT);
    // SPI calls return in SPI's own context, which the commit between the two transactions
    // frees: everything the pass keeps is allocated in its memory context explicitly.
    MemoryContextSwitchTo(memory);
    int n_handlers = static_cast<int>(SPI_processed);
    HandlerRef* handlers =
        static_cast<HandlerRef*>(palloc0(sizeof(HandlerRef) * Max(n_handlers, 1)));
    for (int i = 0; i < n_handlers; ++i) {
        HeapTuple t = SPI_tuptable->vals[i];
        TupleDesc d = SPI_tuptable->tupdesc;
        bool isnull;
        handlers[i].event_type = nullable_text(t, d, 1);
        handlers[i].fn = DatumGetObjectId(SPI_getbinval(t, d, 2, &isnull));
        handlers[i].run_as = DatumGetObjectId(SPI_getbinval(t, d, 3, &isnull));
        handlers[i].registered_by = DatumGetObjectId(SPI_getbinval(t, d, 4, &isnull));
        handlers[i].signature = nullable_text(t, d, 5);
        handlers[i].batch = DatumGetBool(SPI_getbinval(t, d, 6, &isnull));
    }
    *n = n_handlers;
    return handlers;
}

}  // namespace

void load_setup(Datum name, MemoryContext memory, PassSetup* setup) {
    setup->name = name;
    setup->handlers = load_handlers(name, memory, &setup->n_handlers);
    setup->options = Options{Ordering::kPartition, 1, 1000, 1000, false};
    setup->found = read_options(name, &setup->options);
    dead_letters::load(name, memory, &setup->options.dead);
    // A subscription without any handler registered yet: its messages wait for one, whatever
    // `unhandled` says (that option is about event types no registered handler takes). Marking
    // them ignored threw away everything that arrived between create_subscription() and
    // register_handler(), as the README's own example does it.
    if (setup->found && setup->n_handlers == 0) setup->found = false;
    // The event types some handler takes, for reading lanes.
    setup->any_type = false;
    setup->any_batch = false;
    pg::ArrayColumn handled_types(setup->n_handlers, TEXTOID);
    setup->handler_types =
        static_cast<const char**>(palloc(sizeof(const char*) * Max(setup->n_handlers, 1)));
    for (int h = 0; h < setup->n_handlers; ++h) {
        const char* type = setup->handlers[h].event_type;
        if (setup->handlers[h].batch) setup->any_batch = true;
        setup->handler_types[h] = type;
        if (type == nullptr)
            setup->any_type = true;
        else
            handled_types.set(h, CStringGetTextDatum(type));
    }
    setup->handled_types = handled_types.get();
}

int handlers_taking(const PassSetup& setup, const char* event_type, HandlerRef** matching) {
    int n_matching = 0;
    for (int h = 0; h < setup.n_handlers; ++h)
        if (handler_takes(setup.handlers[h].event_type, event_type))
            matching[n_matching++] = &setup.handlers[h];
    return n_matching;
}

}  // namespace eventbox::handlers
