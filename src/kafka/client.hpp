// What the relay's producer and the ingest consumers share: building a librdkafka configuration
// (our defaults, then the user's eventbox.kafka_options), and collecting logs and errors from
// callbacks served on the caller's thread. Pure C++.
#pragma once

#include <librdkafka/rdkafka.h>

#include <exception>
#include <string>
#include <vector>

#include "kafka/options.hpp"

namespace eventbox::kafka {

struct LogLine {
    int level;  // syslog level
    std::string text;
};

// Base of our librdkafka handles: the handle's opaque points at this object.
class ClientEvents {
  public:
    std::vector<LogLine>& logs() { return logs_; }
    // True once librdkafka raised a fatal error: the handle must be recreated.
    bool fatal() const { return fatal_; }

  protected:
    // A configuration with `ours` then `user` applied and our log/error callbacks installed.
    // Throws eventbox::Error naming the rejected key (never its value).
    rd_kafka_conf_t* new_conf(const std::string& brokers, const std::vector<KafkaOption>& ours,
                              const std::vector<KafkaOption>& user);
    // The handle of `conf` (which it then owns); `conf` destroyed and eventbox::Error (F0000:
    // "could not create the Kafka <what>", librdkafka's reason scrubbed) when librdkafka refuses.
    rd_kafka_t* new_handle(rd_kafka_type_t type, rd_kafka_conf_t* conf, const char* what);
    // Makes the non-blocking pipe librdkafka signals when `queue` has events; fills pipe_.
    void enable_queue_events(rd_kafka_queue_t* queue);
    void disable_queue_events(rd_kafka_queue_t* queue);
    void close_pipe();
    // Empties the wake-up pipe.
    void drain_pipe();
    // Runs the body of a callback librdkafka calls: no C++ exception may cross its C frames.
    // One thrown (std::bad_alloc while a log line or delivery is recorded) is kept, and the
    // first kept is rethrown by rethrow_deferred() once the librdkafka call that served the
    // callback has returned.
    template <class Body>
    void in_callback(Body&& body) noexcept {
        try {
            body();
        } catch (...) {
            if (!deferred_) deferred_ = std::current_exception();
        }
    }
    // After each librdkafka call that serves callbacks (poll, consumer_poll).
    void rethrow_deferred();

    int pipe_[2] = {-1, -1};
    std::vector<LogLine> logs_;
    bool fatal_ = false;
    SecretScrubber scrubber_;      // applied to everything librdkafka says
    std::exception_ptr deferred_;  // thrown in a callback, not yet rethrown

  private:
    static void on_error(rd_kafka_t* rk, int err, const char* reason, void* opaque);
    static void on_log(const rd_kafka_t* rk, int level, const char* fac, const char* buf);
};

}  // namespace eventbox::kafka
