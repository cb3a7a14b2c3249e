// The ingest worker's reload: brings its consumer and subscriptions in line with the
// subscriptions table, the stored offsets and eventbox.ingest_errors (see inbox/ingest.hpp).
#include "inbox/ingest.hpp"

extern "C" {
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "utils/builtins.h"
}

#include <algorithm>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kafka/options.hpp"
#include "metrics/counters.hpp"
#include "pg/arrays.hpp"
#include "pg/boundary.hpp"
#include "pg/guc.hpp"
#include "pg/shmem.hpp"

namespace eventbox::ingest {

using pg::call_cpp;

// ---- the consumer and the subscription list ---------------------------------------------------

void IngestState::make_lists() {
    if (wanted_ == nullptr) wanted_ = call_cpp([] { return new std::vector<Wanted>(); });
    if (subscriptions_ == nullptr)
        subscriptions_ = call_cpp([] { return new std::vector<Subscription*>(); });
}

void IngestState::build_consumer(int member, int members) {
    // The group.instance.id base of the 'group' subscriptions: the cluster's system identifier
    // (stable across restarts, distinct between servers), the database's oid and the worker.
    char base[64];
    snprintf(base, sizeof base, UINT64_FORMAT ".%u.%d", GetSystemIdentifier(), MyDatabaseId,
             member);
    const char* instance_base = base;
    // A consumer built for other brokers or another share of the partitions starts over.
    bool rebuild = call_cpp([&] {
        std::string fingerprint = std::string(guc::brokers) + "|" + std::to_string(members);
        bool changed = consumer_ != nullptr && fingerprint != consumer_fingerprint_;
        consumer_fingerprint_ = fingerprint;
        return changed;
    });
    if (rebuild) start_over();
    if (consumer_ != nullptr) return;
    consumer_ = call_cpp([&] {
        kafka::ConsumerConfig config;
        config.brokers = guc::brokers;
        config.options = parse_kafka_options(guc::kafka_options ? guc::kafka_options : "");
        config.member = member;
        config.members = members;
        config.group_id = "pg_eventbox-ingest";
        config.instance_base = instance_base;
        consumer_fingerprint_ = std::string(guc::brokers) + "|" + std::to_string(members);
        return new kafka::Consumer(config);
    });
}

// ---- the subscriptions table --------------------------------------------------------------------

void IngestState::add_wanted(const WantedRow& row) {
    call_cpp([&] {
        Wanted w;
        w.name = row.name;
        w.group_id = row.group_id[0] ? std::string(row.group_id)
                                     : "eventbox." + std::string(row.database) + "." + row.name;
        w.message_id_field = row.message_id_field;
        w.start_latest = std::string_view(row.start_from) == "latest";
        w.created_ms = row.created_ms;
        w.batch_size = row.batch_size;
        w.id_rule = inbox::id_rule_named(row.message_id_rule);
        w.keep_raw = inbox::keeps_raw(
            inbox::RawNeeds{row.keep_raw, row.dead_letter_topic, !row.registry_format});
        w.backfill = row.backfill;
        std::string list = row.topics;
        for (std::size_t start = 0; start <= list.size();) {
            std::size_t comma = list.find(',', start);
            if (comma == std::string::npos) comma = list.size();
            w.topics.push_back(list.substr(start, comma - start));
            start = comma + 1;
        }
        w.fingerprint = list + "|" + w.group_id + "|" + row.start_from + "|" +
                        row.message_id_field + "|" + std::to_string(row.batch_size) + "|" +
                        row.message_id_rule + (row.backfill ? "|backfill" : "") +
                        (row.registry_format ? "|registry" : "") +
                        (row.registry_keys ? "|registry-keys" : "");
        w.registry_format = row.registry_format;
        w.registry_keys = row.registry_keys;
        w.group = row.group;
        if (w.group) w.fingerprint += "|group";
        wanted_->push_back(std::move(w));
    });
}

char* text_at(HeapTuple tuple, TupleDesc desc, int column) {
    bool isnull;
    Datum d = SPI_getbinval(tuple, desc, column, &isnull);
    return isnull ? pstrdup("") : TextDatumGetCString(d);
}

namespace {

// Reads the enabled subscriptions into the wanted list (inside a transaction).
void read_wanted() {
    int rc = SPI_execute(
        "SELECT name, array_to_string(topics, ','), coalesce(group_id, ''), start_from, "
        "coalesce(message_id_field, ''), batch_size, "
        "(extract(epoch FROM created_at) * 1000)::int8, message_id_rule, "
        "backfill, keep_raw, dead_letter_topic IS NOT NULL, value_format = 'registry', "
        "key_format = 'registry', membership = 'group' "
        "FROM eventbox.subscriptions "
        "WHERE enabled AND source = 'kafka' ORDER BY name",
        true, 0);
    if (rc != SPI_OK_SELECT) elog(ERROR, "eventbox ingest: reading subscriptions failed");
    state.clear_wanted();
    char* database = get_database_name(MyDatabaseId);
    for (uint64 i = 0; i < SPI_processed; ++i) {
        HeapTuple tuple = SPI_tuptable->vals[i];
        TupleDesc desc = SPI_tuptable->tupdesc;
        bool isnull;
        WantedRow row;
        row.name = text_at(tuple, desc, 1);
        row.topics = text_at(tuple, desc, 2);
        row.group_id = text_at(tuple, desc, 3);
        row.start_from = text_at(tuple, desc, 4);
        row.message_id_field = text_at(tuple, desc, 5);
        row.database = database;
        row.batch_size = DatumGetInt32(SPI_getbinval(tuple, desc, 6, &isnull));
        row.created_ms = DatumGetInt64(SPI_getbinval(tuple, desc, 7, &isnull));
        row.message_id_rule = text_at(tuple, desc, 8);
        row.backfill = DatumGetBool(SPI_getbinval(tuple, desc, 9, &isnull));
        row.keep_raw = DatumGetBool(SPI_getbinval(tuple, desc, 10, &isnull));
        row.dead_letter_topic = DatumGetBool(SPI_getbinval(tuple, desc, 11, &isnull));
        row.registry_format = DatumGetBool(SPI_getbinval(tuple, desc, 12, &isnull));
        row.registry_keys = DatumGetBool(SPI_getbinval(tuple, desc, 13, &isnull));
        row.group = DatumGetBool(SPI_getbinval(tuple, desc, 14, &isnull));
        state.add_wanted(row);
    }
}

}  // namespace

void IngestState::drop_unwanted(int64 now) {
    call_cpp([&] {
        std::vector<Subscription*> keep;
        for (Subscription* s : *subscriptions_) {
            bool still = false;
            for (const Wanted& w : *wanted_)
                if (w.name == s->name && w.fingerprint == s->fingerprint) still = true;
            if (still) {
                keep.push_back(s);
            } else {
                consumer_->remove_subscription(s->id);
                metrics::group_uncommitted(s->name.c_str(), -s->reported_uncommitted);
                delete s;
            }
        }
        *subscriptions_ = std::move(keep);
        for (Subscription* s : *subscriptions_) {
            s->options.max_message_bytes = static_cast<std::size_t>(guc::max_message_bytes);
            for (const Wanted& w : *wanted_)
                if (w.name == s->name) s->options.keep_raw = w.keep_raw;
            if (s->failing && consumer_->paused(s->id) && now >= s->retry_at_ms) s->fresh = true;
            // Its schema arrived: read again from its stored offsets.
            if (s->schema_ready) {
                s->schema_ready = false;
                s->fresh = true;
            }
        }
    });
}

std::size_t IngestState::start_wanted() {
    return call_cpp([&] {
        for (const Wanted& w : *wanted_) {
            bool running = false;
            for (Subscription* s : *subscriptions_)
                if (s->name == w.name) running = true;
            if (running) continue;
            // Paused until its stored offsets are read.
            auto* s = new Subscription();
            s->name = w.name;
            s->fingerprint = w.fingerprint;
            s->options.message_id_field = w.message_id_field;
            s->options.id_rule = w.id_rule;
            s->options.keep_raw = w.keep_raw;
            s->options.max_message_bytes = static_cast<std::size_t>(guc::max_message_bytes);
            s->batch_size = static_cast<std::size_t>(w.batch_size);
            kafka::SubscriptionConfig config;
            config.name = w.name;
            config.group_id = w.group_id;
            config.topics = w.topics;
            config.start_latest = w.start_latest;
            config.latest_since_ms = w.created_ms;
            config.backfill = w.backfill;
            config.group = w.group;
            s->group = w.group;
            s->backfill = w.backfill;
            s->registry_format = w.registry_format;
            s->registry_keys = w.registry_keys;
            s->id = consumer_->add_subscription(config);
            subscriptions_->push_back(s);
        }
        return wanted_->size();
    });
}

// ---- stored offsets -----------------------------------------------------------------------------

struct IngestState::Offsets {
    std::map<std::string, Subscription*> by_name;
    std::vector<Subscription*> moved;
};

void IngestState::begin_offsets() {
    end_offsets();
    offsets_ = call_cpp([&] {
        auto* o = new Offsets();
        for (Subscription* s : *subscriptions_) o->by_name[s->name] = s;
        return o;
    });
}

void IngestState::stored_offset(const char* subscription, const char* topic, int32 partition,
                                int64 next, int64 backfill_until) {
    call_cpp([&] {
        auto it = offsets_->by_name.find(subscription);
        if (it == offsets_->by_name.end()) return;
        Subscription* s = it->second;
        if (s->fresh) {
            if (!consumer_->paused(s->id)) consumer_->pause(s->id);
            consumer_->set_stored_offset(s->id, topic, partition, next, backfill_until);
        } else if (!consumer_->paused(s->id) &&
                   consumer_->set_stored_offset(s->id, topic, partition, next) &&
                   (offsets_->moved.empty() || offsets_->moved.back() != s)) {
            offsets_->moved.push_back(s);
        }
    });
}

Subscription* IngestState::seek_moved(std::size_t k) {
    return call_cpp([&]() -> Subscription* {
        if (k >= offsets_->moved.size()) return nullptr;
        Subscription* s = offsets_->moved[k];
        consumer_->seek_to_stored(s->id);
        return s;
    });
}

void IngestState::end_offsets() noexcept {
    delete offsets_;
    offsets_ = nullptr;
}

bool IngestState::resume(Subscription* sub, int64 now) {
    return call_cpp([&] {
        if (!consumer_->paused(sub->id)) consumer_->pause(sub->id);  // no stored offsets
        consumer_->resume(sub->id);
        sub->fresh = false;
        sub->resumed_at_ms = now;
        return sub->failing;
    });
}

namespace {

// Every subscription's stored offsets at once (a reload reads them all). Index: none; a
// sequential scan of the whole table, one row per lane of every subscription, once per reload.
worker::KeptStatement stored_statement{
    "SELECT subscription, topic, \"partition\", next_offset, "
    "coalesce(backfill_until, -1) FROM eventbox.offsets",
    0,
    {},
    nullptr};

// Stored offsets: the source of every fresh subscription's positions; a running one whose
// offsets differ from what it stored was moved (eventbox.replay) and continues from there.
void apply_stored_offsets() {
    worker::exec_kept(kWho, stored_statement, nullptr, true, SPI_OK_SELECT);
    state.begin_offsets();
    for (uint64 r = 0; r < SPI_processed; ++r) {
        HeapTuple tuple = SPI_tuptable->vals[r];
        TupleDesc desc = SPI_tuptable->tupdesc;
        bool isnull;
        char* name = text_at(tuple, desc, 1);
        char* topic = text_at(tuple, desc, 2);
        int32 partition = DatumGetInt32(SPI_getbinval(tuple, desc, 3, &isnull));
        int64 next = DatumGetInt64(SPI_getbinval(tuple, desc, 4, &isnull));
        int64 until = DatumGetInt64(SPI_getbinval(tuple, desc, 5, &isnull));
        state.stored_offset(name, topic, partition, next, until);
        pfree(name);
        pfree(topic);
    }
    for (std::size_t k = 0;; ++k) {
        Subscription* sub = state.seek_moved(k);
        if (sub == nullptr) break;
        log_subscription(
            "eventbox ingest: subscription \"%s\" continues from its changed "
            "stored offsets%s",
            sub->name.c_str(), "");
    }
    state.end_offsets();
}

// Fresh subscriptions (new, or failing ones whose retry is due) start from those offsets.
void resume_fresh(int64 now) {
    for (std::size_t k = 0; k < state.count(); ++k) {
        Subscription* sub = state.at(k);
        if (!sub->fresh) continue;
        if (!state.resume(sub, now))
            log_subscription(
                "eventbox ingest: consuming subscription \"%s\"%s", sub->name.c_str(),
                members > 1 ? psprintf(" (worker %d of %d)", member + 1, members) : "");
    }
}

}  // namespace

// ---- eventbox.ingest_errors ---------------------------------------------------------------------

int IngestState::count_recorded() const noexcept {
    int n = 0;
    for (Subscription* s : *subscriptions_) n += s->recorded.empty() ? 0 : 1;
    return n;
}

namespace {

// Rows this worker no longer stands behind (after a restart, a change or a drop), and those of
// workers that no longer run. Index: ingest_errors_pkey, walked whole (worker is its second
// column); the table holds a row per failing subscription and worker at most.
worker::KeptStatement errors_sync_statement{
    "DELETE FROM eventbox.ingest_errors WHERE (worker = $1 AND subscription <> ALL ($2)) "
    "OR worker >= $3",
    3,
    {INT4OID, TEXTARRAYOID, INT4OID},
    nullptr};

// eventbox.ingest_errors: only rows of the subscriptions this worker sees failing (Kafka's
// and RabbitMQ's).
void sync_error_rows() {
    int n_kafka = state.count_recorded();
    int n_amqp = amqp_count_recorded();
    pg::ArrayColumn names(n_kafka + n_amqp, TEXTOID);
    int j = 0;
    for (std::size_t k = 0; k < state.count(); ++k) {
        Subscription* sub = state.at(k);
        if (!sub->recorded.empty() && j < n_kafka)
            names.set(j++, CStringGetTextDatum(sub->name.c_str()));
    }
    const char** amqp_names = static_cast<const char**>(palloc0(sizeof(char*) * (n_amqp + 1)));
    int got = amqp_recorded(amqp_names, n_amqp);
    for (int k = 0; k < got; ++k) names.set(j++, CStringGetTextDatum(amqp_names[k]));
    Datum values[3] = {Int32GetDatum(member), names.get(j), Int32GetDatum(members)};
    worker::exec_kept(kWho, errors_sync_statement, values, false, SPI_OK_DELETE);
}

// ---- the reload ---------------------------------------------------------------------------------

bool announced_idle = false;

// No brokers: no consumer, no subscriptions, said once.
void go_idle() {
    state.start_over();
    if (!announced_idle)
        ereport(LOG, (errmsg("eventbox ingest idle: eventbox.brokers is empty"),
                      errhint("Set eventbox.brokers and reload the configuration.")));
    announced_idle = true;
    shmem::set_state("idle: no brokers");
}

}  // namespace

int wait_set_amqp_fd = -1;

void rebuild_wait_set() {
    if (wait_set != nullptr) FreeWaitEventSet(wait_set);
    wait_set = CreateWaitEventSet(TopMemoryContext, 4);
    AddWaitEventToSet(wait_set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, nullptr);
    AddWaitEventToSet(wait_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, nullptr, nullptr);
    if (state.has_consumer())
        AddWaitEventToSet(wait_set, WL_SOCKET_READABLE, state.event_fd(), nullptr, nullptr);
    wait_set_amqp_fd = amqp_fd();
    if (wait_set_amqp_fd >= 0)
        AddWaitEventToSet(wait_set, WL_SOCKET_READABLE, wait_set_amqp_fd, nullptr, nullptr);
}

void reload() {
    state.make_lists();
    members = guc::ingest_workers;
    loaded_generation = shmem::subscriptions_generation();
    bool kafka = guc::brokers[0] != '\0';
    if (kafka) {
        announced_idle = false;
        state.build_consumer(member, members);
    } else {
        go_idle();
    }

    worker::begin_work(kWho);
    int64 now = worker::now_ms();
    std::size_t n_wanted = 0;
    if (kafka) {
        read_wanted();
        state.drop_unwanted(now);
        n_wanted = state.start_wanted();
        state.configure_registry();
        apply_stored_offsets();
        resume_fresh(now);
    }
    // RabbitMQ subscriptions (source 'amqp'), whether or not Kafka brokers are set.
    std::size_t n_amqp = amqp_reload(now);
    sync_error_rows();
    worker::end_work();

    if (kafka) round_size = state.largest_batch_size();
    if (kafka || n_amqp > 0)
        shmem::set_state(n_wanted + n_amqp ? "running" : "idle: no subscriptions");
    rebuild_wait_set();
}

}  // namespace eventbox::ingest
