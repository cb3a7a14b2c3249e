#include "workers/purge_pacing.hpp"

#include <algorithm>

namespace eventbox::worker {

long PurgePacing::after_batch(int64_t started_ms, int64_t ended_ms, bool ok, bool full,
                              uint64_t inflow) {
    bool busy = seen_ && inflow != inflow_seen_;
    inflow_seen_ = inflow;
    seen_ = true;
    if (!ok) {
        busy_since_ms_ = -1;
        return kFailedPauseMs;
    }
    if (!full) {
        busy_since_ms_ = -1;
        return kRoundPauseMs;
    }
    if (!busy) {
        busy_since_ms_ = -1;
        return kFullPauseMs;
    }
    if (busy_since_ms_ < 0) busy_since_ms_ = started_ms;
    if (ended_ms - busy_since_ms_ >= kCatchUpMs) return kFullPauseMs;
    int64_t took = std::max<int64_t>(ended_ms - started_ms, 0);
    return static_cast<long>(std::max<int64_t>(kFullPauseMs, took * (kBusyShareDivisor - 1)));
}

}  // namespace eventbox::worker
