// Low-water marks of a handler worker's lanes (docs/design/handlers.md): for each lane of a
// subscription, offsets below which its live range and its replay range hold no message to
// handle, so that a lane read and a next-lane probe start past the index entries of messages
// handled before (dead or not yet vacuumed) instead of walking them.
//
// The lanes a worker knows are kept per subscription in the order the inbox index sorts them,
// which is the database collation's: that order is learned from the probes that find lanes
// (a lane found between two known ones goes between them) and never computed here.
//
// The ingest side's StoredOffsets tells when a batch stores a record at an offset not above
// every one this process stored before in that lane (a replay(), a seek, a restart): then the
// handler workers' marks must go.
//
// Pure C++. What cannot allocate is noexcept: the PostgreSQL side calls it directly, and the
// rest through its guard (handlers/marks.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace eventbox::handlers {

// No mark: the range is read from its first offset.
inline constexpr int64_t kNoMark = -1;

struct LaneMark {
    int64_t live = kNoMark;    // mode live or backfill
    int64_t replay = kNoMark;  // mode replay (eventbox.reprocess())
};

class LaneMarks {
  public:
    // Forgets every mark (the lanes stay known, in their order).
    void drop_marks() noexcept;
    // Forgets every lane and mark: each subscription's lanes are loaded again.
    void drop_all() noexcept {
        lanes_.clear();
        unknown_work_.clear();
    }
    // Whether the subscription's lanes were loaded since the last drop_all(); begin_load()
    // marks them loaded (none yet: learn() adds them).
    bool loaded(std::string_view subscription) const noexcept {
        return lanes_of(subscription) != nullptr;
    }
    void begin_load(std::string_view subscription) { lanes_[std::string(subscription)].clear(); }

    // The position of a lane among the subscription's known lanes, or -1.
    long find(std::string_view subscription, std::string_view topic,
              int32_t partition) const noexcept;
    std::size_t count(std::string_view subscription) const noexcept;
    // The lane at `position` (0 <= position < count()): its topic stays valid until the
    // subscription's lanes change (learn()). Another position gives an empty topic, partition
    // -1 and no mark.
    const std::string& topic(std::string_view subscription, std::size_t position) const noexcept;
    int32_t partition(std::string_view subscription, std::size_t position) const noexcept;
    LaneMark mark(std::string_view subscription, std::size_t position) const noexcept;

    // Learns a lane that the index sorts right after the known lane at `after` (-1: before the
    // first one) and before the one that follows it; returns its position. A lane known already
    // keeps its place.
    std::size_t learn(std::string_view subscription, long after, std::string_view topic,
                      int32_t partition);

    // Raises the mark of the lane's live or replay range to `offset` (never lowers it: a read
    // from the mark found its first row at `offset`).
    void raise(std::string_view subscription, std::size_t position, bool replay,
               int64_t offset) noexcept;

    // The next offsets the ingest stores at in the subscription's lanes (eventbox.offsets), as a
    // pass read them: begin_next() forgets those of the previous pass, set_next() records one
    // lane's and returns its position (-1 when the lane is not known), looking first at
    // `hint` (the position that follows the lane recorded before: both are in index order).
    void begin_next(std::string_view subscription) noexcept;
    long set_next(std::string_view subscription, long hint, std::string_view topic,
                  int32_t partition, int64_t next) noexcept;
    // Records that a probe of the lane's live range from its mark found nothing waiting, with
    // `next` as the lane's next offset in the probe's snapshot. Forgotten with the marks.
    void probed_empty(std::string_view subscription, std::size_t position, int64_t next) noexcept;
    // Whether any lane of the subscription has an empty probe recorded: when none has, no lane
    // can be drained and a pass need not read the next offsets.
    bool any_probed_empty(std::string_view subscription) const noexcept;
    // Whether the lane's live range has provably nothing to handle (the caller uses marks this
    // pass): the next offset this pass read is the one of the lane's last empty probe. Rows
    // stored since move the next offset; what lowers it again (eventbox.replay) or makes rows
    // wait below the mark moves the inbox generation, which drops the marks.
    // (A next offset at or below the mark is not enough: after a replay lowered it, rows stored
    // before still wait above it.)
    bool drained(std::string_view subscription, std::size_t position) const noexcept;

    // Whether the subscription's last walk over the lanes found by the plain probe took work in
    // lanes it does not know (rows without an eventbox.offsets row): then each pass looks again.
    // Forgotten with the lanes (drop_all()).
    void set_unknown_work(std::string_view subscription, bool found);
    bool unknown_work(std::string_view subscription) const noexcept {
        return unknown_work_.find(subscription) != unknown_work_.end();
    }

  private:
    struct Lane {
        std::string topic;
        int32_t partition = 0;
        LaneMark mark;
        int64_t next = kNoMark;        // eventbox.offsets.next_offset as this pass read it
        int64_t empty_next = kNoMark;  // the next offset of the last empty probe (probed_empty())
    };
    std::map<std::string, std::vector<Lane>, std::less<>> lanes_;
    std::set<std::string, std::less<>> unknown_work_;
    const std::vector<Lane>* lanes_of(std::string_view subscription) const noexcept;
    const Lane* lane_at(std::string_view subscription, std::size_t position) const noexcept;
};

// Highest offset stored so far by this ingest process, by (subscription, topic, partition).
class StoredOffsets {
  public:
    // Records that a batch stores offsets `first` to `last` in the lane. Returns true when
    // `first` is not above every offset stored in the lane before by this process (or it stored
    // none there): a row may then wait below a handler worker's mark.
    bool store(std::string_view subscription, std::string_view topic, int32_t partition,
               int64_t first, int64_t last);
    // What store() would return for a batch starting at `first`, without recording it.
    bool below(std::string_view subscription, std::string_view topic, int32_t partition,
               int64_t first) const;
    void clear() { highest_.clear(); }

  private:
    std::map<std::tuple<std::string, std::string, int32_t>, int64_t> highest_;
};

}  // namespace eventbox::handlers
