// The message ids a subscription's lanes stored last, as 64-bit hashes (pure C++; used by the
// ingest worker's store, see docs/design/ingest.md, "Storing a batch").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace eventbox::inbox {

// A producer's retry sends a record again a few records later in the same partition: most
// duplicates in a stream are of a record of the same batch or of one of the last records of
// its lane. A batch's ids found here are likely stored already, so the store inserts them apart
// (with ON CONFLICT) and keeps the rest of the batch on the insert without ON CONFLICT. Only a
// guess, never trusted for correctness: a hash collision or a row deleted since costs an ON
// CONFLICT probe, an id missed here the fast insert's rolled-back attempt.
//
// Per lane (topic, partition), the last kPerLane ids stored: 8 bytes each. The lanes are not
// in batch order (the consumer hands out a partition's records in runs of thousands, one
// partition after the other), so a window over the last batches would miss a retry across
// the end of a partition's run.
class RecentIds {
  public:
    static constexpr std::size_t kPerLane = 64;

    static uint64_t hash(std::string_view id) noexcept;
    static uint64_t lane(std::string_view topic, int32_t partition) noexcept;

    bool contains(uint64_t lane, uint64_t id) const noexcept;

    // The batch being stored: its ids are added by add(), and become recent by committed()
    // (after its transaction committed); begin() drops those of a batch that did not commit.
    void begin() noexcept { pending_.clear(); }
    void add(uint64_t lane, uint64_t id) { pending_.emplace_back(lane, id); }
    void committed();

    std::size_t lanes() const noexcept { return lanes_.size(); }
    void clear() noexcept;

  private:
    struct Ring {
        std::vector<uint64_t> ids;  // up to kPerLane
        std::size_t next = 0;       // where the next id goes once full
    };
    std::unordered_map<uint64_t, Ring> lanes_;
    std::vector<std::pair<uint64_t, uint64_t>> pending_;
};

}  // namespace eventbox::inbox
