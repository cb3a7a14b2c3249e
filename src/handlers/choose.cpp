// Choosing a pass's messages: a walk over the subscription's lanes from its round-robin cursor
// that locks each lane with work, settles a crashed pass's claim there, reads and plans the lane
// (handlers/plan.hpp), until the pass has its messages. A worker walks the lanes it knows, from
// their low-water marks (marks.cpp); eventbox.process() and a worker's occasional discovery walk
// use the plain probe (lanes.cpp). PostgreSQL side (see handlers/pass_internal.hpp).
extern "C" {
#include "postgres.h"

#include "utils/memutils.h"
}

#include "handlers/pass_internal.hpp"

namespace eventbox::handlers {

namespace {

// Lanes a worker's pass found no work in among the lanes it knows are looked for with the plain
// probe at most this often (and after each reload of the lanes): rows in a lane without an
// eventbox.offsets row (written by direct DML) are found this way, at the plain probe's cost
// (it walks the index entries of messages handled before). Once such a walk took messages the
// known lanes did not have, each pass walks so again until one takes none (LaneMarks::
// unknown_work()): those lanes are served at the pace of the others, not one pass a second.
constexpr int64 kDiscoveryIntervalMs = 1000;
struct Discovery {
    int64 last_ms = 0;  // when a worker's pass last walked with the plain probe
};
Discovery discovery;

// Chooses messages of lane l (read, its messages' handlers marked) while fewer than p.max are
// chosen. Returns false when the pass looks at no further lane.
bool choose_in_lane(Pass& p, std::size_t l) {
    long suspect = p.work.plan(l, p.setup.options.ordering, p.setup.options.unhandled_keep, p.now,
                               static_cast<std::size_t>(p.max), p.next_due_ms);
    if (suspect < 0) {
        p.work.choose_picks(l);
        return true;
    }
    // A message whose last attempt never finished runs alone, in a pass of its own.
    bool first = p.work.chosen_count() == 0;
    if (first && try_lock_suspects(p.own_transactions)) {
        p.work.choose_alone(l, static_cast<std::size_t>(suspect));
        return false;
    }
    p.work.choose_picks(l, static_cast<std::size_t>(suspect));
    // Not first: a later pass takes it. First but another pass runs a suspect: the lane
    // waits behind it, the other lanes go on.
    return first;
}

// Takes lane (topic, partition) into the pass unless another pass holds it: its lock, a crashed
// pass's claim settled, its messages read and chosen. Returns false when the pass looks at no
// further lane.
bool take_lane(Pass& p, const char* topic, int32 partition, int* crash_dead) {
    std::size_t l = p.work.add_lane(topic, partition);
    if (!try_lock_lane(p.subscription, topic, partition, p.own_transactions)) return true;
    p.work.set_locked(l);
    name_lane(p, p.work.lane_id(l).topic, partition);
    *crash_dead += settle_claim(p, l);
    // Only as many rows as the pass still takes: the rest of the lane waits for the next pass,
    // which reads it again anyway (a pass of 1,024 messages that took 1,000 from one lane read
    // up to 1,024 more from the next to take 24).
    read_lane(p, l, p.max - static_cast<int>(p.work.chosen_count()));
    MemoryContextSwitchTo(p.memory);
    p.work.mark_handled(l, p.setup.handler_types, static_cast<std::size_t>(p.setup.n_handlers));
    bool go_on = choose_in_lane(p, l);
    name_lane(p, nullptr, -1);
    return go_on;
}

// The next lane of the walk with work (taken or not): among the lanes a worker knows (`known`),
// or by the plain probe.
bool next_in_walk(const Pass& p, bool known, const LaneWalk& walk, char** topic, int32* partition) {
    if (known)
        return next_known_lane(p.setup.name, p.subscription, walk.after_topic, walk.after_partition,
                               walk.upto_topic(), walk.upto_partition(), p.setup.options.replays,
                               topic, partition);
    return next_lane(p.setup.name, walk.after_topic, walk.after_partition, walk.upto_topic(),
                     walk.upto_partition(), topic, partition);
}

// A worker's plain walk looks for lanes it does not know: the known walk serves the others (and
// took its lanes already). A known lane the known walk found empty may have been given rows since
// by an ingest batch that committed in between; taking them here would count as work in unknown
// lanes and turn the plain walk on at every pass, which walks the handled entries of every lane
// and leaves the marks behind.
bool left_to_known_walk(const Pass& p, bool known, const char* topic, int32 partition) {
    return !known && p.own_transactions &&
           (p.work.has_lane(topic, partition) || known_lane(p.subscription, topic, partition) >= 0);
}

// One walk of choose_messages() over the lanes, known ones (a worker) or found by the plain
// probe. Returns whether it found a lane with work (taken or not).
bool walk_lanes(Pass& p, bool known, LaneWalk walk, int* crash_dead) {
    bool found_any = false;
    while (p.setup.found) {
        if (p.work.chosen_count() >= static_cast<std::size_t>(p.max)) break;
        char* topic;
        int32 partition;
        if (!next_in_walk(p, known, walk, &topic, &partition)) {
            if (!walk.wrap()) break;
            continue;
        }
        found_any = true;
        walk.found(topic, partition);
        if (left_to_known_walk(p, known, topic, partition)) continue;
        if (!take_lane(p, topic, partition, crash_dead)) break;
    }
    // The cursor names a lane a worker knows (a plain walk's lane may not be one).
    if (walk.on_lane() && (known || !p.own_transactions))
        p.work.set_cursor(p.subscription, walk.after_topic, walk.after_partition);
    return found_any;
}

// Where the first walk starts: after the lane the subscription's cursor names; a worker's, only
// when the cursor names a lane it knows (it walks those from the cursor's place among them).
LaneWalk first_walk(const Pass& p) {
    const char* cursor_topic = nullptr;
    int32 cursor_partition = 0;
    bool has_cursor = p.work.find_cursor(p.subscription, &cursor_topic, &cursor_partition);
    if (p.own_transactions && has_cursor &&
        known_lane(p.subscription, cursor_topic, cursor_partition) < 0)
        has_cursor = false;
    return LaneWalk::from(has_cursor ? pstrdup(cursor_topic) : nullptr, cursor_partition);
}

// A worker's marks and known lanes, at the pass's start. eventbox.process() runs in its
// caller's transaction, which may have requeued rows itself: only workers keep marks. Returns
// whether the worker's lanes of the subscription were loaded again.
bool begin_known_lanes(Pass& p) {
    if (!p.own_transactions) {
        marks_off();
        return false;
    }
    begin_marks(p.now);
    bool reloaded = !lanes_loaded(p.subscription);
    if (p.setup.found) read_lanes(p.setup.name, p.subscription);
    MemoryContextSwitchTo(p.memory);
    return reloaded;
}

}  // namespace

// From the lane after the one this worker served last in the subscription (a round robin),
// wrapping around at most once.
int choose_messages(Pass& p, bool* found_work) {
    p.work.begin_pass();
    forget_lane_reads();
    bool reloaded = begin_known_lanes(p);
    int crash_dead = 0;  // messages whose last attempt a crash cut short
    bool found = walk_lanes(p, p.own_transactions, first_walk(p), &crash_dead);
    bool unknown = p.own_transactions && unknown_work(p.subscription);
    std::size_t chosen = p.work.chosen_count();
    if (p.own_transactions && (!found || reloaded || unknown) &&
        (unknown || p.now - discovery.last_ms >= kDiscoveryIntervalMs) &&
        chosen < static_cast<std::size_t>(p.max)) {
        discovery.last_ms = p.now;
        walk_lanes(p, false, LaneWalk::from(nullptr, 0), &crash_dead);
        // It skips the lanes the known walk took: what it chose waits in lanes no worker knows.
        bool took = p.work.chosen_count() > chosen;
        set_unknown_work(p.subscription, took);
        found = found || took;
    }
    *found_work = found || chosen > 0 || crash_dead > 0;
    return crash_dead;
}

}  // namespace eventbox::handlers
