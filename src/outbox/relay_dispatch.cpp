// The relay dispatcher (see outbox/relay_dispatch.hpp).
#include "outbox/relay_dispatch.hpp"

#include <algorithm>
#include <limits>

namespace eventbox::relay {

Dispatcher::Dispatcher(Sink& sink, Limits limits, uint64_t seed)
    : sink_(sink), limits_(limits), rng_(seed) {}

Dispatcher::LaneKey Dispatcher::lane_of(const Row& row) {
    if (row.key == nullptr) {
        // Keyless rows have no order to keep: each is a lane of its own (splitmix64 of the id).
        uint64_t z = static_cast<uint64_t>(row.id) + 0x9e3779b97f4a7c15ULL;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
    uint64_t topic = std::hash<std::string_view>{}(row.topic);
    uint64_t key = std::hash<std::string_view>{}(std::string_view(row.key, row.key_len));
    return topic ^ (key + 0x9e3779b97f4a7c15ULL + (topic << 6) + (topic >> 2));
}

bool Dispatcher::knows(int64_t id) const noexcept {
    return in_flight_.count(id) != 0 || waiting_ids_.count(id) != 0;
}

int64_t Dispatcher::lowest_unsettled() const noexcept {
    int64_t low = std::numeric_limits<int64_t>::max();
    auto see = [&](int64_t id) {
        if (id < low && !held(id)) low = id;
    };
    for (int64_t id : hold_) low = std::min(low, id);  // not held until written
    for (const auto& f : in_flight_) see(f.first);
    for (const auto& w : waiting_ids_) see(w.first);
    for (int64_t id : fetching_ids_) see(id);
    for (const Acked& a : acked_) see(a.id);
    for (const Failed& f : failed_) see(f.id);
    return low;
}

std::size_t Dispatcher::hold_stale() {
    std::vector<int64_t> queued(hold_);
    std::sort(queued.begin(), queued.end());
    std::vector<int64_t> now_ids;
    now_ids.reserve(in_flight_.size() + waiting_ids_.size());
    auto take = [&](int64_t id) {
        if (!held(id) && !std::binary_search(queued.begin(), queued.end(), id))
            now_ids.push_back(id);
    };
    for (const auto& f : in_flight_) take(f.first);
    for (const auto& w : waiting_ids_) take(w.first);
    std::sort(now_ids.begin(), now_ids.end());
    std::vector<int64_t> stale, fresh;
    for (int64_t id : now_ids) {
        if (std::binary_search(stale_candidates_.begin(), stale_candidates_.end(), id))
            stale.push_back(id);
        else
            fresh.push_back(id);
    }
    hold_.insert(hold_.end(), stale.begin(), stale.end());
    stale_candidates_ = std::move(fresh);
    return stale.size();
}

std::size_t Dispatcher::capacity() const noexcept {
    if (in_flight_.size() >= limits_.max_in_flight || waiting_count_ >= limits_.max_waiting)
        return 0;
    return std::min(limits_.max_in_flight - in_flight_.size(),
                    limits_.max_waiting - waiting_count_);
}

int64_t Dispatcher::backoff_for(int32_t attempts) {
    int64_t delay = limits_.backoff_ms;
    for (int32_t i = 1; i < attempts && delay < limits_.backoff_max_ms; ++i) delay *= 2;
    delay = std::min(delay, limits_.backoff_max_ms);
    if (delay <= 1) return delay;
    std::uniform_int_distribution<int64_t> jitter(delay / 2, delay);
    return jitter(rng_);
}

void Dispatcher::wait_in_lane(LaneKey lane, uint64_t seq, int64_t id, int64_t due_ms) {
    lanes_[lane].waiting.emplace(seq, Wait{id, due_ms});
    blocked_.insert(lane);
    waiting_ids_[id] = {lane, seq};
    ++waiting_count_;
}

void Dispatcher::produce_now(const Row& row, LaneKey lane, uint64_t seq, int64_t now_ms) {
    std::string error;
    Produced result = sink_.produce(row, error);
    switch (result) {
        case Produced::kQueued:
            ++lanes_[lane].in_flight;
            in_flight_.emplace(row.id, Flight{lane, seq, row.attempts, row.created_ms, row.table,
                                              row.cause_received_ms, subscription_index(row)});
            return;
        case Produced::kBusy:
            // Local queue full: count nothing, try again after a backoff.
            wait_in_lane(lane, seq, row.id, now_ms + backoff_for(1));
            return;
        case Produced::kFailed:
        case Produced::kFailedPermanently:
            record_failure(row.id, lane, seq, row.attempts + 1,
                           result == Produced::kFailedPermanently, error, now_ms);
            return;
        case Produced::kUnrouted:
            // Not tracked: its lane's later rows (same topic) have no sink either. It is held
            // (unless it is already), so that it does not hold the settled position.
            if (unrouted_++ == 0) unrouted_topic_ = std::string(row.topic);
            if (!row.held) hold_.push_back(row.id);
            held_ids_.erase(row.id);
            forget_lane_if_idle(lane);
            return;
    }
}

void Dispatcher::record_failure(int64_t id, LaneKey lane, uint64_t seq, int32_t attempts,
                                bool permanent, std::string_view error, int64_t now_ms,
                                int64_t min_retry_ms) {
    bool give_up = permanent && attempts >= limits_.max_attempts;
    int64_t delay = give_up ? 0 : std::max(backoff_for(attempts), min_retry_ms);
    failed_.push_back(Failed{id, std::string(error), delay, give_up});
    if (!give_up) wait_in_lane(lane, seq, id, now_ms + delay);
}

void Dispatcher::offer(const Row& row, int64_t now_ms) {
    if (row.held) held_ids_.insert(row.id);
    auto fetched = fetching_ids_.find(row.id);
    if (fetched != fetching_ids_.end()) {
        // A due waiting row came back from the outbox: it is its lane's head, send it.
        fetching_ids_.erase(fetched);
        auto w = waiting_ids_.find(row.id);
        if (w == waiting_ids_.end()) return;
        LaneKey lane = w->second.first;
        uint64_t seq = w->second.second;
        Lane& l = lanes_[lane];
        l.waiting.erase(seq);
        l.fetching = false;
        waiting_ids_.erase(w);
        --waiting_count_;
        if (l.waiting.empty()) blocked_.erase(lane);
        produce_now(row, lane, seq, now_ms);
        return;
    }
    if (knows(row.id)) return;

    LaneKey lane = lane_of(row);
    uint64_t seq = next_seq_++;
    auto existing = lanes_.find(lane);
    bool lane_blocked = existing != lanes_.end() && !existing->second.waiting.empty();
    if (row.not_before_ms > now_ms) {
        wait_in_lane(lane, seq, row.id, row.not_before_ms);
    } else if (lane_blocked) {
        // An earlier row of this key waits for a retry: hold this one back behind it.
        wait_in_lane(lane, seq, row.id, now_ms);
    } else {
        produce_now(row, lane, seq, now_ms);
    }
}

uint32_t Dispatcher::subscription_index(const Row& row) {
    if (row.cause_subscription.empty() || row.cause_received_ms == 0) return 0;
    if (subscriptions_[last_subscription_] == row.cause_subscription) return last_subscription_;
    auto [it, added] = subscription_ids_.try_emplace(std::string(row.cause_subscription),
                                                     static_cast<uint32_t>(subscriptions_.size()));
    if (added) subscriptions_.push_back(it->first);
    last_subscription_ = it->second;
    return it->second;
}

void Dispatcher::forget_lane_if_idle(LaneKey lane) {
    auto it = lanes_.find(lane);
    if (it != lanes_.end() && it->second.in_flight == 0 && it->second.waiting.empty() &&
        !it->second.fetching)
        lanes_.erase(it);
}

void Dispatcher::on_delivery(int64_t id, int err, bool permanent, bool counts, int32_t partition,
                             int64_t offset, std::string_view error, int64_t now_ms,
                             int64_t min_retry_ms) {
    auto it = in_flight_.find(id);
    if (it == in_flight_.end()) return;  // from before a reset: the row will be read again
    Flight flight = std::move(it->second);
    in_flight_.erase(it);
    Lane& lane = lanes_[flight.lane];
    --lane.in_flight;

    if (err == 0) {
        acked_.push_back(Acked{id, partition, offset, flight.created_ms, flight.table,
                               flight.cause_received_ms, flight.cause_subscription});
    } else if (!counts) {
        wait_in_lane(flight.lane, flight.seq, id, now_ms);
    } else {
        record_failure(id, flight.lane, flight.seq, flight.attempts + 1, permanent, error, now_ms,
                       min_retry_ms);
    }
    forget_lane_if_idle(flight.lane);
}

const std::vector<int64_t>& Dispatcher::due_ids(int64_t now_ms, std::size_t max) {
    due_.clear();
    for (LaneKey name : blocked_) {
        if (due_.size() >= max) break;
        Lane& lane = lanes_[name];
        // The head goes only when nothing of its lane is in flight, so order holds.
        if (lane.fetching || lane.in_flight != 0 || lane.waiting.empty()) continue;
        const Wait& head = lane.waiting.begin()->second;
        if (head.due_ms > now_ms) continue;
        lane.fetching = true;
        fetching_ids_.insert(head.id);
        due_.push_back(head.id);
    }
    return due_;
}

void Dispatcher::refetch_done() {
    // Rows asked for but not returned left the outbox (deleted, skipped or no longer pending).
    for (int64_t id : fetching_ids_) {
        auto w = waiting_ids_.find(id);
        if (w == waiting_ids_.end()) continue;
        LaneKey lane = w->second.first;
        Lane& l = lanes_[lane];
        l.waiting.erase(w->second.second);
        l.fetching = false;
        waiting_ids_.erase(w);
        --waiting_count_;
        if (l.waiting.empty()) blocked_.erase(lane);
        forget_lane_if_idle(lane);
        held_ids_.erase(id);
    }
    fetching_ids_.clear();
}

void Dispatcher::clear_outcomes(std::size_t n_acked, std::size_t n_failed, std::size_t n_hold) {
    n_acked = std::min(n_acked, acked_.size());
    n_failed = std::min(n_failed, failed_.size());
    n_hold = std::min(n_hold, hold_.size());
    // Written and committed: acknowledged and given-up rows are gone; a failed row waiting for
    // its retry, and a row held too long, now have their copy in outbox_held.
    for (std::size_t i = 0; i < n_acked; ++i)
        if (!knows(acked_[i].id)) held_ids_.erase(acked_[i].id);
    for (std::size_t i = 0; i < n_failed; ++i) {
        int64_t id = failed_[i].id;
        if (!failed_[i].give_up && knows(id))
            held_ids_.insert(id);
        else if (!knows(id))
            held_ids_.erase(id);
    }
    for (std::size_t i = 0; i < n_hold; ++i)
        if (knows(hold_[i])) held_ids_.insert(hold_[i]);
    acked_.erase(acked_.begin(), acked_.begin() + n_acked);
    failed_.erase(failed_.begin(), failed_.begin() + n_failed);
    hold_.erase(hold_.begin(), hold_.begin() + n_hold);
}

int64_t Dispatcher::next_due_ms() const noexcept {
    int64_t next = std::numeric_limits<int64_t>::max();
    for (LaneKey name : blocked_) {
        auto it = lanes_.find(name);
        if (it == lanes_.end() || it->second.in_flight != 0 || it->second.waiting.empty()) continue;
        next = std::min(next, it->second.waiting.begin()->second.due_ms);
    }
    return next;
}

}  // namespace eventbox::relay
