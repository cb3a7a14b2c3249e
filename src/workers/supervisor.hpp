// What the supervisor (workers/launcher.cpp) runs besides keeping the workers running: inbox
// retention (workers/retention.cpp) and the metrics endpoint (metrics/endpoint.cpp), each a
// step of its loop that returns how soon it wants to run again.
#pragma once

extern "C" {
#include "postgres.h"
}

#include "workers/common.hpp"

namespace eventbox::supervisor {

// Runs fn(arg) in a transaction of its own (worker::try_begin_work()). An ERROR is logged (at
// most once a minute per `rate`), the transaction aborted and false returned: the supervisor
// keeps supervising. Also false when the extension was dropped or re-created while it waited
// for the schema lock (the supervisor's check of the extension sees it).
bool run_in_transaction(void (*fn)(void*), void* arg, const char* what, worker::LogRate* rate);

// One inbox purge batch when one is due; returns milliseconds until the next.
long retention_step();

}  // namespace eventbox::supervisor
