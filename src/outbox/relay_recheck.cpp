// Late-commit recheck bookkeeping (see outbox/relay_recheck.hpp).
#include "outbox/relay_recheck.hpp"

#include <algorithm>

namespace eventbox::relay {

void Rechecks::add(int64_t lo, int64_t hi, const std::vector<uint32_t>& writers) {
    if (lo > hi) return;
    if (pending_.size() >= kMaxRanges) {
        // Full: fold into the newest entry. A wider range waiting for more writers is still
        // correct, only read longer.
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

const std::vector<IdRange>& Rechecks::begin_pass(const std::function<bool(uint32_t)>& running) {
    for (Pending& p : pending_) {
        // Forget writers that finished so later checks are cheaper.
        p.writers.erase(std::remove_if(p.writers.begin(), p.writers.end(),
                                       [&](uint32_t xid) { return !running(xid); }),
                        p.writers.end());
        p.last_time = p.writers.empty();
    }
    std::sort(pending_.begin(), pending_.end(),
              [](const Pending& a, const Pending& b) { return a.range.lo < b.range.lo; });
    pass_.clear();
    for (Pending& p : pending_) {
        if (!pass_.empty() && p.range.lo <= pass_.back().hi + 1)
            pass_.back().hi = std::max(pass_.back().hi, p.range.hi);
        else
            pass_.push_back(p.range);
        p.merged_index = pass_.size() - 1;
    }
    return pass_;
}

int64_t Rechecks::lowest() const noexcept {
    int64_t low = INT64_MAX;
    for (const Pending& p : pending_) low = std::min(low, p.range.lo);
    return low;
}

void Rechecks::end_pass(std::size_t fully_read) {
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [&](const Pending& p) {
                                      return p.last_time && p.merged_index < fully_read;
                                  }),
                   pending_.end());
    pass_.clear();
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
