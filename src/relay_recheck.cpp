// Late-commit recheck bookkeeping (see relay_recheck.hpp).
#include "relay_recheck.hpp"

#include <algorithm>

namespace eventbox::relay {

void Rechecks::add(int64_t lo, int64_t hi, const std::vector<uint32_t>& writers) {
    if (lo > hi) return;
    if (pending_.size() >= kMaxRanges) {
        // Full: fold into the newest entry. A wider range waiting for more writers is still
        // correct, only rechecked later.
        Pending& last = pending_.back();
        last.range.lo = std::min(last.range.lo, lo);
        last.range.hi = std::max(last.range.hi, hi);
        last.writers.insert(last.writers.end(), writers.begin(), writers.end());
        std::sort(last.writers.begin(), last.writers.end());
        last.writers.erase(std::unique(last.writers.begin(), last.writers.end()),
                           last.writers.end());
        return;
    }
    pending_.push_back(Pending{{lo, hi}, writers});
}

std::vector<IdRange> Rechecks::take_due(const std::function<bool(uint32_t)>& running) {
    std::vector<IdRange> due;
    auto keep = std::remove_if(pending_.begin(), pending_.end(), [&](Pending& p) {
        // Forget writers that finished so later checks are cheaper.
        p.writers.erase(std::remove_if(p.writers.begin(), p.writers.end(),
                                       [&](uint32_t xid) { return !running(xid); }),
                        p.writers.end());
        if (!p.writers.empty()) return false;
        due.push_back(p.range);
        return true;
    });
    pending_.erase(keep, pending_.end());
    std::sort(due.begin(), due.end(),
              [](const IdRange& a, const IdRange& b) { return a.lo < b.lo; });
    std::vector<IdRange> merged;
    for (const IdRange& r : due) {
        if (!merged.empty() && r.lo <= merged.back().hi + 1)
            merged.back().hi = std::max(merged.back().hi, r.hi);
        else
            merged.push_back(r);
    }
    return merged;
}

IdRange scan_gaps(int64_t cursor, const std::vector<int64_t>& ids) {
    IdRange gaps{0, -1};
    int64_t prev = cursor;
    for (int64_t id : ids) {
        if (id > prev + 1) {
            if (gaps.hi < gaps.lo) gaps.lo = prev + 1;
            gaps.hi = id - 1;
        }
        prev = id;
    }
    return gaps;
}

}  // namespace eventbox::relay
