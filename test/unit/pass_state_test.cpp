// A handler pass's working set (src/handlers/pass_state.cpp): the round-robin walk over lanes and
// the cursors it leaves, lanes and their messages, what is chosen and in which order, the claim
// bookkeeping, and what a failure holds back.
#include "handlers/pass_state.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace eventbox::handlers {
namespace {

constexpr int64_t kNow = 1'000'000;
constexpr int64_t kNoDue = std::numeric_limits<int64_t>::max();

// ---- handler_takes ---------------------------------------------------------------------------

TEST(HandlerTakes, EveryTypeHandlerTakesEveryMessage) {
    EXPECT_TRUE(handler_takes(nullptr, "OrderCreated"));
    EXPECT_TRUE(handler_takes(nullptr, nullptr));
}

TEST(HandlerTakes, TypedHandlerTakesItsTypeOnly) {
    EXPECT_TRUE(handler_takes("OrderCreated", "OrderCreated"));
    EXPECT_FALSE(handler_takes("OrderCreated", "OrderPaid"));
    EXPECT_FALSE(handler_takes("OrderCreated", "ordercreated"));
    EXPECT_FALSE(handler_takes("OrderCreated", nullptr));
}

// ---- LaneWalk --------------------------------------------------------------------------------

using LaneName = std::pair<std::string, int32_t>;

// What next_lane_plan / next_lane_upto_plan return over lanes with work (sorted by topic, then
// partition): the first lane after `after`, up to `upto` inclusive when it is given.
bool next_lane(const std::vector<LaneName>& lanes, const LaneWalk& walk, LaneName* found) {
    LaneName after{walk.after_topic, walk.after_partition};
    for (const LaneName& lane : lanes) {
        if (!(lane > after)) continue;
        if (walk.upto_topic() != nullptr &&
            lane > LaneName{walk.upto_topic(), walk.upto_partition()})
            return false;
        *found = lane;
        return true;
    }
    return false;
}

// The lanes a pass walks, in order, starting from `cursor` (topic nullptr: none), looking at no
// more than `limit`; *end gets where the walk stands at the end.
std::vector<LaneName> walk_lanes(const std::vector<LaneName>& lanes, const char* cursor_topic,
                                 int32_t cursor_partition, std::size_t limit = 1000,
                                 LaneWalk* end = nullptr) {
    std::vector<LaneName> seen;
    std::vector<std::string> topics;  // the walk points into these, as into palloc'd topics
    topics.reserve(limit + 1);
    LaneWalk walk = LaneWalk::from(cursor_topic, cursor_partition);
    while (seen.size() < limit) {
        LaneName found;
        if (!next_lane(lanes, walk, &found)) {
            if (!walk.wrap()) break;
            continue;
        }
        topics.push_back(found.first);
        walk.found(topics.back().c_str(), found.second);
        seen.push_back(found);
    }
    if (end != nullptr) *end = walk;
    return seen;
}

const std::vector<LaneName> kLanes = {{"a", 0}, {"a", 1}, {"a", 2}, {"b", 0}, {"c", 5}};

TEST(LaneWalk, WithoutCursorVisitsEveryLaneOnceInOrder) {
    LaneWalk end{};
    EXPECT_EQ(walk_lanes(kLanes, nullptr, 0, 1000, &end), kLanes);
    ASSERT_TRUE(end.on_lane());
    EXPECT_STREQ(end.after_topic, "c");
    EXPECT_EQ(end.after_partition, 5);
}

TEST(LaneWalk, StartsAfterTheCursorAndWrapsAroundToIt) {
    std::vector<LaneName> expected = {{"b", 0}, {"c", 5}, {"a", 0}, {"a", 1}, {"a", 2}};
    EXPECT_EQ(walk_lanes(kLanes, "a", 2, 1000), expected);
}

TEST(LaneWalk, CursorOnTheLastLaneStartsFromTheFirst) {
    EXPECT_EQ(walk_lanes(kLanes, "c", 5), kLanes);
}

TEST(LaneWalk, CursorOnALaneWithoutWorkAnyMore) {
    // ("a", 7) has no work now: the walk starts after it all the same and ends at it.
    std::vector<LaneName> expected = {{"b", 0}, {"c", 5}, {"a", 0}, {"a", 1}, {"a", 2}};
    EXPECT_EQ(walk_lanes(kLanes, "a", 7), expected);
    // After every lane, and before every lane.
    EXPECT_EQ(walk_lanes(kLanes, "z", 0), kLanes);
    EXPECT_EQ(walk_lanes(kLanes, "", 0), kLanes);
}

TEST(LaneWalk, PartitionsCompareAsNumbersWithinATopic) {
    std::vector<LaneName> lanes = {{"t", 2}, {"t", 10}, {"t", 100}};
    std::vector<LaneName> expected = {{"t", 100}, {"t", 2}, {"t", 10}};
    EXPECT_EQ(walk_lanes(lanes, "t", 10), expected);
}

TEST(LaneWalk, NoLaneWithWork) {
    LaneWalk end{};
    EXPECT_TRUE(walk_lanes({}, nullptr, 0, 1000, &end).empty());
    EXPECT_FALSE(end.on_lane());  // no cursor to set
    EXPECT_TRUE(walk_lanes({}, "a", 1, 1000, &end).empty());
    EXPECT_FALSE(end.on_lane());  // the cursor is left as it was
}

TEST(LaneWalk, StopsWhereThePassStops) {
    LaneWalk end{};
    std::vector<LaneName> expected = {{"a", 2}, {"b", 0}};
    EXPECT_EQ(walk_lanes(kLanes, "a", 1, 2, &end), expected);
    EXPECT_STREQ(end.after_topic, "b");
    EXPECT_EQ(end.after_partition, 0);
}

TEST(LaneWalk, FromWithoutCursorIgnoresItsPartition) {
    LaneWalk w = LaneWalk::from(nullptr, 42);
    EXPECT_TRUE(w.wrapped);
    EXPECT_EQ(w.upto_topic(), nullptr);
    EXPECT_STREQ(w.after_topic, "");
    EXPECT_EQ(w.after_partition, -1);
    EXPECT_EQ(w.upto_partition(), 0);
    EXPECT_FALSE(w.on_lane());
    EXPECT_FALSE(w.wrap());
}

// Passes that each take one lane's messages serve the lanes in turn, per subscription, through
// the cursor the state keeps.
TEST(LaneWalk, SuccessivePassesServeLanesInTurn) {
    PassState state(1);
    std::vector<LaneName> served;
    for (int pass = 0; pass < 7; ++pass) {
        state.begin_pass();
        const char* topic = nullptr;
        int32_t partition = 0;
        bool has = state.find_cursor("billing", &topic, &partition);
        std::string cursor = has ? topic : "";
        LaneWalk end{};
        std::vector<LaneName> seen =
            walk_lanes(kLanes, has ? cursor.c_str() : nullptr, partition, 1, &end);
        ASSERT_EQ(seen.size(), 1u);
        served.push_back(seen[0]);
        ASSERT_TRUE(end.on_lane());
        state.set_cursor("billing", seen[0].first, seen[0].second);
    }
    std::vector<LaneName> expected = {{"a", 0}, {"a", 1}, {"a", 2}, {"b", 0},
                                      {"c", 5}, {"a", 0}, {"a", 1}};
    EXPECT_EQ(served, expected);
    const char* topic = nullptr;
    int32_t partition = -1;
    EXPECT_FALSE(state.find_cursor("shipping", &topic, &partition));
}

// ---- cursors ---------------------------------------------------------------------------------

TEST(PassStateCursor, OnePerSubscriptionAndKeptAcrossPasses) {
    PassState state(1);
    const char* topic = nullptr;
    int32_t partition = -1;
    EXPECT_FALSE(state.find_cursor("billing", &topic, &partition));
    EXPECT_EQ(topic, nullptr);

    state.set_cursor("billing", "orders", 3);
    state.set_cursor("shipping", "parcels", 0);
    state.begin_pass();
    ASSERT_TRUE(state.find_cursor("billing", &topic, &partition));
    EXPECT_STREQ(topic, "orders");
    EXPECT_EQ(partition, 3);
    ASSERT_TRUE(state.find_cursor("shipping", &topic, &partition));
    EXPECT_STREQ(topic, "parcels");
    EXPECT_EQ(partition, 0);

    state.set_cursor("billing", "payments", 11);
    ASSERT_TRUE(state.find_cursor("billing", &topic, &partition));
    EXPECT_STREQ(topic, "payments");
    EXPECT_EQ(partition, 11);
    EXPECT_FALSE(state.find_cursor("bill", &topic, &partition));
}

// ---- lanes and messages ----------------------------------------------------------------------

MessageRow row(const char* id, const char* key = nullptr, const char* type = "T",
               int32_t attempts = 0, uint64_t tid = 0) {
    return MessageRow{id, key, key ? std::char_traits<char>::length(key) : 0, type, attempts, false,
                      0,  tid};
}
// Failed before, due again since `next_attempt_ms`.
MessageRow retried(const char* id, int32_t attempts, int64_t next_attempt_ms, uint64_t tid = 0,
                   const char* type = "T") {
    MessageRow r = row(id, nullptr, type, attempts, tid);
    r.has_next_attempt = true;
    r.next_attempt_ms = next_attempt_ms;
    return r;
}
MessageRow waiting_row(const char* id, int64_t next_attempt_ms, const char* key = nullptr) {
    MessageRow r = row(id, key, "T", 1);
    r.has_next_attempt = true;
    r.next_attempt_ms = next_attempt_ms;
    return r;
}

const char* const kTypeT[] = {"T"};
const char* const kEveryType[] = {nullptr};

// Adds a lane of `rows`, sealed and marked for a handler of type "T".
std::size_t lane_of(PassState& state, const char* topic, int32_t partition,
                    const std::vector<MessageRow>& rows) {
    std::size_t l = state.add_lane(topic, partition);
    for (const MessageRow& r : rows) state.add_message(l, r);
    state.seal_lane(l);
    state.mark_handled(l, kTypeT, 1);
    return l;
}

// Plans lane l with room up to `max` and chooses all its picks; returns the suspect.
long choose_all(PassState& state, std::size_t l, Ordering ordering, std::size_t max = 1000,
                int64_t* next_due = nullptr) {
    int64_t due = kNoDue;
    long suspect = state.plan(l, ordering, false, kNow, max, next_due ? next_due : &due);
    state.choose_picks(l);
    return suspect;
}

std::vector<std::string> chosen_ids(const PassState& state) {
    std::vector<std::string> ids;
    for (std::size_t c = 0; c < state.chosen_count(); ++c) ids.emplace_back(state.chosen(c).id);
    return ids;
}

TEST(PassStateLanes, NumberedInTheOrderAdded) {
    PassState state(1);
    EXPECT_EQ(state.add_lane("orders", 2), 0u);
    EXPECT_EQ(state.add_lane("orders", 0), 1u);
    EXPECT_EQ(state.lane_count(), 2u);
    EXPECT_STREQ(state.lane_id(0).topic, "orders");
    EXPECT_EQ(state.lane_id(0).partition, 2);
    EXPECT_EQ(state.lane_id(1).partition, 0);
}

TEST(PassStateLanes, LaneNamesStayPutWhileLanesAreAdded) {
    PassState state(1);
    state.add_lane("a-topic-name-longer-than-small-string-storage", 0);
    const char* first = state.lane_id(0).topic;
    for (int i = 1; i < 500; ++i) state.add_lane("t", i);
    EXPECT_EQ(state.lane_id(0).topic, first);
    EXPECT_STREQ(first, "a-topic-name-longer-than-small-string-storage");
}

TEST(PassStateLanes, ChosenMessageCarriesWhatRunningNeeds) {
    PassState state(1);
    lane_of(state, "orders", 0,
            {row("m1", "k", "T", 0, (7u << 16) | 3), retried("m2", 4, kNow, (9u << 16) | 1)});
    std::size_t l = state.add_lane("orders", 1);
    state.add_message(l, retried("m3", 2, kNow - 5, 5, nullptr));
    state.seal_lane(l);
    state.mark_handled(l, kEveryType, 1);
    choose_all(state, 0, Ordering::kPartition);
    choose_all(state, 1, Ordering::kPartition);

    ASSERT_EQ(state.chosen_count(), 3u);
    ChosenMessage m = state.chosen(0);
    EXPECT_EQ(m.lane, 0u);
    EXPECT_STREQ(m.id, "m1");
    EXPECT_STREQ(m.event_type, "T");
    EXPECT_EQ(m.attempts, 0);
    EXPECT_EQ(m.tid, (7u << 16) | 3);
    EXPECT_TRUE(m.handled);
    EXPECT_EQ(m.index, 0u);  // in its lane's read order
    m = state.chosen(1);
    EXPECT_STREQ(m.id, "m2");
    EXPECT_EQ(m.index, 1u);
    EXPECT_EQ(m.attempts, 4);
    EXPECT_EQ(m.tid, (9u << 16) | 1);
    m = state.chosen(2);
    EXPECT_EQ(m.lane, 1u);
    EXPECT_EQ(state.lane_of_chosen(2), 1u);
    EXPECT_STREQ(m.id, "m3");
    EXPECT_EQ(m.index, 0u);
    EXPECT_EQ(m.event_type, nullptr);  // none, not ""
    EXPECT_TRUE(state.chosen_has_id(2, "m3"));
    EXPECT_FALSE(state.chosen_has_id(2, "m2"));
    EXPECT_FALSE(state.chosen_has_id(2, "m"));
}

TEST(PassStateLanes, MarkHandledFollowsTheHandlersTypes) {
    PassState state(1);
    int64_t due = kNoDue;

    auto handled = [&](const char* const* types, std::size_t n) {
        state.begin_pass();
        std::size_t lane = state.add_lane("t", 0);
        state.add_message(lane, row("typed-a", nullptr, "A"));
        state.add_message(lane, row("typed-b", nullptr, "B"));
        state.add_message(lane, row("untyped", nullptr, nullptr));
        state.add_message(lane, row("empty", nullptr, ""));
        state.seal_lane(lane);
        state.mark_handled(lane, types, n);
        state.plan(lane, Ordering::kNone, false, kNow, 1000, &due);
        state.choose_picks(lane);
        std::vector<bool> h;
        for (std::size_t c = 0; c < state.chosen_count(); ++c) h.push_back(state.chosen(c).handled);
        return h;
    };
    const char* const a[] = {"A"};
    const char* const a_and_empty[] = {"A", ""};
    const char* const a_and_every[] = {"A", nullptr};
    EXPECT_EQ(handled(a, 1), (std::vector<bool>{true, false, false, false}));
    // A handler of type "" takes messages of type "", not messages without a type.
    EXPECT_EQ(handled(a_and_empty, 2), (std::vector<bool>{true, false, false, true}));
    EXPECT_EQ(handled(a_and_every, 2), (std::vector<bool>{true, true, true, true}));
    EXPECT_EQ(handled(nullptr, 0), (std::vector<bool>{false, false, false, false}));
}

TEST(PassStateLanes, UnhandledKeptMessagesAreNotChosen) {
    PassState state(1);
    std::size_t l = state.add_lane("t", 0);
    state.add_message(l, row("a", nullptr, "A"));
    state.add_message(l, row("b", nullptr, "B"));
    state.seal_lane(l);
    const char* const a[] = {"A"};
    state.mark_handled(l, a, 1);
    int64_t due = kNoDue;
    EXPECT_EQ(state.plan(l, Ordering::kPartition, true, kNow, 1000, &due), -1);
    state.choose_picks(l);
    EXPECT_EQ(chosen_ids(state), (std::vector<std::string>{"a"}));
}

// ---- choosing --------------------------------------------------------------------------------

TEST(PassStateChoose, ChosenInLaneOrderThenOffsetOrder) {
    PassState state(1);
    lane_of(state, "b", 0, {row("b1"), row("b2")});
    lane_of(state, "a", 0, {row("a1"), row("a2"), row("a3")});
    choose_all(state, 0, Ordering::kPartition);
    choose_all(state, 1, Ordering::kPartition);
    EXPECT_EQ(chosen_ids(state), (std::vector<std::string>{"b1", "b2", "a1", "a2", "a3"}));
}

TEST(PassStateChoose, RoomIsWhatMaxLeavesAfterEarlierLanes) {
    PassState state(1);
    lane_of(state, "t", 0, {row("x1"), row("x2"), row("x3")});
    lane_of(state, "t", 1, {row("y1"), row("y2"), row("y3")});
    choose_all(state, 0, Ordering::kPartition, 4);
    choose_all(state, 1, Ordering::kPartition, 4);
    EXPECT_EQ(chosen_ids(state), (std::vector<std::string>{"x1", "x2", "x3", "y1"}));
}

TEST(PassStateChoose, PicksAreChosenOnlyWhenAsked) {
    PassState state(1);
    std::size_t l = lane_of(state, "t", 0, {row("a"), row("b")});
    int64_t due = kNoDue;
    EXPECT_EQ(state.plan(l, Ordering::kPartition, false, kNow, 10, &due), -1);
    EXPECT_EQ(state.chosen_count(), 0u);
    EXPECT_FALSE(state.lane_has_chosen(l));
    // Planning another lane replaces the picks.
    std::size_t m = lane_of(state, "t", 1, {row("c")});
    state.plan(m, Ordering::kPartition, false, kNow, 10, &due);
    state.choose_picks(m);
    EXPECT_EQ(chosen_ids(state), (std::vector<std::string>{"c"}));
}

TEST(PassStateChoose, SuspectIsReportedAndPicksBeforeItCanBeChosen) {
    PassState state(1);
    // Attempted, not waiting for a retry: that attempt never finished.
    std::size_t l =
        lane_of(state, "t", 0, {row("a"), row("b"), row("crashed", nullptr, "T", 2), row("c")});
    int64_t due = kNoDue;
    long suspect = state.plan(l, Ordering::kNone, false, kNow, 10, &due);
    ASSERT_EQ(suspect, 2);
    state.choose_picks(l, static_cast<std::size_t>(suspect));
    EXPECT_EQ(chosen_ids(state), (std::vector<std::string>{"a", "b"}));
}

TEST(PassStateChoose, SuspectAlone) {
    PassState state(1);
    std::size_t l = lane_of(state, "t", 0, {row("crashed", nullptr, "T", 1), row("b")});
    int64_t due = kNoDue;
    long suspect = state.plan(l, Ordering::kPartition, false, kNow, 10, &due);
    ASSERT_EQ(suspect, 0);
    state.choose_alone(l, static_cast<std::size_t>(suspect));
    EXPECT_EQ(chosen_ids(state), (std::vector<std::string>{"crashed"}));
}

TEST(PassStateChoose, WaitingRetryIsNoSuspect) {
    PassState state(1);
    std::size_t l = lane_of(state, "t", 0, {waiting_row("w", kNow - 1), row("b")});
    int64_t due = kNoDue;
    EXPECT_EQ(state.plan(l, Ordering::kPartition, false, kNow, 10, &due), -1);
    state.choose_picks(l);
    EXPECT_EQ(chosen_ids(state), (std::vector<std::string>{"w", "b"}));  // due again
}

TEST(PassStateChoose, NextDueIsTheEarliestRetryStillWaiting) {
    PassState state(1);
    std::size_t l =
        lane_of(state, "t", 0,
                {waiting_row("w1", kNow + 500, "k1"), waiting_row("w2", kNow + 200, "k2"),
                 waiting_row("due", kNow, "k3"), row("fresh", "k4")});
    int64_t due = kNoDue;
    state.plan(l, Ordering::kKey, false, kNow, 10, &due);
    EXPECT_EQ(due, kNow + 200);
    // Never raised; lowered by a later lane.
    due = kNow + 100;
    state.plan(l, Ordering::kKey, false, kNow, 10, &due);
    EXPECT_EQ(due, kNow + 100);
    std::size_t m = lane_of(state, "t", 1, {waiting_row("w3", kNow + 50)});
    state.plan(m, Ordering::kPartition, false, kNow, 10, &due);
    EXPECT_EQ(due, kNow + 50);
}

TEST(PassStateChoose, NothingDueLeavesNextDueAlone) {
    PassState state(1);
    std::size_t l = lane_of(state, "t", 0, {row("a"), waiting_row("past", kNow - 10)});
    int64_t due = kNoDue;
    state.plan(l, Ordering::kNone, false, kNow, 10, &due);
    EXPECT_EQ(due, kNoDue);
}

// Keys point into the lane's own strings: short keys (kept inside std::string) must still
// compare right after the lane grew past several reallocations.
TEST(PassStateChoose, KeysSurviveTheLaneGrowing) {
    PassState state(1);
    std::size_t l = state.add_lane("t", 0);
    std::vector<std::string> ids, keys;
    for (int i = 0; i < 300; ++i) {
        ids.push_back("m" + std::to_string(i));
        keys.push_back("k" + std::to_string(i % 3));
    }
    state.add_message(l, waiting_row("w", kNow + 1, "k1"));
    for (int i = 0; i < 300; ++i) state.add_message(l, row(ids[i].c_str(), keys[i].c_str()));
    state.seal_lane(l);
    state.mark_handled(l, kTypeT, 1);
    choose_all(state, l, Ordering::kKey);
    // Key "k1" waits for its retry: every message of key k1 stays behind it.
    ASSERT_EQ(state.chosen_count(), 200u);
    for (std::size_t c = 0; c < state.chosen_count(); ++c) {
        std::string id = state.chosen(c).id;
        int i = std::stoi(id.substr(1));
        EXPECT_NE(i % 3, 1) << id;
    }
}

// ---- claims bookkeeping ----------------------------------------------------------------------

TEST(PassStateClaims, LockedUsedAndSettledLanes) {
    PassState state(1);
    std::size_t unlocked = lane_of(state, "t", 0, {row("u")});
    std::size_t chosen = lane_of(state, "t", 1, {row("c")});
    std::size_t settled = lane_of(state, "t", 2, {});
    std::size_t idle = lane_of(state, "t", 3, {waiting_row("w", kNow + 10)});
    state.set_locked(chosen);
    state.set_locked(settled);
    state.set_locked(idle);
    state.set_had_claim(settled);
    choose_all(state, chosen, Ordering::kPartition);
    choose_all(state, idle, Ordering::kPartition);

    EXPECT_FALSE(state.is_locked(unlocked));
    EXPECT_TRUE(state.is_locked(chosen));
    EXPECT_TRUE(state.lane_has_chosen(chosen));
    EXPECT_TRUE(state.lane_in_use(chosen));
    EXPECT_FALSE(state.had_claim(chosen));

    EXPECT_TRUE(state.had_claim(settled));
    EXPECT_FALSE(state.lane_has_chosen(settled));
    EXPECT_TRUE(state.lane_in_use(settled));  // locked until the settlement commits

    EXPECT_FALSE(state.lane_has_chosen(idle));
    EXPECT_FALSE(state.lane_in_use(idle));  // its lock can go
    EXPECT_EQ(state.lane_size(idle), 1u);
}

TEST(PassStateClaims, BeginPassForgetsLanesChoicesAndFailures) {
    PassState state(1);
    std::size_t l = lane_of(state, "t", 0, {row("a"), row("b")});
    state.set_locked(l);
    state.set_had_claim(l);
    choose_all(state, l, Ordering::kPartition);
    state.mark_failed(0);
    state.set_cursor("s", "t", 0);

    state.begin_pass();
    EXPECT_EQ(state.lane_count(), 0u);
    EXPECT_EQ(state.chosen_count(), 0u);
    EXPECT_EQ(state.failed_count(), 0u);
    std::size_t again = state.add_lane("t", 0);
    EXPECT_EQ(again, 0u);
    EXPECT_FALSE(state.is_locked(again));
    EXPECT_FALSE(state.had_claim(again));
    EXPECT_EQ(state.lane_size(again), 0u);
    const char* topic;
    int32_t partition;
    EXPECT_TRUE(state.find_cursor("s", &topic, &partition));
}

// ---- held back -------------------------------------------------------------------------------

// Two lanes chosen whole: lane 0 = {a1(k1), a2(k2), a3(k1), a4(no key)}, lane 1 = {b1(k1)}.
void two_lanes(PassState& state) {
    lane_of(state, "t", 0, {row("a1", "k1"), row("a2", "k2"), row("a3", "k1"), row("a4")});
    lane_of(state, "t", 1, {row("b1", "k1")});
    choose_all(state, 0, Ordering::kNone);
    choose_all(state, 1, Ordering::kNone);
}

TEST(PassStateHeldBack, NothingFailedHoldsNothingBack) {
    PassState state(1);
    two_lanes(state);
    for (std::size_t c = 0; c < state.chosen_count(); ++c)
        EXPECT_FALSE(state.is_held_back(c, Ordering::kPartition));
}

TEST(PassStateHeldBack, PartitionHoldsBackTheRestOfItsLaneOnly) {
    PassState state(1);
    two_lanes(state);
    state.mark_failed(0);
    EXPECT_TRUE(state.is_held_back(1, Ordering::kPartition));
    EXPECT_TRUE(state.is_held_back(2, Ordering::kPartition));
    EXPECT_TRUE(state.is_held_back(3, Ordering::kPartition));
    EXPECT_FALSE(state.is_held_back(4, Ordering::kPartition));  // other lane
    EXPECT_EQ(state.failed_count(), 1u);
}

TEST(PassStateHeldBack, KeyHoldsBackTheSameKeyInTheSameLane) {
    PassState state(1);
    two_lanes(state);
    state.mark_failed(0);                                 // a1, key k1
    EXPECT_FALSE(state.is_held_back(1, Ordering::kKey));  // a2, k2
    EXPECT_TRUE(state.is_held_back(2, Ordering::kKey));   // a3, k1
    EXPECT_FALSE(state.is_held_back(3, Ordering::kKey));  // a4, no key
    EXPECT_FALSE(state.is_held_back(4, Ordering::kKey));  // b1, k1 in another lane
    state.mark_failed(3);                                 // no key holds back no key only
    EXPECT_FALSE(state.is_held_back(1, Ordering::kKey));
}

TEST(PassStateHeldBack, NoneHoldsNothingBack) {
    PassState state(1);
    two_lanes(state);
    state.mark_failed(0);
    state.mark_failed(1);
    for (std::size_t c = 2; c < state.chosen_count(); ++c)
        EXPECT_FALSE(state.is_held_back(c, Ordering::kNone));
}

// ---- jitter ----------------------------------------------------------------------------------

TEST(PassStateJitter, UniformInUnitIntervalAndSeeded) {
    PassState a(42), b(42), c(43);
    double sum = 0;
    bool differs = false;
    for (int i = 0; i < 10000; ++i) {
        double x = a.next_jitter();
        ASSERT_GE(x, 0.0);
        ASSERT_LT(x, 1.0);
        EXPECT_EQ(x, b.next_jitter());
        differs = differs || x != c.next_jitter();
        sum += x;
    }
    EXPECT_TRUE(differs);
    EXPECT_NEAR(sum / 10000, 0.5, 0.02);
}

// ---- the boundary ----------------------------------------------------------------------------

// The PostgreSQL side calls these without a guard (PassWork in handlers/pass_internal.hpp): they
// must not throw. The operations that allocate are not noexcept and go through the guard.
static_assert(noexcept(std::declval<const PassState&>().lane_count()));
static_assert(noexcept(std::declval<const PassState&>().lane_id(0)));
static_assert(noexcept(std::declval<const PassState&>().chosen(0)));
static_assert(noexcept(std::declval<const PassState&>().is_held_back(0, Ordering::kKey)));
static_assert(noexcept(std::declval<const PassState&>().find_cursor("s", nullptr, nullptr)));
static_assert(noexcept(std::declval<PassState&>().begin_pass()));
static_assert(noexcept(std::declval<PassState&>().seal_lane(0)));
static_assert(noexcept(std::declval<PassState&>().next_jitter()));
static_assert(!noexcept(std::declval<PassState&>().add_lane("t", 0)));
static_assert(!noexcept(std::declval<PassState&>().choose_picks(0)));

}  // namespace
}  // namespace eventbox::handlers
