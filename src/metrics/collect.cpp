// eventbox.metrics(), eventbox.metric_samples() and the rendering they share with the
// supervisor's HTTP endpoint (see metrics/collect.hpp).
#include "metrics/collect.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/snapmgr.h"
}

#include <cstring>
#include <string>
#include <vector>

#include "metrics/exposition.hpp"
#include "outbox/http_relay.hpp"
#include "pg/boundary.hpp"
#include "pg/guc.hpp"
#include "pg/sql_function.hpp"
#include "workers/common.hpp"

namespace eventbox::metrics {

namespace {

constexpr const char* kOutboxQuery =
    "SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 "
    "FROM eventbox.outbox WHERE status = 'pending'";
// The oldest pending row, from the settled position W and outbox_held rather than through the
// view (docs/design/outbox-rotation.md): the first rotated row at or above W that is not held
// (W is the lowest id the relay has not settled, so that row is not acknowledged: no look-up in
// the ack rows, which grow with what was acknowledged above W while W is held), and the first
// held row waiting to be sent. Index probes, no count.
constexpr const char* kOutboxHeadQuery =
    "SELECT -1::int8, coalesce(extract(epoch FROM now() - least("
    "(SELECT r.created_at FROM eventbox._outbox_rows r WHERE r.id >= coalesce("
    "(SELECT s.settled_below FROM eventbox.outbox_state s WHERE s.n = -1), 0) "
    "AND NOT EXISTS (SELECT FROM eventbox.outbox_held h WHERE h.id = r.id) "
    "ORDER BY r.id LIMIT 1), "
    "(SELECT h.created_at FROM eventbox.outbox_held h WHERE h.status = 'pending' "
    "ORDER BY h.id LIMIT 1))), 0)::float8";
// The keys dead messages hold back (on_dead 'block_key'), by key_blocks' primary key.
#define BLOCKED_KEYS                                                            \
    "LATERAL (SELECT count(*) AS keys, coalesce(sum(k.held), 0)::int8 AS held " \
    "FROM eventbox.blocked_keys k WHERE k.subscription = s.name) b ORDER BY s.name"
// The ingest workers that cannot consume the subscription (its rows of subscription_errors).
#define FAILING                                                                            \
    "(SELECT count(*) FROM eventbox.subscription_errors e WHERE e.subscription = s.name) " \
    "AS failing "
// Per subscription, its lane ranges: those of eventbox.inbox_positions, and both ranges of each
// lane it stored offsets for without one (position -1).
#define RANGES                                                                                \
    "(SELECT q.topic, q.\"partition\", q.replay, q.position FROM eventbox.inbox_positions q " \
    "WHERE q.subscription = s.name UNION ALL "                                                \
    "SELECT o.topic, o.\"partition\", m.replay, -1 FROM eventbox.offsets o, "                 \
    "(VALUES (false), (true)) AS m(replay) WHERE o.subscription = s.name AND NOT EXISTS ("    \
    "SELECT FROM eventbox.inbox_positions q WHERE q.subscription = s.name "                   \
    "AND q.topic = o.topic AND q.\"partition\" = o.\"partition\" AND q.replay = m.replay)) p"
// A range's rows still to handle: through inbox_todo_idx from the position (the status is
// tested on the row: the index holds every row), and below it those waiting for a retry,
// through inbox_retry_idx (a position passes them: docs/design/handlers.md, "Left out").
// Messages a read left out behind a waiting or blocked key, or kept without a handler, are
// below the position once it passed them, and not counted (the blocked ones are `held`).
#define RANGE_ROWS(MORE)                                                         \
    "FROM eventbox.inbox i WHERE i.subscription = s.name AND i.topic = p.topic " \
    "AND i.\"partition\" = p.\"partition\" AND (i.mode = 'replay') = p.replay "  \
    "AND i.\"offset\" >= p.position AND i.status IN ('received', 'retry')" MORE
#define RETRIES_BELOW                                                            \
    "FROM eventbox.inbox i WHERE i.subscription = s.name AND i.topic = p.topic " \
    "AND i.\"partition\" = p.\"partition\" AND i.next_attempt_at IS NOT NULL "   \
    "AND (i.mode = 'replay') = p.replay AND i.\"offset\" < p.position "          \
    "AND i.status IN ('received', 'retry')"
constexpr const char* kInboxQuery =
    "SELECT s.name, coalesce(p.n, 0)::int8, "
    "coalesce(extract(epoch FROM now() - p.oldest), 0)::float8, b.keys, b.held, " FAILING
    "FROM eventbox.subscriptions s, LATERAL (SELECT sum(r.n + w.n) AS n, "
    "min(least(r.oldest, w.oldest)) AS oldest FROM " RANGES ", "
    "LATERAL (SELECT count(*) AS n, min(i.received_at) AS oldest " RANGE_ROWS("") ") r, "
    "LATERAL (SELECT count(*) AS n, min(i.received_at) AS oldest " RETRIES_BELOW ") w) p, "
    BLOCKED_KEYS;
// Per subscription, the first message still to handle of each lane range (live and backfill
// range, replay range), and the oldest retry below its position: index probes, no count.
// Messages of a partition are stored in offset order, so its first one waited longest.
constexpr const char* kInboxHeadsQuery =
    "SELECT s.name, -1::int8, coalesce(extract(epoch FROM now() - h.oldest), 0)::float8, "
    "b.keys, b.held, " FAILING
    "FROM eventbox.subscriptions s, LATERAL (SELECT min(least(x.received_at, "
    "(SELECT min(i.received_at) " RETRIES_BELOW "))) AS oldest FROM " RANGES
    " LEFT JOIN LATERAL (SELECT i.received_at " RANGE_ROWS(
        " ORDER BY i.\"offset\" LIMIT 1") ") x ON true) h, " BLOCKED_KEYS;
#undef RANGES
#undef RETRIES_BELOW
#undef RANGE_ROWS
#undef BLOCKED_KEYS
#undef FAILING
constexpr const char* kLagQuery =
    "SELECT subscription, topic, \"partition\", greatest(high_watermark - next_offset, 0) "
    "FROM eventbox.offsets WHERE high_watermark IS NOT NULL "
    "ORDER BY subscription, topic, \"partition\"";

void run(const char* sql) {
    SPIPlanPtr plan = SPI_prepare(sql, 0, nullptr);
    if (plan == nullptr) elog(ERROR, "eventbox metrics: could not prepare \"%s\"", sql);
    worker::exec_kept("eventbox metrics", plan, nullptr, true, SPI_OK_SELECT);
}

Datum column(int row, int col, bool* isnull) {
    return SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, col, isnull);
}

Labels sub_label(const char* name) {
    return Labels{{"subscription", name}};
}

std::vector<double> bounds() {
    return std::vector<double>(kBoundsSeconds, kBoundsSeconds + kBounds);
}

std::vector<uint64_t> counts(const uint64* c) {
    return std::vector<uint64_t>(c, c + kBounds + 1);
}

using T = Type;

// The relay's families and the outbox gauges.
void build_relay(const Counters& s, const Gauges* g, Exposition& e) {
    Family& published = e.family("eventbox_relay_published_total",
                                 "Outbox rows the broker acknowledged.", T::kCounter);
    e.add(published, {}, static_cast<double>(s.published));
    Family& failures = e.family("eventbox_relay_delivery_failures_total",
                                "Failed delivery attempts of outbox rows (each is retried, or "
                                "marked failed when permanent after eventbox.relay_max_attempts).",
                                T::kCounter);
    e.add(failures, {}, static_cast<double>(s.delivery_failures));
    Family& latency =
        e.family("eventbox_relay_publish_latency_seconds",
                 "From an outbox row's created_at (its transaction's now()) to the broker's ack.",
                 T::kHistogram);
    e.add_histogram(latency, {}, bounds(), counts(s.latency_counts),
                    static_cast<double>(s.latency_sum_us) / 1e6);
    if (g != nullptr && g->valid) {
        Family& pending =
            e.family("eventbox_outbox_pending", "Outbox rows waiting to be published.", T::kGauge);
        e.add(pending, {}, static_cast<double>(g->outbox_pending));
        Family& age = e.family("eventbox_outbox_oldest_pending_age_seconds",
                               "Age of the oldest outbox row waiting (0 when none).", T::kGauge);
        e.add(age, {}, g->outbox_oldest_age_s);
    }
}

// The ingest and handler counters, per subscription.
void build_subscriptions(const Counters& s, Exposition& e) {
    struct Counter {
        const char* name;
        const char* help;
        uint64 SubscriptionCounters::*field;
    };
    static const Counter kCounters[] = {
        {"eventbox_ingest_records_total",
         "Kafka records the ingest workers read and committed (stored or deduplicated).",
         &SubscriptionCounters::records},
        {"eventbox_ingest_duplicates_total",
         "Records whose message id was in the inbox already (not stored again).",
         &SubscriptionCounters::duplicates},
        {"eventbox_ingest_transport_id_fallbacks_total",
         "Records without a message id, identified by topic/partition/offset.",
         &SubscriptionCounters::transport_ids},
        {"eventbox_ingest_unparsable_total", "Records whose value is not JSON (status unparsable).",
         &SubscriptionCounters::unparsable},
        {"eventbox_ingest_conflicts_total",
         "Duplicates whose payload differs from the stored row's (see eventbox.conflicts).",
         &SubscriptionCounters::conflicts},
        {"eventbox_ingest_redelivered_total",
         "RabbitMQ deliveries flagged redelivered (delivered before, perhaps stored: not a "
         "duplicate count).",
         &SubscriptionCounters::redelivered},
        {"eventbox_ingest_skipped_total",
         "Records not stored as messages: Debezium tombstones and CockroachDB resolved "
         "timestamps (message_id_rule 'debezium' or 'cockroachdb'); their offsets are stored.",
         &SubscriptionCounters::skipped},
        {"eventbox_handler_processed_total", "Messages whose handlers succeeded.",
         &SubscriptionCounters::processed},
        {"eventbox_handler_retries_total", "Failed handler attempts followed by a retry (backoff).",
         &SubscriptionCounters::retried},
        {"eventbox_handler_dead_total", "Messages set dead after their last attempt.",
         &SubscriptionCounters::dead},
        {"eventbox_handler_ignored_total", "Messages no registered handler takes (ignored).",
         &SubscriptionCounters::ignored},
    };
    for (const Counter& c : kCounters) {
        Family& f = e.family(c.name, c.help, T::kCounter);
        for (int i = 0; i < s.n_subscriptions; ++i)
            e.add(f, sub_label(s.subscriptions[i].name),
                  static_cast<double>(s.subscriptions[i].*c.field));
    }
    Family& uncommitted =
        e.family("eventbox_ingest_group_uncommitted",
                 "Membership 'group': offsets stored here and not yet acknowledged by the Kafka "
                 "group (what another server could handle again if this one stopped now).",
                 T::kGauge);
    for (int i = 0; i < s.n_subscriptions; ++i)
        e.add(uncommitted, sub_label(s.subscriptions[i].name),
              static_cast<double>(static_cast<int64>(s.subscriptions[i].group_uncommitted)));
    Family& duration = e.family("eventbox_handler_duration_seconds",
                                "Time spent in a message's handlers (per attempt).", T::kHistogram);
    for (int i = 0; i < s.n_subscriptions; ++i)
        e.add_histogram(duration, sub_label(s.subscriptions[i].name), bounds(),
                        counts(s.subscriptions[i].duration_counts),
                        static_cast<double>(s.subscriptions[i].duration_sum_us) / 1e6);
    Family& e2e = e.family("eventbox_e2e_seconds",
                           "Time from an inbox message's received_at to the acknowledgement of a "
                           "message its handlers sent (broker ack, HTTP 2xx, RabbitMQ confirm), "
                           "per message sent.",
                           T::kHistogram);
    for (int i = 0; i < s.n_subscriptions; ++i)
        e.add_histogram(e2e, sub_label(s.subscriptions[i].name), bounds(),
                        counts(s.subscriptions[i].e2e_counts),
                        static_cast<double>(s.subscriptions[i].e2e_sum_us) / 1e6);
}

// The inbox gauges (read from the tables), per subscription and per partition.
void build_inbox_gauges(const Gauges& g, Exposition& e) {
    Family& pending =
        e.family("eventbox_inbox_pending",
                 "Inbox messages waiting to be handled (received or retry).", T::kGauge);
    Family& age = e.family("eventbox_inbox_oldest_pending_age_seconds",
                           "Age (since received) of the oldest inbox message waiting.", T::kGauge);
    for (int i = 0; i < g.n_inbox; ++i) {
        e.add(pending, sub_label(g.inbox[i].subscription), static_cast<double>(g.inbox[i].pending));
        e.add(age, sub_label(g.inbox[i].subscription), g.inbox[i].oldest_age_s);
    }
    Family& blocked = e.family("eventbox_blocked_keys",
                               "Keys whose later messages a dead message holds back "
                               "(on_dead 'block_key'), until it is processed or skipped.",
                               T::kGauge);
    Family& held = e.family("eventbox_held_messages",
                            "Messages waiting behind a dead message of their key "
                            "(on_dead 'block_key').",
                            T::kGauge);
    for (int i = 0; i < g.n_inbox; ++i) {
        e.add(blocked, sub_label(g.inbox[i].subscription),
              static_cast<double>(g.inbox[i].blocked_keys));
        e.add(held, sub_label(g.inbox[i].subscription), static_cast<double>(g.inbox[i].held));
    }
    Family& failing = e.family("eventbox_subscription_errors",
                               "Ingest workers that cannot consume the subscription (its rows "
                               "of eventbox.subscription_errors; 0 when it is consumed).",
                               T::kGauge);
    for (int i = 0; i < g.n_inbox; ++i)
        e.add(failing, sub_label(g.inbox[i].subscription),
              static_cast<double>(g.inbox[i].failing_workers));
    Family& lag = e.family("eventbox_ingest_lag",
                           "Broker high watermark minus the stored next offset, per partition "
                           "(as last seen by the ingest workers).",
                           T::kGauge);
    for (int i = 0; i < g.n_lag; ++i)
        e.add(lag,
              Labels{{"subscription", g.lag[i].subscription},
                     {"topic", g.lag[i].topic},
                     {"partition", std::to_string(g.lag[i].partition)}},
              static_cast<double>(g.lag[i].lag));
}

// The endpoint's own counts, the workers' restarts, retention and the counters' overflow.
void build_upkeep(const Counters& s, const Gauges* g, Exposition& e) {
    if (g != nullptr && g->valid && g->counts > 0) {
        Family& counts = e.family(
            "eventbox_metrics_pending_counts_total",
            "Exact counts of the pending rows behind this endpoint's pending gauges (between "
            "them, a gauge is the last count plus what the workers added and settled since).",
            T::kCounter);
        e.add(counts, {}, static_cast<double>(g->counts));
        Family& took = e.family("eventbox_metrics_pending_count_seconds",
                                "How long the last exact count took (the next one runs at "
                                "least 200 times that later, and at most a second later).",
                                T::kGauge);
        e.add(took, {}, g->count_seconds);
    }
    Family& restarts = e.family("eventbox_worker_restarts_total",
                                "Workers found dead and started again, per role.", T::kCounter);
    for (int r = 0; r < kWorkerRoles; ++r)
        e.add(restarts, Labels{{"role", kWorkerRoleNames[r]}}, static_cast<double>(s.restarts[r]));
    Family& purged = e.family("eventbox_retention_purged_rows_total",
                              "Rows deleted by retention (eventbox.inbox_retention, "
                              "eventbox.dead_retention, eventbox.outbox_retention).",
                              T::kCounter);
    e.add(purged, Labels{{"table", "inbox"}}, static_cast<double>(s.purged_inbox));
    e.add(purged, Labels{{"table", "outbox"}}, static_cast<double>(s.purged_outbox));
    Family& overflow =
        e.family("eventbox_metrics_subscriptions_overflowed_total",
                 "Counts added to the overflow entry (subscription=\"\") because the table of "
                 "per-subscription counters was full.",
                 T::kCounter);
    e.add(overflow, {}, static_cast<double>(s.overflowed));
}

// Builds the families (pure C++: only reads the plain data it is given).
void build(const Counters& s, const Gauges* g, Exposition& e) {
    build_relay(s, g, e);
    build_subscriptions(s, e);
    if (g != nullptr && g->valid) build_inbox_gauges(*g, e);
    build_upkeep(s, g, e);
    http_relay::add_families(e);
}

// Counters and gauges of the calling session (SQL functions): gauges need the extension's
// tables, read with the caller's privileges. They are kept in the caller's memory: SPI's own
// is freed by SPI_finish(), before the text is built from them.
void collect_here(Counters* s, Gauges* g) {
    MemoryContext caller = CurrentMemoryContext;
    snapshot(s);
    memset(g, 0, sizeof *g);
    if (SPI_connect() != SPI_OK_CONNECT) elog(ERROR, "eventbox metrics: SPI_connect failed");
    query_gauges(g, caller, GaugeCost::kCounted);
    SPI_finish();
}

}  // namespace

