// Pieces every eventbox background worker shares: signal set-up, the per-worker settings that keep
// hot queries fast (no JIT, kept generic plans) and the latch wait.
#pragma once

extern "C" {
#include "postgres.h"

#include "executor/spi.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
}

#include "pg/shmem.hpp"

namespace eventbox::kafka {
class ClientEvents;
}

namespace eventbox::worker {

// Installs SIGTERM/SIGHUP handlers and unblocks signals.
void setup_signals();

// Opens a worker transaction: the statement start time (now() of the transaction), the
// transaction, the schema lock (the worker exits quietly when the extension was dropped or
// re-created: pg::lock_schema_or_exit), SPI and an active snapshot. `who` names the worker in
// the error raised when SPI cannot connect.
void begin_work(const char* who);
// begin_work() for a process that outlives the install it works on (the supervisor): when the
// extension was dropped or re-created while it waited for the schema lock, commits the empty
// transaction and returns false instead of exiting; else returns true with everything open.
bool try_begin_work(const char* who);
// Closes what begin_work() opened: pops the snapshot, finishes SPI and commits.
void end_work();

// What a worker is busy with, named in the CONTEXT line of every error raised while it is
// pushed: "eventbox handler: subscription "s", lane "t"[2], batch 17". Fields left NULL / -1
// are not named. Push it around a step; pop it in the same frame (an ERROR resets the stack
// to nothing, see recover_from_error).
struct WorkContext {
    const char* who = nullptr;
    const char* subscription = nullptr;
    const char* topic = nullptr;
    int32 partition = -1;
    int64 batch = -1;
    ErrorContextCallback callback{};
};
void push_work_context(WorkContext* context);
void pop_work_context(WorkContext* context);

// The skeleton every eventbox background worker's main runs: signals, the database connection,
// the worker settings, its shared-memory slot, a memory context reset after every turn, and the
// sigsetjmp that turns an ERROR into recover_from_error() and a backoff. The worker supplies the
// steps; the backoff is cleared after a turn that completed.
struct WorkerMain {
    shmem::Role role;
    int index;                                  // its slot among workers of that role
    bool async_commit;                          // see apply_worker_settings()
    const char* context_name;                   // of the per-turn context: a string literal
    void (*start)(MemoryContext turn_context);  // once, after attaching: the worker's own state
    void (*after_error)();                      // state that must not outlive an ERROR, or NULL
    void (*turn)(MemoryContext turn_context);   // one turn: work, then wait for more
};
[[noreturn]] void run_worker(Datum database, const WorkerMain& main);
// Applies the session settings workers run with.
void apply_worker_settings(bool async_commit);
// Reloads the configuration if SIGHUP arrived; returns true when it did.
bool reload_if_requested();
// Emits the logs librdkafka queued on `client` from this thread, prefixed by `who`: details at
// DEBUG1, warnings and errors at LOG at most once per 10 s per process (with a count of the
// suppressed ones), also recorded as the worker's last error.
void emit_kafka_logs(kafka::ClientEvents& client, const char* who);
// After an ERROR caught by the worker's sigsetjmp: reports and records it, aborts the
// transaction, runs `cleanup` (worker-specific state that must not outlive the error), resets
// `batch_context` and waits a growing backoff (*backoff_ms: 1 s doubling to 30 s).
void recover_from_error(MemoryContext batch_context, void (*cleanup)(), int* backoff_ms);

// An internal subtransaction and what its caller had before it. begin_subtransaction() starts
// one and stays in the caller's memory context; end_subtransaction() commits or rolls it back;
// abort_subtransaction(), in the PG_CATCH block of an error inside it, rolls it back and returns
// the error, copied into the caller's context (the error state is flushed). Both give the caller
// its memory context and resource owner back.
struct Subtransaction {
    MemoryContext context;
    ResourceOwner owner;
};
Subtransaction begin_subtransaction();
void end_subtransaction(const Subtransaction& sub, bool commit);
ErrorData* abort_subtransaction(const Subtransaction& sub);

// SPI_prepare + SPI_keepplan, raising ERROR with `who` and the statement on failure.
SPIPlanPtr prepare_kept(const char* who, const char* sql, int nargs, Oid* types);
// A statement kept across transactions, declared beside the code that runs it (with the index
// its plan must use, docs/design/plans.md) and prepared the first time it runs: its text,
// argument types and plan.
struct KeptStatement {
    const char* sql;
    int nargs;
    Oid types[11];
    SPIPlanPtr plan;  // nullptr until prepared
};
// The statement's kept plan, prepared first if need be (prepare_kept, naming `who` in its errors;
// SPI connected).
SPIPlanPtr prepared(KeptStatement& statement, const char* who);
// How a kept statement reaches its rows: through an index bounded by the statement's arguments
// (a lane, an id list or range), or by the ctids the worker read them at.
enum class Access { kIndex, kTid };
// Executes a kept plan (no NULL arguments), raising ERROR unless it returns `expected`. The
// planner settings that make the plan's shape independent of table statistics (which may be
// missing, stale or from before a TRUNCATE) are in force while it runs, and so also whenever
// PostgreSQL replans it (after an ANALYZE, for example): no sequential scans, sorts, hash or
// merge joins, a generic plan; with Access::kTid, no index or bitmap scans either, which leaves
// the TID scan. Only settings that differ are changed (the workers run with most of them), so
// eventbox.process() plans exactly like the workers.
void exec_kept(const char* who, SPIPlanPtr plan, Datum* values, bool read_only, int expected,
               Access access = Access::kIndex);

// exec_kept() of the statement's plan, prepared first if need be.
inline void exec_kept(const char* who, KeptStatement& statement, Datum* values, bool read_only,
                      int expected, Access access = Access::kIndex) {
    exec_kept(who, prepared(statement, who), values, read_only, expected, access);
}

// Inbox rows of subscription $1 by message id, for a statement whose FROM has the ids as
// `unnest(...) AS u(id, ...)`: one probe of the primary key per id, a LATERAL subquery with a
// LIMIT (planned on its own, with both key columns as index conditions), returning COLUMNS of
// the row as x, where CONDITION (a further `AND ...` on x) holds. An UPDATE takes "x.ctid AS
// t" and reaches its target by `i.ctid = x.t`: a TID scan, the only path left when the target
// has no condition on an indexed column. Written as `message_id = ANY (ids)` instead, the
// lookup may be planned as a walk of the whole subscription with the ids as a filter: the
// planner keeps an index's order by leaving an array condition on a later column out of the
// index conditions, and picks that path whenever the inbox looked small when it planned.
#define EVENTBOX_INBOX_BY_ID(COLUMNS, CONDITION) \
    " CROSS JOIN LATERAL (SELECT " COLUMNS       \
    " FROM eventbox.inbox x"                     \
    "  WHERE x.subscription = $1 AND x.message_id = u.id " CONDITION " LIMIT 1) x "

// A bound on how often a kind of LOG line is written: at most `burst` lines per `window_ms`.
// Lines beyond it are counted, and the next line allowed says how many were held back.
struct LogRate {
    int burst;
    int window_ms;
    int64 window_start_ms = 0;
    int lines = 0;
    int held_back = 0;
};
// Whether a line may be written now; *held_back gets the lines suppressed since the last one.
bool log_allowed(LogRate& rate, int* held_back);

// Milliseconds on PostgreSQL's clock (GetCurrentTimestamp() / 1000, PostgreSQL epoch).
int64 now_ms();

}  // namespace eventbox::worker
