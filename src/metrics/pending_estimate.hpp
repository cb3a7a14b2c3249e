// The pending gauges of the supervisor's endpoint between exact counts. Counting every row that
// waits costs what the backlog costs, every second; a large backlog would make each scrape
// slower and take CPU from the workers exactly when they have the most to do. So the exact count
// runs every refresh only while it is cheap, and otherwise at most once every kCountShare times
// its own duration; in between a gauge is its last exact count plus what the workers' committed
// batches changed since (metrics/counters.hpp: rows stored minus rows settled per subscription,
// rows sent minus rows published or given up in the outbox). Changes made by SQL (redrive,
// reprocess, operators' UPDATEs, COMMIT PREPARED) show at the next exact count.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace eventbox::metrics {

class PendingEstimate {
public:
    static constexpr int64_t kCountShare = 50;   // counts take at most 1/50 of the time
    static constexpr int64_t kMinIntervalMs = 1000;

    // Whether a refresh at now_ms must count (nothing counted yet, or the interval passed).
    bool count_due(int64_t now_ms) const;

    // An exact count that started at `at_ms` and took `took_ms`: its values and the balances
    // (counters) read before it started.
    void start_count(int64_t at_ms);
    void set_outbox(int64_t pending, int64_t balance);
    void set_inbox(const std::string& subscription, int64_t pending, int64_t balance);
    void end_count(int64_t took_ms);

    // The estimates from the balances now; false when the subscription was not counted (a new
    // one: count again).
    int64_t outbox(int64_t balance) const;
    bool inbox(const std::string& subscription, int64_t balance, int64_t* pending) const;

private:
    struct Base {
        int64_t pending, balance;
    };
    bool counted_ = false;
    int64_t counted_at_ms_ = 0, took_ms_ = 0;
    Base outbox_{0, 0};
    std::map<std::string, Base> inbox_;
};

}  // namespace eventbox::metrics
