// The ingest worker's RabbitMQ subscriptions (source 'amqp'), internal header: their queues and
// streams consumed by one amqp::Consumer, each subscription's deliveries stored through the same
// rows as Kafka records (store_rows()), with their lanes' offsets (topic = the queue, partition
// 0), in one transaction; acknowledged only after it committed (see docs/design/ingest.md).
//
// A subscription is consumed by one worker: the one its name hashes to among
// eventbox.ingest_workers. Offsets: a stream's delivery carries its offset (x-stream-offset);
// a plain queue's deliveries are numbered by the worker from the queue's stored next offset, so
// that the inbox's lanes stay ordered. A batch that cannot be stored is rolled back, its
// deliveries go back to the queue (the channel is closed) and are read again after a backoff.
//
// Files: ingest_amqp_setup.cpp (which subscriptions, the consumer, their stored offsets),
// ingest_amqp.cpp (a batch classified, stored, acknowledged), ingest_amqp_errors.cpp (what
// the log and eventbox.subscription_errors say). The functions the rest of the worker calls
// are declared in inbox/ingest.hpp.
#pragma once

#include "inbox/ingest.hpp"

#include <map>
#include <string>
#include <vector>

#include "amqp/consumer.hpp"

namespace eventbox::ingest::amqp_sub {

// A failed batch's backoff.
inline constexpr int64_t kRetryMinMs = 1000;
inline constexpr int64_t kRetryMaxMs = 60000;

struct AmqpSub {
    Subscription sub;
    std::string settings;  // what it was added with: queues, start, batch size, id rules
    int id = 0;            // in the consumer
    std::map<std::string, int64_t> next;     // per queue: the stored next offset
    std::map<std::string, int64_t> highest;  // per queue: the highest next this process stored
    std::vector<int64_t> offsets;            // of the current batch's deliveries
    std::vector<kafka::PartitionEnd> ends;   // of the current batch
    bool below = false;                      // the batch stores below `highest` somewhere
    int64_t redelivered = 0;
    int64_t retry_ms = 0;
    std::string logged_error;
};

struct AmqpWanted {
    std::string name, settings, message_id_field;
    std::vector<std::string> queues;
    bool start_first;
    inbox::IdRule id_rule;  // message_id_rule
    bool keep_raw;          // inbox::keeps_raw() of its options
    int batch_size;
};

struct AmqpState {
    amqp::Consumer* consumer = nullptr;
    std::string fingerprint;  // eventbox.amqp_url and amqp_options it was built with
    std::vector<AmqpSub*> subs;
    std::vector<AmqpWanted> wanted;
    std::string logged_error;
    // Without a usable eventbox.amqp_url or amqp_options: why (else ""). The wanted
    // subscriptions then have no consumer, and this is their row in subscription_errors.
    std::string refused;
};

extern AmqpState* amqp_state;

// The consumer's errors, each logged when it changes (at a bounded rate)
// (ingest_amqp_errors.cpp).
void log_errors();
// Writes the errors of the subscriptions that changed to eventbox.ingest_errors, in one
// transaction (none when nothing changed) (ingest_amqp_errors.cpp).
void record_amqp_errors();
// While refused: the wanted subscriptions' rows say why (in the reload's transaction)
// (ingest_amqp_errors.cpp).
void record_refused();

}  // namespace eventbox::ingest::amqp_sub
