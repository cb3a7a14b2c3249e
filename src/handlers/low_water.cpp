// Low-water marks of a handler worker's lanes and the ingest's stored offsets (see
// handlers/low_water.hpp). Pure C++.
#include "handlers/low_water.hpp"

#include <algorithm>

namespace eventbox::handlers {

void LaneMarks::drop_marks() noexcept {
    for (auto& [subscription, lanes] : lanes_)
        for (Lane& lane : lanes) {
            lane.mark = LaneMark{};
            lane.empty_next = kNoMark;
        }
}

const std::vector<LaneMarks::Lane>* LaneMarks::lanes_of(
    std::string_view subscription) const noexcept {
    auto it = lanes_.find(subscription);
    return it == lanes_.end() ? nullptr : &it->second;
}

long LaneMarks::find(std::string_view subscription, std::string_view topic,
                     int32_t partition) const noexcept {
    const std::vector<Lane>* lanes = lanes_of(subscription);
    if (lanes == nullptr) return -1;
    for (std::size_t i = 0; i < lanes->size(); ++i)
        if ((*lanes)[i].partition == partition && (*lanes)[i].topic == topic)
            return static_cast<long>(i);
    return -1;
}

std::size_t LaneMarks::count(std::string_view subscription) const noexcept {
    const std::vector<Lane>* lanes = lanes_of(subscription);
    return lanes == nullptr ? 0 : lanes->size();
}

const LaneMarks::Lane* LaneMarks::lane_at(std::string_view subscription,
                                          std::size_t position) const noexcept {
    const std::vector<Lane>* lanes = lanes_of(subscription);
    return lanes == nullptr || position >= lanes->size() ? nullptr : &(*lanes)[position];
}

const std::string& LaneMarks::topic(std::string_view subscription,
                                    std::size_t position) const noexcept {
    static const std::string none;
    const Lane* lane = lane_at(subscription, position);
    return lane == nullptr ? none : lane->topic;
}

int32_t LaneMarks::partition(std::string_view subscription, std::size_t position) const noexcept {
    const Lane* lane = lane_at(subscription, position);
    return lane == nullptr ? -1 : lane->partition;
}

LaneMark LaneMarks::mark(std::string_view subscription, std::size_t position) const noexcept {
    const Lane* lane = lane_at(subscription, position);
    return lane == nullptr ? LaneMark{} : lane->mark;
}

std::size_t LaneMarks::learn(std::string_view subscription, long after, std::string_view topic,
                             int32_t partition) {
    long known = find(subscription, topic, partition);
    if (known >= 0) return static_cast<std::size_t>(known);
    auto it = lanes_.find(subscription);
    if (it == lanes_.end())
        it = lanes_.emplace(std::string(subscription), std::vector<Lane>{}).first;
    std::vector<Lane>& lanes = it->second;
    std::size_t at = std::min(static_cast<std::size_t>(std::max(after + 1, 0L)), lanes.size());
    lanes.insert(lanes.begin() + static_cast<std::ptrdiff_t>(at),
                 Lane{std::string(topic), partition, LaneMark{}});
    return at;
}

void LaneMarks::raise(std::string_view subscription, std::size_t position, bool replay,
                      int64_t offset) noexcept {
    auto it = lanes_.find(subscription);
    if (it == lanes_.end() || position >= it->second.size()) return;
    int64_t& mark = replay ? it->second[position].mark.replay : it->second[position].mark.live;
    mark = std::max(mark, offset);
}

void LaneMarks::begin_next(std::string_view subscription) noexcept {
    auto it = lanes_.find(subscription);
    if (it == lanes_.end()) return;
    for (Lane& lane : it->second) lane.next = kNoMark;
}

long LaneMarks::set_next(std::string_view subscription, long hint, std::string_view topic,
                         int32_t partition, int64_t next) noexcept {
    auto it = lanes_.find(subscription);
    if (it == lanes_.end()) return -1;
    std::vector<Lane>& lanes = it->second;
    long at = hint;
    if (at < 0 || static_cast<std::size_t>(at) >= lanes.size() ||
        lanes[static_cast<std::size_t>(at)].partition != partition ||
        lanes[static_cast<std::size_t>(at)].topic != topic)
        at = find(subscription, topic, partition);
    if (at >= 0) lanes[static_cast<std::size_t>(at)].next = next;
    return at;
}

void LaneMarks::probed_empty(std::string_view subscription, std::size_t position,
                             int64_t next) noexcept {
    auto it = lanes_.find(subscription);
    if (it == lanes_.end() || position >= it->second.size()) return;
    it->second[position].empty_next = next;
}

bool LaneMarks::any_probed_empty(std::string_view subscription) const noexcept {
    const std::vector<Lane>* lanes = lanes_of(subscription);
    if (lanes == nullptr) return false;
    for (const Lane& lane : *lanes)
        if (lane.empty_next != kNoMark) return true;
    return false;
}

bool LaneMarks::drained(std::string_view subscription, std::size_t position) const noexcept {
    const std::vector<Lane>* lanes = lanes_of(subscription);
    if (lanes == nullptr || position >= lanes->size()) return false;
    const Lane& lane = (*lanes)[position];
    return lane.next != kNoMark && lane.next == lane.empty_next;
}

void LaneMarks::set_unknown_work(std::string_view subscription, bool found) {
    auto it = unknown_work_.find(subscription);
    if (found && it == unknown_work_.end())
        unknown_work_.emplace(subscription);
    else if (!found && it != unknown_work_.end())
        unknown_work_.erase(it);
}

bool StoredOffsets::store(std::string_view subscription, std::string_view topic, int32_t partition,
                          int64_t first, int64_t last) {
    auto key = std::make_tuple(std::string(subscription), std::string(topic), partition);
    auto it = highest_.find(key);
    if (it == highest_.end()) {
        highest_.emplace(std::move(key), std::max(first, last));
        return true;
    }
    bool lower = first <= it->second;
    it->second = std::max({it->second, first, last});
    return lower;
}

bool StoredOffsets::below(std::string_view subscription, std::string_view topic, int32_t partition,
                          int64_t first) const {
    auto it =
        highest_.find(std::make_tuple(std::string(subscription), std::string(topic), partition));
    return it == highest_.end() || first <= it->second;
}

}  // namespace eventbox::handlers
