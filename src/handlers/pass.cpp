// A handler pass from its start to its end (see handlers/runner.hpp): it reads its subscription,
// chooses messages, commits their claims and attempts, runs them, and records what happened.
// Each step lives in the file of its concern (handlers/pass_internal.hpp); this file holds their
// order, the pass's own state and the guard against a pass inside a pass.
extern "C" {
#include "postgres.h"

#include "access/xact.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
}

#include <climits>

#include "handlers/pass_internal.hpp"
#include "handlers/runner.hpp"
#include "metrics/counters.hpp"
#include "pg/shmem.hpp"

namespace eventbox::handlers {

char* nullable_text(HeapTuple tuple, TupleDesc desc, int column) {
    bool isnull;
    Datum d = SPI_getbinval(tuple, desc, column, &isnull);
    return isnull ? nullptr : TextDatumGetCString(d);
}

namespace {

// This backend's passes.
struct Passes {
    // The working set (heap; begun anew by each pass; the cursors outlive passes).
    PassState* state = nullptr;
    // What a pass allocates lives here, across its two transactions and SPI connections.
    MemoryContext memory = nullptr;
    bool in_pass = false;     // a pass or a dry run is in progress
    bool found_work = false;  // see last_pass_found_work()
    int64 count = 0;          // passes begun: the batch a worker's errors name
};
Passes passes;

// Ends a pass that runs no message: a worker's first transaction commits the settlements of
// the claims it found with its positions' rise past what it ignored, and its marks rise;
// eventbox.process() raises the positions in its caller's transaction.
void end_without_runs(const Pass& p) {
    if (p.own_transactions) {
        advance_positions(p.setup.name);
        worker::end_work();
        raise_marks_after_commit(p.subscription);
    } else {
        advance_positions(p.setup.name);
        PopActiveSnapshot();
        SPI_finish();
    }
    release_lane_locks();
}

// Where the chosen messages run: a worker commits the first transaction (synchronously: the
// attempts its claims count must be on disk before any handler runs) and runs them in
// transactions of its own; eventbox.process() in its caller's, with a new snapshot.
void begin_runs(const Pass& p) {
    if (p.own_transactions) {
        worker::end_work();
        begin_run_transaction(p.memory);
    } else {
        PopActiveSnapshot();
        PushActiveSnapshot(GetTransactionSnapshot());
    }
}

// After the last messages ran: a worker empties the claims and raises its lanes' positions with
// their last outcomes, commits, raises its marks and releases its lanes; eventbox.process()
// raises the positions in its caller's transaction.
void end_runs(Pass& p) {
    if (p.own_transactions) {
        clear_claims(p);
        advance_positions(p.setup.name);
        commit_run_transaction();
        raise_marks_after_commit(p.subscription);
        release_lane_locks();
    } else {
        advance_positions(p.setup.name);
        PopActiveSnapshot();
        SPI_finish();
    }
}

// run_pass(), inside its guard against nesting; `context` names the pass in a worker's errors.
int run_pass_body(const char* subscription, int max, bool own_transactions, int64* next_due_ms,
                  worker::WorkContext* context) {
    *next_due_ms = INT64_MAX;
    passes.found_work = true;  // until the choice says otherwise
    MemoryContext memory;
    PassState* state = open_pass(own_transactions, &memory);
    Pass p{subscription, max, own_transactions, next_due_ms, memory, PassWork(state),
           PassSetup{},  0,   context};
    load_setup(CStringGetTextDatum(subscription), memory, &p.setup);
    p.now = worker::now_ms();
    int crash_dead = choose_messages(p, &passes.found_work);
    MemoryContextSwitchTo(memory);
    int n_chosen = static_cast<int>(p.work.chosen_count());
    if (own_transactions) release_unused_lanes(p);
    // What runs, and what is ignored (no handler) without an attempt.
    bool* to_run = static_cast<bool*>(palloc0(sizeof(bool) * Max(n_chosen, 1)));
    int n_to_run;
    int n_ignored = ignore_unhandled(p, n_chosen, to_run, &n_to_run);
    int handled = n_ignored + crash_dead;
    metrics::handler_discard();  // what an interrupted pass tallied never committed
    metrics::handler_ignored(static_cast<uint64>(n_ignored));
    metrics::handler_dead(static_cast<uint64>(crash_dead));
    // Each lane's claim: a worker's commits before any of its messages runs, so a handler that
    // kills the backend cannot run forever; a settled claim is emptied with its settlement.
    int first_end = n_to_run > 0 ? first_run_end(p, n_chosen) : 0;
    write_claims(p, to_run, first_end);
    if (n_to_run == 0) {
        end_without_runs(p);
    } else {
        begin_runs(p);
        handled += run_messages(p, n_chosen, to_run, first_end);
        end_runs(p);
    }
    shmem::count_messages(static_cast<uint64>(handled));
    metrics::handler_flush(subscription);
    return handled;
}

}  // namespace

PassState* open_pass(bool own_transactions, MemoryContext* memory) {
    if (passes.state == nullptr) passes.state = pg::call_cpp([] { return new PassState(); });
    register_handler_timeouts();
    if (passes.memory == nullptr)
        passes.memory = AllocSetContextCreate(TopMemoryContext, "eventbox handler pass",
                                              ALLOCSET_DEFAULT_SIZES);
    MemoryContextReset(passes.memory);
    if (own_transactions) {
        worker::begin_work(kWho);
    } else {
        if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "eventbox handlers: SPI_connect failed");
        PushActiveSnapshot(GetTransactionSnapshot());
    }
    // SPI calls return in SPI's context, which the commit between the two transactions frees:
    // what the pass keeps is allocated after switching to its own.
    MemoryContextSwitchTo(passes.memory);
    *memory = passes.memory;
    return passes.state;
}

void enter_pass(const char* function) {
    // A handler calling eventbox.process() would run a pass inside a pass, over the same state.
    if (passes.in_pass)
        ereport(ERROR, (errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
                        errmsg("%s cannot be called from a handler", function),
                        errhint("Handlers run inside a handler pass already.")));
    passes.in_pass = true;
}

void leave_pass() noexcept {
    passes.in_pass = false;
}

bool last_pass_found_work() {
    return passes.found_work;
}

int run_pass(const char* subscription, int max, bool own_transactions, int64* next_due_ms) {
    enter_pass("eventbox.process()");
    // A worker's errors name the subscription, the pass and the lane it works on.
    worker::WorkContext context;
    context.who = "eventbox handler";
    context.subscription = subscription;
    context.batch = ++passes.count;
    if (own_transactions) worker::push_work_context(&context);
    int handled = 0;
    PG_TRY();
    {
        handled = run_pass_body(subscription, max, own_transactions, next_due_ms,
                                own_transactions ? &context : nullptr);
    }
    PG_FINALLY();
    { leave_pass(); }
    PG_END_TRY();
    if (own_transactions) worker::pop_work_context(&context);
    return handled;
}

}  // namespace eventbox::handlers
