// Late-commit rechecks for the relay's id-ordered claim scan.
//
// A claim reads pending rows with id > cursor. An id below the cursor that was not visible to the
// scan belongs to a transaction that drew it before the scan and commits after it. Every gap a
// scan sees is kept, with the outbox writers that were running (every transaction publishes its
// xid in shared memory before it draws an outbox id, see next_outbox_id), and re-read in every
// pass, before the pass's new rows and with the same snapshot: a row that committed late is thus
// never overtaken by a later-committed row of its key. A gap is forgotten after the first pass
// that starts when none of its writers runs any more. The writers are the xids of the writers'
// slots and of the prepared transactions holding a lock on the outbox's id sequence
// (relay_read.cpp): a prepared transaction keeps its gap after its backend moved on. A periodic
// sweep re-reads everything as a safety net.
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

    // Records ids in [lo, hi] as possibly late while any xid in `writers` runs.
    void add(int64_t lo, int64_t hi, const std::vector<uint32_t>& writers);

    // Starts a pass: marks the ranges none of whose writers is running as read for the last time
    // (call before the pass's snapshot) and returns all ranges to read, merged and ascending.
    const std::vector<IdRange>& begin_pass(const std::function<bool(uint32_t)>& running);
    // Ends a pass in which the first `fully_read` ranges begin_pass() returned were read whole:
    // forgets the last-time ranges among them.
    void end_pass(std::size_t fully_read);

    bool empty() const noexcept { return pending_.empty(); }
    std::size_t size() const noexcept { return pending_.size(); }
    void clear() noexcept { pending_.clear(); }

  private:
    struct Pending {
        IdRange range;
        std::vector<uint32_t> writers;
        bool last_time = false;
        std::size_t merged_index = 0;  // which range of the pass covers it
    };
    std::vector<Pending> pending_;
    std::vector<IdRange> pass_;
};

// The gaps a claim scan saw, as one range covering (cursor, first) and the holes between
// consecutive ids; empty (lo > hi) when there were none. `ids` must be ascending.
IdRange scan_gaps(int64_t cursor, const std::vector<int64_t>& ids);

}  // namespace eventbox::relay
