// The working set of a handler pass (src/handlers/pass_internal.hpp): the lanes it read, the
// messages it chose from them, the failures that hold later messages back, and each
// subscription's round-robin cursor, which outlives the pass. Pure C++. What cannot allocate is
// noexcept, and the PostgreSQL side calls it directly; it calls the rest through its facade
// (PassWork in handlers/pass_internal.hpp), which guards them. It gets plain values back (the
// types below that it keeps on its own frames are trivially destructible).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "handlers/plan.hpp"

namespace eventbox::handlers {

// Whether a handler registered for `handler_type` (nullptr: every type) takes a message of
// `event_type` (nullptr: the message has none).
inline bool handler_takes(const char* handler_type, const char* event_type) noexcept {
    return handler_type == nullptr ||
           (event_type != nullptr && std::strcmp(handler_type, event_type) == 0);
}

// Where a pass looks for its next lane (in (topic, partition) order): after the lane its
// subscription's cursor names, to the last lane, then from the first lane up to the cursor's
// lane inclusive; without a cursor, once from the first lane. It points to strings the caller
// owns.
struct LaneWalk {
    const char* start_topic;  // the cursor; nullptr: none
    int32_t start_partition;
    const char* after_topic;  // the next lane comes after this one
    int32_t after_partition;  // -1 with topic "": before every lane
    bool wrapped;             // the walk looks up to the cursor's lane only

    static LaneWalk from(const char* cursor_topic, int32_t cursor_partition) noexcept {
        return LaneWalk{cursor_topic, cursor_topic ? cursor_partition : 0,
                        cursor_topic ? cursor_topic : "", cursor_topic ? cursor_partition : -1,
                        cursor_topic == nullptr};
    }
    // The last lane to look at, inclusive (nullptr: up to the last lane).
    const char* upto_topic() const noexcept { return wrapped ? start_topic : nullptr; }
    int32_t upto_partition() const noexcept { return start_partition; }
    // The lane found next; the walk goes on after it.
    void found(const char* topic, int32_t partition) noexcept {
        after_topic = topic;
        after_partition = partition;
    }
    // No lane found: false when the walk is over, else it starts again from the first lane.
    bool wrap() noexcept {
        if (wrapped) return false;
        wrapped = true;
        after_topic = "";
        after_partition = -1;
        return true;
    }
    // Whether the walk stands on a lane, which becomes the subscription's cursor.
    bool on_lane() const noexcept { return after_partition >= 0; }
};

// One message of a lane, as a lane read returns it (the strings are copied).
struct MessageRow {
    const char* id;
    const char* key;  // nullptr: no key
    std::size_t key_len;
    const char* event_type;  // nullptr: none
    int32_t attempts;
    bool has_next_attempt;    // next_attempt_at is set
    int64_t next_attempt_ms;  // next_attempt_at, when set
    uint64_t tid;             // ctid: block << 16 | offset
};

// A lane's name; the topic belongs to the pass state and stays valid until the next
// begin_pass().
struct LaneId {
    const char* topic;
    int32_t partition;
};

// A chosen message, as running it needs it. The strings belong to the pass state and stay
// valid until the next begin_pass().
struct ChosenMessage {
    std::size_t lane;
    const char* id;
    const char* event_type;  // nullptr: none
    int32_t attempts;        // before this pass's attempt
    uint64_t tid;
    bool handled;       // some handler takes it
    std::size_t index;  // in its lane, in the order the lane read returned the messages
};

static_assert(std::is_trivially_destructible_v<LaneWalk> &&
                  std::is_trivially_destructible_v<LaneId> &&
                  std::is_trivially_destructible_v<MessageRow> &&
                  std::is_trivially_destructible_v<ChosenMessage>,
              "kept on PostgreSQL frames");

class PassState {
  public:
    PassState() : rng_(std::random_device{}()) {}
    explicit PassState(uint64_t seed) : rng_(seed) {}
    // Candidates' keys point into the state's own strings.
    PassState(const PassState&) = delete;
    PassState& operator=(const PassState&) = delete;

    // Forgets the previous pass's lanes, choices and failures; cursors stay.
    void begin_pass() noexcept;

    // ---- round robin, by subscription
    // The lane `subscription` was served from last: false when none; `*topic` stays valid
    // until the next set_cursor().
    bool find_cursor(std::string_view subscription, const char** topic,
                     int32_t* partition) const noexcept;
    void set_cursor(std::string_view subscription, std::string_view topic, int32_t partition);

