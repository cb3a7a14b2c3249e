// The working set of a handler pass (see handlers/pass_state.hpp).
#include "handlers/pass_state.hpp"

namespace eventbox::handlers {

void PassState::begin_pass() noexcept {
    lanes_.clear();
    chosen_.clear();
    picks_.clear();
    failed_.clear();
}

bool PassState::find_cursor(std::string_view subscription, const char** topic,
                            int32_t* partition) const noexcept {
    auto it = cursors_.find(subscription);
    if (it == cursors_.end()) return false;
    *topic = it->second.topic.c_str();
    *partition = it->second.partition;
    return true;
}

void PassState::set_cursor(std::string_view subscription, std::string_view topic,
                           int32_t partition) {
    auto it = cursors_.find(subscription);
    if (it == cursors_.end()) it = cursors_.emplace(std::string(subscription), Cursor{}).first;
    it->second.topic.assign(topic);
    it->second.partition = partition;
}

std::size_t PassState::add_lane(std::string_view topic, int32_t partition) {
    Lane& lane = lanes_.emplace_back();
    lane.topic.assign(topic);
    lane.partition = partition;
    return lanes_.size() - 1;
}

void PassState::add_message(std::size_t l, const MessageRow& row) {
    Lane& lane = lanes_[l];
    lane.keys.emplace_back(row.key ? std::string(row.key, row.key_len) : std::string());
    lane.ids.emplace_back(row.id);
    lane.attempts.push_back(row.attempts);
    lane.event_types.emplace_back(row.event_type ? row.event_type : "");
    lane.has_type.push_back(row.event_type != nullptr);
    lane.tids.push_back(row.tid);
    Candidate c;
    c.has_key = row.key != nullptr;
    c.not_before_ms = row.has_next_attempt ? row.next_attempt_ms : 0;
    // Attempted, yet not waiting for a retry: that attempt never finished.
    c.suspect = row.attempts > 0 && !row.has_next_attempt;
    lane.candidates.push_back(c);
}

void PassState::seal_lane(std::size_t l) noexcept {
    // The keys' strings move while the lane grows: views into them are taken only now.
    Lane& lane = lanes_[l];
    for (std::size_t i = 0; i < lane.candidates.size(); ++i) lane.candidates[i].key = lane.keys[i];
}

void PassState::mark_handled(std::size_t l, const char* const* handler_types,
                             std::size_t n_handlers) noexcept {
    Lane& lane = lanes_[l];
    for (std::size_t i = 0; i < lane.candidates.size(); ++i) {
        const char* type = lane.has_type[i] ? lane.event_types[i].c_str() : nullptr;
        bool handled = false;
        for (std::size_t h = 0; h < n_handlers && !handled; ++h)
            handled = handler_takes(handler_types[h], type);
        lane.candidates[i].handled = handled;
    }
}

bool PassState::lane_has_chosen(std::size_t l) const noexcept {
    for (const Chosen& c : chosen_)
        if (c.lane == l) return true;
    return false;
}

long PassState::plan(std::size_t l, Ordering ordering, bool unhandled_keep, int64_t now_ms,
                     std::size_t max, int64_t* next_due_ms) {
    const Lane& lane = lanes_[l];
    picks_.clear();
    long suspect =
        plan_lane(lane.candidates, ordering, unhandled_keep, now_ms, max - chosen_.size(), picks_);
    for (const Candidate& c : lane.candidates)
        if (c.not_before_ms > now_ms && c.not_before_ms < *next_due_ms)
            *next_due_ms = c.not_before_ms;
    return suspect;
}

void PassState::choose_picks(std::size_t l, std::size_t before) {
    for (std::size_t p : picks_)
        if (p < before) chosen_.push_back({l, p});
}

void PassState::choose_alone(std::size_t l, std::size_t index) {
    chosen_.push_back({l, index});
}

ChosenMessage PassState::chosen(std::size_t c) const noexcept {
    const Chosen& ch = chosen_[c];
    const Lane& lane = lanes_[ch.lane];
    return ChosenMessage{ch.lane,
                         lane.ids[ch.index].c_str(),
                         lane.has_type[ch.index] ? lane.event_types[ch.index].c_str() : nullptr,
                         lane.attempts[ch.index],
                         lane.tids[ch.index],
                         lane.candidates[ch.index].handled,
                         ch.index};
}

bool PassState::chosen_has_id(std::size_t c, std::string_view id) const noexcept {
    const Chosen& ch = chosen_[c];
    return lanes_[ch.lane].ids[ch.index] == id;
}

void PassState::mark_failed(std::size_t c) {
    failed_.push_back(c);
}

bool PassState::is_held_back(std::size_t c, Ordering ordering) const noexcept {
    const Chosen& ch = chosen_[c];
    const Lane& lane = lanes_[ch.lane];
    for (std::size_t f : failed_) {
        const Chosen& fc = chosen_[f];
        if (fc.lane == ch.lane &&
            held_back_by(lane.candidates[fc.index], lane.candidates[ch.index], ordering))
            return true;
    }
    return false;
}

}  // namespace eventbox::handlers
