// The message ids a subscription's lanes stored last (see inbox/recent_ids.hpp).
#include "inbox/recent_ids.hpp"

#include <algorithm>

namespace eventbox::inbox {

namespace {

// FNV-1a, 64 bits: ids are short, and a collision only sends a new id to ON CONFLICT.
uint64_t fnv(std::string_view s, uint64_t h = 14695981039346656037ULL) noexcept {
    for (unsigned char ch : s) {
        h ^= ch;
        h *= 1099511628211ULL;
    }
    return h;
}

}  // namespace

uint64_t RecentIds::hash(std::string_view id) noexcept {
    return fnv(id);
}

uint64_t RecentIds::lane(std::string_view topic, int32_t partition) noexcept {
    char p[4];
    for (int i = 0; i < 4; ++i)
        p[i] = static_cast<char>((static_cast<uint32_t>(partition) >> (8 * i)) & 0xff);
    return fnv(std::string_view(p, 4), fnv(topic));
}

bool RecentIds::contains(uint64_t lane, uint64_t id) const noexcept {
    auto it = lanes_.find(lane);
    if (it == lanes_.end()) return false;
    const std::vector<uint64_t>& ids = it->second.ids;
    return std::find(ids.begin(), ids.end(), id) != ids.end();
}

void RecentIds::committed() {
    for (const auto& [lane, id] : pending_) {
        Ring& r = lanes_[lane];
        if (r.ids.size() < kPerLane) {
            r.ids.push_back(id);
        } else {
            r.ids[r.next] = id;
            r.next = (r.next + 1) % kPerLane;
        }
    }
    pending_.clear();
}

void RecentIds::clear() noexcept {
    lanes_.clear();
    pending_.clear();
}

}  // namespace eventbox::inbox
