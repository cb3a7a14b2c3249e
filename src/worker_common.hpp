// Pieces every eventbox background worker shares: signal set-up, the per-worker settings that keep
// hot queries fast (no JIT, kept generic plans) and the latch wait.
#pragma once

extern "C" {
#include "postgres.h"
}

namespace eventbox::worker {

// Installs SIGTERM/SIGHUP handlers and unblocks signals.
void setup_signals();
// Applies the session settings workers run with.
void apply_worker_settings(bool async_commit);
// Reloads the configuration if SIGHUP arrived; returns true when it did.
bool reload_if_requested();

}  // namespace eventbox::worker
