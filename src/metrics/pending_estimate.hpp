// The pending gauges of the supervisor's endpoint between exact counts. Counting every row that
// waits costs what the backlog costs, every second; a large backlog would make each scrape
// slower and take CPU from the workers exactly when they have the most to do. So the exact count
// runs every refresh only while it is cheap, and otherwise at most once every kCountShare times
// its expected duration: the last count's cost per row (or kDefaultRowUs until a count of at
// least kLearnRows rows measured it) times the rows estimated to wait now, so that a backlog
// that grows fast is not counted at every refresh until one count turns out expensive. In
// between a gauge is its last exact count plus what the workers' committed batches changed since
// (metrics/counters.hpp: rows stored minus rows settled per subscription, rows sent minus rows
// published or given up in the outbox). Changes made by SQL (redrive, reprocess, operators'
// UPDATEs, COMMIT PREPARED) show at the next exact count.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

namespace eventbox::metrics {

class PendingEstimate {
  public:
    // Counts take at most 1/200 of the time (0.5% of a core; 1/50 was 2%, of the CPU the
    // workers need most while a backlog is large: bench/NOTEBOOK.md, 2026-11-27).
    static constexpr int64_t kCountShare = 200;
    static constexpr int64_t kMinIntervalMs = 1000;
    static constexpr double kDefaultRowUs = 1.0;  // ~0.3 us per fresh row measured, x3 margin
    static constexpr int64_t kLearnRows = 10000;

    // Whether a refresh at now_ms must count (nothing counted yet, or the interval passed), with
    // `waiting` rows estimated to wait now (total()).
    bool count_due(int64_t now_ms, int64_t waiting) const;
    // The rows estimated to wait now, from the balances now (inbox_balance of a subscription).
    int64_t total(int64_t outbox_balance,
                  const std::function<int64_t(const std::string&)>& inbox_balance) const;

    // An exact count that started at `at_ms` and took `took_ms`: its values and the balances
    // (counters) read before it started.
    void start_count(int64_t at_ms);
    void set_outbox(int64_t pending, int64_t balance);
    void set_inbox(const std::string& subscription, int64_t pending, int64_t balance);
    void end_count(int64_t took_ms);

    // The estimates from the balances now; false when the subscription was not counted (a new
    // one: count again).
    int64_t outbox(int64_t balance) const noexcept;
    bool inbox(const std::string& subscription, int64_t balance, int64_t* pending) const;

    // Exact counts ended so far, and how long the last one took.
    int64_t counts() const noexcept { return counts_; }
    int64_t took_ms() const noexcept { return took_ms_; }

  private:
    struct Base {
        int64_t pending, balance;
    };
    bool counted_ = false;
    int64_t counted_at_ms_ = 0, took_ms_ = 0, counted_rows_ = 0, counts_ = 0;
    Base outbox_{0, 0};
    std::map<std::string, Base> inbox_;
};

}  // namespace eventbox::metrics