void query_gauges(Gauges* out, MemoryContext context, GaugeCost cost) {
    memset(out, 0, sizeof *out);
    bool counted = cost == GaugeCost::kCounted;
    bool isnull;
    run(counted ? kOutboxQuery : kOutboxHeadQuery);
    out->outbox_pending = DatumGetInt64(column(0, 1, &isnull));
    out->outbox_oldest_age_s = DatumGetFloat8(column(0, 2, &isnull));

    run(counted ? kInboxQuery : kInboxHeadsQuery);
    int n = static_cast<int>(SPI_processed);
    out->inbox =
        static_cast<InboxGauge*>(MemoryContextAllocZero(context, sizeof(InboxGauge) * Max(n, 1)));
    for (int i = 0; i < n; ++i) {
        text_to_cstring_buffer(DatumGetTextPP(column(i, 1, &isnull)), out->inbox[i].subscription,
                               NAMEDATALEN);
        out->inbox[i].pending = DatumGetInt64(column(i, 2, &isnull));
        out->inbox[i].oldest_age_s = DatumGetFloat8(column(i, 3, &isnull));
        out->inbox[i].blocked_keys = DatumGetInt64(column(i, 4, &isnull));
        out->inbox[i].held = DatumGetInt64(column(i, 5, &isnull));
        out->inbox[i].failing_workers = DatumGetInt64(column(i, 6, &isnull));
    }
    out->n_inbox = n;

    run(kLagQuery);
    n = static_cast<int>(SPI_processed);
    out->lag =
        static_cast<LagGauge*>(MemoryContextAllocZero(context, sizeof(LagGauge) * Max(n, 1)));
    for (int i = 0; i < n; ++i) {
        text_to_cstring_buffer(DatumGetTextPP(column(i, 1, &isnull)), out->lag[i].subscription,
                               NAMEDATALEN);
        out->lag[i].topic =
            MemoryContextStrdup(context, TextDatumGetCString(column(i, 2, &isnull)));
        out->lag[i].partition = DatumGetInt32(column(i, 3, &isnull));
        out->lag[i].lag = DatumGetInt64(column(i, 4, &isnull));
    }
    out->n_lag = n;
    out->valid = true;
}

