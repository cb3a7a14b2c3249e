// A fake Sink and rows for the tests of the relay's dispatcher (src/outbox/relay_dispatch.cpp):
// relay_dispatch_test.cpp and relay_dispatch_waits_test.cpp.
#pragma once

#include "outbox/relay_dispatch.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace eventbox::relay {

inline constexpr int kErrTimedOut = -192;    // RD_KAFKA_RESP_ERR__MSG_TIMED_OUT
inline constexpr int kErrPurgeQueue = -152;  // RD_KAFKA_RESP_ERR__PURGE_QUEUE
inline constexpr int kErrTooLarge = 10;      // RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE
inline constexpr int kErrQueueFull = -184;   // RD_KAFKA_RESP_ERR__QUEUE_FULL

// Records what the dispatcher hands to Kafka; can refuse to enqueue chosen ids.
class FakeSink : public Sink {
  public:
    Produced produce(const Row& row, std::string& error) override {
        ++calls;
        if (refuse.count(row.id) != 0 || refuse_all) {
            error = "Local: Queue full";
            return Produced::kBusy;
        }
        if (too_large.count(row.id) != 0) {
            error = "MSG_SIZE_TOO_LARGE: Broker: Message size too large";
            return Produced::kFailedPermanently;
        }
        produced.push_back(row.id);
        payloads.emplace_back(row.payload ? std::string(row.payload, row.payload_len) : "<null>");
        return Produced::kQueued;
    }
    std::vector<int64_t> produced;
    std::vector<std::string> payloads;
    std::set<int64_t> refuse;
    std::set<int64_t> too_large;  // refused locally as too large
    bool refuse_all = false;
    int calls = 0;
};

// Owns the bytes a Row points to.
struct TestRow {
    int64_t id = 0;
    std::string topic = "orders";
    bool has_key = true;
    std::string key;
    std::string payload = "{}";
    int32_t attempts = 0;
    int64_t not_before_ms = 0;
    std::string message_id = "0190a6d2-0000-7000-8000-000000000000";

    Row row() const {
        Row r;
        r.id = id;
        r.message_id = message_id;
        r.topic = topic;
        r.key = has_key ? key.data() : nullptr;
        r.key_len = has_key ? key.size() : 0;
        r.payload = payload.data();
        r.payload_len = payload.size();
        r.attempts = attempts;
        r.not_before_ms = not_before_ms;
        return r;
    }
};

inline TestRow keyed(int64_t id, std::string key, std::string topic = "orders") {
    TestRow r;
    r.id = id;
    r.key = std::move(key);
    r.topic = std::move(topic);
    r.payload = "payload-" + std::to_string(id);
    return r;
}

inline TestRow keyless(int64_t id) {
    TestRow r;
    r.id = id;
    r.has_key = false;
    r.payload = "payload-" + std::to_string(id);
    return r;
}

inline Limits small_limits() {
    Limits l;
    l.max_in_flight = 100;
    l.max_waiting = 100;
    l.backoff_ms = 100;
    l.backoff_max_ms = 1000;
    l.max_attempts = 3;
    return l;
}

inline void ack(Dispatcher& d, int64_t id, int64_t now, int64_t offset = 0) {
    d.on_delivery(id, 0, false, true, 0, offset, "", now);
}
inline void fail(Dispatcher& d, int64_t id, int64_t now, int err = kErrTimedOut,
                 bool permanent = false) {
    d.on_delivery(id, err, permanent, true, -1, -1, "Local: Message timed out", now);
}
inline void purge(Dispatcher& d, int64_t id, int64_t now) {
    d.on_delivery(id, kErrPurgeQueue, false, false, -1, -1, "Local: Purged in queue", now);
}

inline std::vector<int64_t> acked_ids(const Dispatcher& d) {
    std::vector<int64_t> ids;
    for (const Acked& a : d.acked()) ids.push_back(a.id);
    return ids;
}

inline std::vector<int64_t> sorted(std::vector<int64_t> v) {
    std::sort(v.begin(), v.end());
    return v;
}

// Plays the relay's refetch protocol: ask for due ids, re-read them (here: from `rows`, the
// outbox as it is now; rows missing from it have vanished) and offer them back.
inline std::vector<int64_t> refetch(Dispatcher& d, const std::map<int64_t, TestRow>& rows,
                                    int64_t now, std::size_t max = 1000) {
    std::vector<int64_t> due = d.due_ids(now, max);
    for (int64_t id : due) {
        auto it = rows.find(id);
        if (it != rows.end()) d.offer(it->second.row(), now);
    }
    d.refetch_done();
    return due;
}

}  // namespace eventbox::relay
