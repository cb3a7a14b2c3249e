// Lane planning for handler passes (see handlers/plan.hpp).
#include "handlers/plan.hpp"

#include <algorithm>
#include <set>

namespace eventbox::handlers {

Ordering ordering_from(std::string_view name) noexcept {
    if (name == "key") return Ordering::kKey;
    if (name == "none") return Ordering::kNone;
    return Ordering::kPartition;
}

long plan_lane(const std::vector<Candidate>& lane, Ordering ordering, bool unhandled_keep,
               int64_t now_ms, std::size_t max, std::vector<std::size_t>& chosen) {
    std::set<std::string_view> blocked_keys;
    bool blocked_no_key = false;
    for (std::size_t i = 0; i < lane.size() && chosen.size() < max; ++i) {
        const Candidate& c = lane[i];
        if (!c.handled && unhandled_keep) continue;
        bool due = c.not_before_ms <= now_ms;
        switch (ordering) {
            case Ordering::kPartition:
                if (!due) return -1;  // holds back the rest of the partition
                break;
            case Ordering::kKey: {
                bool blocked = c.has_key ? blocked_keys.count(c.key) != 0 : blocked_no_key;
                if (!due || blocked) {
                    if (c.has_key)
                        blocked_keys.insert(c.key);
                    else
                        blocked_no_key = true;
                    continue;
                }
                break;
            }
            case Ordering::kNone:
                if (!due) continue;
                break;
        }
        if (c.suspect) return static_cast<long>(i);
        chosen.push_back(i);
    }
    return -1;
}

bool held_back_by(const Candidate& failed, const Candidate& later, Ordering ordering) noexcept {
    switch (ordering) {
        case Ordering::kPartition:
            return true;
        case Ordering::kKey:
            return failed.has_key == later.has_key && (!failed.has_key || failed.key == later.key);
        case Ordering::kNone:
            return false;
    }
    return true;
}

int64_t retry_delay_ms(int32_t attempts, int64_t backoff_ms, int64_t backoff_max_ms,
                       double unit) noexcept {
    int64_t cap = std::max(backoff_max_ms, backoff_ms);
    int64_t delay = std::max<int64_t>(backoff_ms, 1);
    for (int32_t i = 1; i < attempts && delay < cap; ++i)
        delay = delay > cap / 2 ? cap : delay * 2;  // never overflows
    delay = std::min(delay, cap);
    unit = std::clamp(unit, 0.0, 1.0);
    return delay / 2 + static_cast<int64_t>(static_cast<double>(delay - delay / 2) * unit);
}

}  // namespace eventbox::handlers
