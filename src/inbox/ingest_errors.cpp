// The ingest worker's error bookkeeping: a failed batch pauses its subscription with a backoff;
// what each subscription's error is goes to eventbox.ingest_errors when it changes, and to the
// log at a bounded rate (see inbox/ingest.hpp).
#include "inbox/ingest.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "utils/builtins.h"
}

#include <algorithm>
#include <string>

#include "pg/boundary.hpp"
#include "pg/shmem.hpp"

namespace eventbox::ingest {

namespace {

// Lines about single subscriptions, at most 5 a minute of each kind: added, moved or recovered;
// failing.
worker::LogRate subscription_log_rate{5, 60000};
worker::LogRate failure_log_rate{5, 60000};

constexpr int kMaxBackoffMs = 60000;

// Logs a line about one subscription, at most `rate` allows.
void log_subscription_at(worker::LogRate& rate, const char* fmt, const char* name,
                         const char* what) {
    int held_back = 0;
    if (!worker::log_allowed(rate, &held_back)) return;
    ereport(LOG, (errmsg_internal(fmt, name, what),
                  held_back ? errdetail("%d similar messages suppressed.", held_back) : 0));
}

}  // namespace

void log_subscription(const char* fmt, const char* name, const char* what) {
    log_subscription_at(subscription_log_rate, fmt, name, what);
}

// ---- a failed batch -------------------------------------------------------------------------

int IngestState::fail(Subscription* sub, const char* message) {
    return pg::call_cpp([&] {
        consumer_->pause(sub->id);
        sub->failing = true;
        sub->probing = false;  // registry_turn() sets it again when the registry failed it
        sub->attempts += 1;
        sub->backoff_ms = std::min(std::max(sub->backoff_ms * 2, 1000), kMaxBackoffMs);
        sub->retry_at_ms = worker::now_ms() + sub->backoff_ms;
        sub->error = message;
        return sub->backoff_ms;
    });
}

void subscription_failed(Subscription* sub, const char* message) {
    int backoff_ms = state.fail(sub, message);
    shmem::record_error(message);
    int held_back = 0;
    if (worker::log_allowed(failure_log_rate, &held_back))
        ereport(LOG, (errmsg("eventbox ingest: subscription \"%s\" could not store a batch: %s",
                             sub->name.c_str(), message),
                      errdetail(
                          "It is read again from its stored offsets in %d s (attempt %d); "
                          "the other subscriptions go on.%s",
                          backoff_ms / 1000, sub->attempts,
                          held_back ? psprintf(" %d similar messages suppressed.", held_back) : ""),
                      errhint("See eventbox.subscription_errors.")));
}

// ---- eventbox.ingest_errors -----------------------------------------------------------------

const std::string& IngestState::wanted_error(const Subscription* sub) const noexcept {
    return sub->failing ? sub->error : consumer_->problem(sub->id);
}

bool IngestState::error_changed(const Subscription* sub) const noexcept {
    return wanted_error(sub) != sub->recorded ||
           (sub->failing ? sub->attempts : 0) != sub->recorded_attempts;
}

bool IngestState::errors_due() const noexcept {
    for (Subscription* s : *subscriptions_)
        if (error_changed(s)) return true;
    return false;
}

void IngestState::recorded(Subscription* sub) {
    pg::call_cpp([&] {
        sub->recorded = wanted_error(sub);
        sub->recorded_attempts = sub->failing ? sub->attempts : 0;
    });
}

namespace {

// A subscription's row. Index: ingest_errors_pkey (the arbiter).
worker::KeptStatement error_set_statement{
    "INSERT INTO eventbox.ingest_errors AS e (subscription, worker, error, attempts, "
    "next_retry_at) VALUES ($1, $2, $3, $4, $5) "
    "ON CONFLICT (subscription, worker) DO UPDATE SET error = excluded.error, "
    "attempts = excluded.attempts, next_retry_at = excluded.next_retry_at, "
    "updated_at = now()",
    5,
    {TEXTOID, INT4OID, TEXTOID, INT4OID, TIMESTAMPTZOID},
    nullptr};

// A subscription's row, once it is well again. Index: ingest_errors_pkey, both of its columns.
worker::KeptStatement error_clear_statement{
    "DELETE FROM eventbox.ingest_errors WHERE subscription = $1 AND worker = $2",
    2,
    {TEXTOID, INT4OID},
    nullptr};

}  // namespace

void write_error_row(const char* subscription, const char* error, int attempts, int64 retry_at_ms) {
    Datum name = CStringGetTextDatum(subscription);
    if (error[0] == '\0') {
        Datum values[2] = {name, Int32GetDatum(member)};
        worker::exec_kept(kWho, error_clear_statement, values, false, SPI_OK_DELETE);
        return;
    }
    Datum values[5] = {name, Int32GetDatum(member), CStringGetTextDatum(error),
                       Int32GetDatum(attempts), TimestampTzGetDatum(retry_at_ms * 1000)};
    char nulls[5] = {' ', ' ', ' ', ' ', retry_at_ms >= 0 ? ' ' : 'n'};
    int rc = SPI_execute_plan(worker::prepared(error_set_statement, kWho), values, nulls, false, 0);
    if (rc != SPI_OK_INSERT) elog(ERROR, "eventbox ingest: recording an error failed");
}

namespace {

// Writes `error` ("" = none) as `sub`'s row, and logs the change.
void record_error(Subscription* sub, const char* error) {
    if (error[0] == '\0') {
        write_error_row(sub->name.c_str(), "", 0, -1);
        log_subscription("eventbox ingest: subscription \"%s\" is consumed again%s",
                         sub->name.c_str(), "");
        return;
    }
    bool paused = state.paused(sub);
    write_error_row(sub->name.c_str(), error, sub->failing ? sub->attempts : 0,
                    sub->failing && paused ? sub->retry_at_ms : -1);
    if (!sub->failing && sub->recorded.empty())  // failures were logged when they happened
        log_subscription_at(failure_log_rate,
                            "eventbox ingest: subscription \"%s\" cannot be consumed: %s",
                            sub->name.c_str(), error);
}

}  // namespace

// Rows change only when a subscription starts or stops failing, or fails again after its
// backoff; they are written in one transaction.
void record_errors() {
    if (!state.errors_due()) return;
    worker::begin_work(kWho);
    for (std::size_t k = 0; k < state.count(); ++k) {
        Subscription* sub = state.at(k);
        if (!state.error_changed(sub)) continue;
        record_error(sub, state.wanted_error(sub).c_str());
        state.recorded(sub);
    }
    worker::end_work();
}

}  // namespace eventbox::ingest
