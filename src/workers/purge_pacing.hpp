// When the supervisor's retention purge runs its next batch (docs/guide/retention.md, "How the
// inbox is purged"): 10 ms after a full batch, a second after a round ends, 10 s after a failed
// batch; and while the ingest or handler workers work, long enough after a full batch that the
// batches fill at most a tenth of the time, except after a minute of full batches under load (the
// purge must not fall behind a sustained inflow for long).
//
// Pure C++: times are milliseconds on any monotonic clock.
#pragma once

#include <cstdint>

namespace eventbox::worker {

class PurgePacing {
  public:
    static constexpr long kFullPauseMs = 10;
    static constexpr long kRoundPauseMs = 1000;
    static constexpr long kFailedPauseMs = 10000;
    static constexpr int kBusyShareDivisor = 10;  // a batch fills at most 1/10 of the time
    static constexpr int64_t kCatchUpMs = 60000;

    // After a batch that ran from started_ms to ended_ms: whether it succeeded, whether it was
    // full (a backlog remains), and the ingest and handler workers' message count read after
    // it (a count that moved since the previous batch means they worked). Returns the pause
    // before the next batch.
    long after_batch(int64_t started_ms, int64_t ended_ms, bool ok, bool full, uint64_t inflow);

  private:
    int64_t busy_since_ms_ = -1;  // start of the first full batch under load of this run of them
    uint64_t inflow_seen_ = 0;
    bool seen_ = false;
};

}  // namespace eventbox::worker
