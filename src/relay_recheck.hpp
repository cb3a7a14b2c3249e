// Late-commit rechecks for the relay's id-ordered claim scan.
//
// A claim reads pending rows with id > cursor. An id below the cursor that was not visible to the
// scan belongs to a transaction that drew it before the scan and commits after it. Every
// transaction that draws an outbox id first publishes its xid in shared memory (next_outbox_id),
// and the relay reads those xids after taking its snapshot; so once all of them have finished,
// one recheck of the scan's gap range finds any late commit. A periodic sweep covers what this
// cannot see (prepared transactions whose backend moved on).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace eventbox::relay {

struct IdRange {
    int64_t lo;
    int64_t hi;
};

class Rechecks {
public:
    static constexpr std::size_t kMaxRanges = 64;

    // Records ids in [lo, hi] as possibly late until every xid in `writers` has finished.
    void add(int64_t lo, int64_t hi, const std::vector<uint32_t>& writers);

    // Removes and returns the ranges none of whose writers is still running, merged and sorted.
    std::vector<IdRange> take_due(const std::function<bool(uint32_t)>& running);

    bool empty() const { return pending_.empty(); }
    std::size_t size() const { return pending_.size(); }
    void clear() { pending_.clear(); }

private:
    struct Pending {
        IdRange range;
        std::vector<uint32_t> writers;
    };
    std::vector<Pending> pending_;
};

// The gaps a claim scan saw, as one range covering (cursor, first) and the holes between
// consecutive ids; empty (lo > hi) when there were none. `ids` must be ascending.
IdRange scan_gaps(int64_t cursor, const std::vector<int64_t>& ids);

}  // namespace eventbox::relay