    // ---- lanes, numbered from 0 in the order they are added
    std::size_t add_lane(std::string_view topic, int32_t partition);
    std::size_t lane_count() const noexcept { return lanes_.size(); }
    // Whether the pass added the lane already.
    bool has_lane(std::string_view topic, int32_t partition) const noexcept {
        for (const Lane& lane : lanes_)
            if (lane.partition == partition && lane.topic == topic) return true;
        return false;
    }
    LaneId lane_id(std::size_t lane) const noexcept {
        return LaneId{lanes_[lane].topic.c_str(), lanes_[lane].partition};
    }
    std::size_t lane_size(std::size_t lane) const noexcept {
        return lanes_[lane].candidates.size();
    }
    // The pass holds the lane's lock.
    void set_locked(std::size_t lane) noexcept { lanes_[lane].locked = true; }
    bool is_locked(std::size_t lane) const noexcept { return lanes_[lane].locked; }
    // A crashed pass's claim on the lane was settled in this pass.
    void set_had_claim(std::size_t lane) noexcept { lanes_[lane].had_claim = true; }
    bool had_claim(std::size_t lane) const noexcept { return lanes_[lane].had_claim; }
    // Appends a message (in offset order); seal_lane() once the lane's last one is in.
    void add_message(std::size_t lane, const MessageRow& row);
    void seal_lane(std::size_t lane) noexcept;
    // Marks which messages of the lane some handler takes: handler_types[h] is handler h's
    // event type (nullptr: every type).
    void mark_handled(std::size_t lane, const char* const* handler_types,
                      std::size_t n_handlers) noexcept;
    // Whether some chosen message is in the lane.
    bool lane_has_chosen(std::size_t lane) const noexcept;
    // Whether the pass needs the lane's lock until it commits: a message chosen in it, or a
    // crashed claim settled.
    bool lane_in_use(std::size_t lane) const noexcept {
        return lanes_[lane].had_claim || lane_has_chosen(lane);
    }

    // ---- choosing
    // Plans the lane's messages (plan_lane()) with room for what `max` leaves after the ones
    // chosen so far; they are picked, not chosen yet. Lowers *next_due_ms to the earliest retry
    // time of a message it saw waiting. Returns the index of a suspect to run alone, or -1.
    long plan(std::size_t lane, Ordering ordering, bool unhandled_keep, int64_t now_ms,
              std::size_t max, int64_t* next_due_ms);
    // Chooses the lane's picks before message `before` (all of them by default).
    void choose_picks(std::size_t lane, std::size_t before = SIZE_MAX);
    // Chooses one message of the lane alone (a suspect).
    void choose_alone(std::size_t lane, std::size_t index);
    std::size_t chosen_count() const noexcept { return chosen_.size(); }
    std::size_t lane_of_chosen(std::size_t c) const noexcept { return chosen_[c].lane; }
    ChosenMessage chosen(std::size_t c) const noexcept;
    // Whether chosen message `c` has the id `id`.
    bool chosen_has_id(std::size_t c, std::string_view id) const noexcept;

    // ---- running
    // Chosen message `c` failed: it holds back later messages of its lane (held_back_by()).
    void mark_failed(std::size_t c);
    bool is_held_back(std::size_t c, Ordering ordering) const noexcept;
    std::size_t failed_count() const noexcept { return failed_.size(); }
    // A uniform jitter in [0, 1) for retry_delay_ms().
    double next_jitter() noexcept { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

  private:
    // Messages of one partition that still need handling, in offset order.
    struct Lane {
        std::string topic;
        int32_t partition = 0;
        std::vector<Candidate> candidates;
        std::vector<std::string> keys;  // owns the bytes candidates[i].key points to
        std::vector<std::string> ids;
        std::vector<int32_t> attempts;
        std::vector<std::string> event_types;
        std::vector<bool> has_type;
        std::vector<uint64_t> tids;
        bool locked = false;
        bool had_claim = false;
    };
    struct Chosen {
        std::size_t lane;
        std::size_t index;
    };
    struct Cursor {
        std::string topic;
        int32_t partition = 0;
    };

    // Lanes are appended while earlier ones are in use: a deque keeps them (and the keys
    // candidates point into) in place.
    std::deque<Lane> lanes_;
    std::vector<Chosen> chosen_;
    std::vector<std::size_t> picks_;   // of the lane planned last
    std::vector<std::size_t> failed_;  // chosen indices
    std::mt19937_64 rng_;
    std::map<std::string, Cursor, std::less<>> cursors_;
};

}  // namespace eventbox::handlers
