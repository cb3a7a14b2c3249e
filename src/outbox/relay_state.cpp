// The relay's C++ objects behind their PostgreSQL-side facades (see outbox/relay_worker.hpp):
// every call that can throw or allocate runs inside pg::call_cpp().
#include "outbox/relay_worker.hpp"

extern "C" {
#include "storage/procarray.h"
}

#include <algorithm>
#include <string>

#include "kafka/options.hpp"
#include "messages/message_rules.hpp"
#include "outbox/amqp_relay.hpp"
#include "outbox/http_relay.hpp"
#include "pg/boundary.hpp"
#include "pg/guc.hpp"
#include "pg/shmem.hpp"
#include "workers/common.hpp"

namespace eventbox::relay_worker {

using pg::call_cpp;
using pg::pg_guard;

PgProducer producer;
PgHttpClient http_client;
PgAmqp amqp_publisher;
PgDispatcher dispatcher;
PgRechecks rechecks;

namespace {

// librdkafka's linger.ms for the relay's producer: long enough to gather what a pass produces
// into one request per partition leader, no longer. The pass itself is what batches: it waits
// up to eventbox.relay_linger for rows (pace_passes()). Until 0.6.0 the producer lingered
// relay_linger as well, so a row waited up to twice that, and halving the passes needed a
// longer wait (bench/NOTEBOOK.md, 2026-11-29, "one wait, not two"). eventbox.kafka_options can
// set linger.ms all the same.
constexpr int kProducerLingerMs = 1;

}  // namespace

void PgProducer::create() {
    producer_ = call_cpp([] {
        kafka::ProducerConfig config;
        config.brokers = guc::brokers;
        config.options = parse_kafka_options(guc::kafka_options ? guc::kafka_options : "");
        config.message_timeout_ms = guc::relay_message_timeout_ms;
        config.linger_ms = std::min(guc::relay_linger_ms, kProducerLingerMs);
        config.max_in_flight_messages = guc::relay_max_in_flight;
        config.max_message_bytes = guc::max_message_bytes;
        return new kafka::Producer(config);
    });
}

void PgProducer::poll() {
    call_cpp([&] { producer_->poll(); });
}

bool PgProducer::fatal() const {
    return call_cpp([&] { return producer_->fatal(); });
}

void PgHttpClient::load(std::size_t queue_limit) {
    if (fingerprint_ != nullptr) pfree(fingerprint_);
    fingerprint_ = nullptr;
    relay::RouteStamp loaded;
    client_ = http_relay::load_client(queue_limit, &loaded, &fingerprint_);
    version_.loaded(loaded);
}

bool PgHttpClient::changed() const {
    return version_.moved(http_relay::generation());
}

void PgHttpClient::before_snapshot() {
    before_snapshot_ = http_relay::stamp();
}

bool PgHttpClient::current(bool recheck) {
    // Read after the snapshot: every change the snapshot shows has moved it.
    if (!recheck && version_.current(http_relay::generation())) return true;
    char* now = http_relay::fingerprint();
    bool same = fingerprint_ != nullptr && strcmp(now, fingerprint_) == 0;
    pfree(now);
    if (same) version_.confirmed(before_snapshot_);
    return same;
}

void PgAmqp::load(std::size_t queue_limit) {
    publisher_ = amqp_relay::load_publisher(queue_limit);
}

void PgDispatcher::create(PgProducer& producer, PgHttpClient& http, PgAmqp& amqp) {
    call_cpp([&] {
        relay::Limits limits;
        limits.max_in_flight = static_cast<std::size_t>(guc::relay_max_in_flight);
        limits.max_waiting = limits.max_in_flight * 10;
        limits.backoff_ms = guc::relay_retry_backoff_ms;
        limits.backoff_max_ms = guc::relay_retry_backoff_max_ms;
        limits.max_attempts = guc::relay_max_attempts;
        relay::Sink* kafka = producer.producer_;
        if (kafka == nullptr) kafka = no_kafka_ = new relay::NoKafka();
        kafka = with_formats(kafka);
        if (http.client_ != nullptr) router_ = new http::Router(*kafka, *http.client_);
        relay::Sink* sink = kafka;
        if (router_ != nullptr) sink = router_;
        if (amqp.publisher_ != nullptr)
            sink = amqp_router_ = new amqp::Router(*sink, *amqp.publisher_);
        dispatcher_ = new relay::Dispatcher(*sink, limits);
    });
}

std::size_t PgDispatcher::take_unrouted(char** topic) {
    std::size_t n = dispatcher_->unrouted();
    *topic = nullptr;
    if (n == 0) return 0;
    call_cpp([&] {
        std::string shown = printable(dispatcher_->unrouted_topic());
        *topic = static_cast<char*>(pg_guard([&] { return pstrdup(shown.c_str()); }));
        dispatcher_->forget_unrouted();
    });
    return n;
}

void PgDispatcher::offer(const relay::Row& row, int64 now) {
    call_cpp([&] { dispatcher_->offer(row, now); });
}

void PgDispatcher::take_deliveries(PgProducer& producer) {
    call_cpp([&] {
        int64_t now = worker::now_ms();
        for (const kafka::Delivery& d : producer.producer_->deliveries())
            dispatcher_->on_delivery(d.id, d.err, d.permanent, d.counts, d.partition, d.offset,
                                     d.error, now);
        producer.producer_->deliveries().clear();
    });
}

void PgDispatcher::take_http_outcomes(PgHttpClient& http) {
    http_relay::take_outcomes(*http.client_, *dispatcher_);
}

void PgDispatcher::take_amqp_outcomes(PgAmqp& amqp) {
    amqp_relay::take_outcomes(*amqp.publisher_, *dispatcher_);
}

int64* PgDispatcher::due_ids(int64 now, std::size_t max, int* n) {
    int64* ids = nullptr;
    *n = 0;
    call_cpp([&] {
        const std::vector<int64_t>& due = dispatcher_->due_ids(now, max);
        *n = static_cast<int>(due.size());
        if (due.empty()) return;
        ids = static_cast<int64*>(pg_guard([&] { return palloc(sizeof(int64) * due.size()); }));
        std::copy(due.begin(), due.end(), ids);
    });
    return ids;
}

void PgDispatcher::refetch_done() {
    call_cpp([&] { dispatcher_->refetch_done(); });
}

void PgDispatcher::clear_outcomes(std::size_t n_acked, std::size_t n_failed, std::size_t n_hold) {
    call_cpp([&] { dispatcher_->clear_outcomes(n_acked, n_failed, n_hold); });
}

std::size_t PgDispatcher::hold_stale() {
    return call_cpp([&] { return dispatcher_->hold_stale(); });
}

void PgRechecks::create() {
    call_cpp([&] {
        rechecks_ = new relay::Rechecks();
        writers_ = new std::vector<uint32_t>();
        scan_ids_ = new std::vector<int64_t>();
    });
}

namespace {

bool xid_running(uint32_t xid) {
    return pg_guard([&] { return TransactionIdIsInProgress(static_cast<TransactionId>(xid)); });
}

}  // namespace

relay::IdRange* PgRechecks::begin_pass(int* n) {
    relay::IdRange* ranges = nullptr;
    *n = 0;
    call_cpp([&] {
        const std::vector<relay::IdRange>& pass = rechecks_->begin_pass(xid_running);
        *n = static_cast<int>(pass.size());
        if (pass.empty()) return;
        ranges = static_cast<relay::IdRange*>(
            pg_guard([&] { return palloc(sizeof(relay::IdRange) * pass.size()); }));
        std::copy(pass.begin(), pass.end(), ranges);
    });
    return ranges;
}

void PgRechecks::end_pass(int fully_read) {
    call_cpp([&] { rechecks_->end_pass(static_cast<std::size_t>(fully_read)); });
}

void PgRechecks::read_writers() {
    call_cpp([&] { shmem::outbox_writers(*writers_); });
}

void PgRechecks::add_writers(const uint32* xids, int n) {
    call_cpp([&] {
        for (int i = 0; i < n; ++i)
            if (xids[i] != InvalidTransactionId) writers_->push_back(xids[i]);
    });
}

void PgRechecks::scanned(int64 id) {
    call_cpp([&] { scan_ids_->push_back(id); });
}

void PgRechecks::end_scan(int64 cursor) {
    call_cpp([&] {
        relay::IdRange gaps = relay::scan_gaps(cursor, *scan_ids_);
        rechecks_->add(gaps.lo, gaps.hi, *writers_);
    });
}

void destroy_state() {
    delete producer.producer_;
    producer.producer_ = nullptr;
    delete dispatcher.dispatcher_;
    dispatcher.dispatcher_ = nullptr;
    delete dispatcher.router_;
    dispatcher.router_ = nullptr;
    delete dispatcher.amqp_router_;
    dispatcher.amqp_router_ = nullptr;
    delete amqp_publisher.publisher_;
    amqp_publisher.publisher_ = nullptr;
    delete dispatcher.formats_;
    dispatcher.formats_ = nullptr;
    delete dispatcher.no_kafka_;
    dispatcher.no_kafka_ = nullptr;
    delete http_client.client_;
    http_client.client_ = nullptr;
    delete rechecks.rechecks_;
    rechecks.rechecks_ = nullptr;
    delete rechecks.writers_;
    rechecks.writers_ = nullptr;
    delete rechecks.scan_ids_;
    rechecks.scan_ids_ = nullptr;
    cursor = 0;
}

}  // namespace eventbox::relay_worker
