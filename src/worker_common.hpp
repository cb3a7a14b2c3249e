// Pieces every eventbox background worker shares: signal set-up, the per-worker settings that keep
// hot queries fast (no JIT, kept generic plans) and the latch wait.
#pragma once

extern "C" {
#include "postgres.h"
}

namespace eventbox::kafka {
class ClientEvents;
}

namespace eventbox::worker {

// Installs SIGTERM/SIGHUP handlers and unblocks signals.
void setup_signals();
// Applies the session settings workers run with.
void apply_worker_settings(bool async_commit);
// Reloads the configuration if SIGHUP arrived; returns true when it did.
bool reload_if_requested();
// Emits the logs librdkafka queued on `client` from this thread, prefixed by `who`: details at
// DEBUG1, warnings and errors at LOG at most once per 10 s per process (with a count of the
// suppressed ones), also recorded as the worker's last error.
void emit_kafka_logs(kafka::ClientEvents& client, const char* who);
// Milliseconds on PostgreSQL's clock (GetCurrentTimestamp() / 1000, PostgreSQL epoch).
int64 now_ms();

}  // namespace eventbox::worker
