// When the relay may route the rows of a pass by the destinations it loaded, and when it must
// look at them again. Pure C++ (the PostgreSQL side is outbox/http_relay.cpp and the pass).
//
// The rule: a row is routed by the destinations of a snapshot that shows every destination
// change the row's own snapshot shows; so a row committed after a change committed is always
// routed by it. Every change of the relay's destinations (HTTP destinations now; any kind the
// relay learns later announces itself the same way) moves a generation in shared memory twice:
// once before its commit becomes visible (`committing` counts it from then on) and once after
// (`committing` no longer counts it). Both are read as one stamp, the generation first.
//
// - The relay reads its destinations in a snapshot taken after it read a stamp. If that stamp
//   counted no change as committing, the snapshot shows every change the stamp's generation
//   counts: their second move happened before it was read, after their commit was visible.
// - A pass reads the generation after taking its snapshot: every change its snapshot shows had
//   moved the generation before. If it is still the loaded stamp's generation, and that stamp
//   counted nothing as committing, every change the pass's snapshot shows was visible to the
//   load: the loaded destinations are right for every row it reads.
// - Otherwise (a change moved the generation, or one was committing while the destinations were
//   loaded: its generation counted, its commit not yet visible) the pass reads the destinations
//   again in its own snapshot. When they are the loaded ones, they are right for its rows, and
//   the stamp read before that snapshot becomes the loaded stamp; when they differ, the relay
//   loads them anew before it routes anything.
#pragma once

#include <cstdint>

namespace eventbox::relay {

// The destinations' generation and how many changes were between its two moves, read together.
struct RouteStamp {
    uint64_t generation = 0;
    uint32_t committing = 0;
};

class RouteVersion {
  public:
    // The destinations were read in a snapshot taken after `stamp` was read.
    void loaded(RouteStamp stamp) noexcept { loaded_ = stamp; }
    // Whether the rows of a snapshot, after which `generation` was read, may be routed by the
    // loaded destinations without reading them again.
    bool current(uint64_t generation) const noexcept {
        return generation == loaded_.generation && loaded_.committing == 0;
    }
    // The destinations read in a snapshot taken after `before` was read were the loaded ones.
    void confirmed(RouteStamp before) noexcept { loaded_ = before; }
    // Whether a change moved the generation since the loaded stamp (a relay that delivers
    // nothing and only waits for destinations).
    bool moved(uint64_t generation) const noexcept { return generation != loaded_.generation; }

  private:
    RouteStamp loaded_;
};

}  // namespace eventbox::relay