const char* session_database_label() {
    if (guc::database == nullptr || strchr(guc::database, ',') == nullptr) return nullptr;
    return get_database_name(MyDatabaseId);
}

char* render(const Counters& counters, const Gauges* gauges, size_t* len, const char* database) {
    char* out = nullptr;
    size_t size = 0;
    pg::call_cpp([&] {
        Exposition e;
        build(counters, gauges, e);
        if (database != nullptr) e.label_all("database", database);
        std::string text = e.render();
        out = static_cast<char*>(pg::pg_guard([&] { return palloc(text.size() + 1); }));
        memcpy(out, text.c_str(), text.size() + 1);
        size = text.size();
    });
    *len = size;
    return out;
}

}  // namespace eventbox::metrics

// eventbox.metrics(): the Prometheus text exposition (format 0.0.4).
EVENTBOX_SQL_FUNCTION(eventbox_metrics) {
    (void)fcinfo;
    using namespace eventbox::metrics;
    Counters counters;
    Gauges gauges;
    collect_here(&counters, &gauges);
    size_t len;
    char* text = render(counters, &gauges, &len, session_database_label());
    PG_RETURN_TEXT_P(cstring_to_text_with_len(text, static_cast<int>(len)));
}

namespace {

// One sample of the exposition as plain data, for the SRF below.
struct Row {
    char* name;
    char* labels_json;
    double value;
};

}  // namespace

