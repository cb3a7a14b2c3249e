// When the relay may route by the destinations it loaded (src/outbox/relay_routes.hpp).
#include "outbox/relay_routes.hpp"

#include <gtest/gtest.h>

#include <type_traits>
#include <utility>

namespace eventbox::relay {
namespace {

// The relay keeps it in a facade and calls it without a guard (outbox/relay_worker.hpp).
static_assert(std::is_trivially_destructible_v<RouteVersion>);
static_assert(noexcept(std::declval<const RouteVersion&>().current(0)));

// Shared memory as the changes move it: two moves each, `committing` between them.
struct Changes {
    RouteStamp now{1, 0};
    void before_commit() {
        ++now.committing;
        ++now.generation;
    }
    void after_commit() {
        ++now.generation;
        --now.committing;
    }
};

TEST(RouteVersion, LoadedWithNothingCommittingIsCurrentUntilTheGenerationMoves) {
    Changes c;
    RouteVersion v;
    v.loaded(c.now);
    EXPECT_TRUE(v.current(c.now.generation));
    EXPECT_FALSE(v.moved(c.now.generation));
    c.before_commit();  // a change on its way: its commit may be visible to the next pass
    EXPECT_FALSE(v.current(c.now.generation));
    EXPECT_TRUE(v.moved(c.now.generation));
}

TEST(RouteVersion, LoadedWhileAChangeCommitsIsNeverCurrent) {
    // Issue 27, item 9: the load read the generation the change had moved, and a snapshot that
    // did not show it yet. A pass after the change became visible, before its second move,
    // reads the same generation: that alone must not let it route by the load.
    Changes c;
    c.before_commit();
    RouteVersion v;
    v.loaded(c.now);
    EXPECT_FALSE(v.current(c.now.generation));
    EXPECT_FALSE(v.moved(c.now.generation));  // an idle relay waits for the second move
    c.after_commit();
    EXPECT_FALSE(v.current(c.now.generation));
    EXPECT_TRUE(v.moved(c.now.generation));
}

TEST(RouteVersion, ConfirmedInAPassSnapshotTakesTheStampReadBeforeIt) {
    Changes c;
    c.before_commit();
    RouteVersion v;
    v.loaded(c.now);
    // A pass found the same destinations in its snapshot while the change still commits: the
    // stamp read before that snapshot counts it as committing, so the next pass looks again.
    RouteStamp before = c.now;
    v.confirmed(before);
    EXPECT_FALSE(v.current(c.now.generation));
    c.after_commit();
    // Once no change commits, a pass that finds the loaded destinations makes them current.
    before = c.now;
    v.confirmed(before);
    EXPECT_TRUE(v.current(c.now.generation));
}

TEST(RouteVersion, AChangeBetweenTheStampAndTheSnapshotIsSeenByTheNextPass) {
    Changes c;
    RouteVersion v;
    v.loaded(c.now);
    c.before_commit();
    RouteStamp before = c.now;  // the pass's stamp counts it as committing
    c.after_commit();
    // Its snapshot did not show it yet (the destinations read were the loaded ones).
    v.confirmed(before);
    EXPECT_FALSE(v.current(c.now.generation));
}

}  // namespace
}  // namespace eventbox::relay