// eventbox.metric_samples(): every sample as (name, labels jsonb, value); the view
// eventbox.metrics selects it.
EVENTBOX_SQL_FUNCTION(eventbox_metric_samples) {
    using namespace eventbox::metrics;
    ReturnSetInfo* rsinfo = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
    InitMaterializedSRF(fcinfo, 0);
    Counters counters;
    Gauges gauges;
    collect_here(&counters, &gauges);
    const char* database = session_database_label();
    int n_rows = 0;
    Row* rows = nullptr;
    eventbox::pg::call_cpp([&] {
        Exposition e;
        build(counters, &gauges, e);
        if (database != nullptr) e.label_all("database", database);
        std::size_t total = 0;
        for (const Family& f : e.families()) total += f.samples.size();
        rows = static_cast<Row*>(
            eventbox::pg::pg_guard([&] { return palloc0(sizeof(Row) * (total + 1)); }));
        for (const Family& f : e.families())
            for (const Sample& s : f.samples) {
                std::string json = labels_json(s.labels);
                Row& r = rows[n_rows++];
                r.name = eventbox::pg::pg_guard([&] { return pstrdup(s.name.c_str()); });
                r.labels_json = eventbox::pg::pg_guard([&] { return pstrdup(json.c_str()); });
                r.value = s.value;
            }
    });
    for (int i = 0; i < n_rows; ++i) {
        Datum values[3] = {CStringGetTextDatum(rows[i].name),
                           DirectFunctionCall1(jsonb_in, CStringGetDatum(rows[i].labels_json)),
                           Float8GetDatum(rows[i].value)};
        bool nulls[3] = {false, false, false};
        tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
    }
    return (Datum)0;
}
