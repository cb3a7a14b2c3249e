// Shared librdkafka handle plumbing (see kafka/client.hpp).
#include "kafka/client.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.hpp"

namespace eventbox::kafka {

namespace {

// Sets one property; the error names the key, never the value (it may be a credential).
void set_conf(rd_kafka_conf_t* conf, const std::string& key, const std::string& value) {
    char errstr[512];
    if (rd_kafka_conf_set(conf, key.c_str(), value.c_str(), errstr, sizeof errstr) !=
        RD_KAFKA_CONF_OK) {
        rd_kafka_conf_destroy(conf);
        throw Error(sqlstate::kConfigFileError,
                    "kafka option \"" + key + "\" was rejected by librdkafka", {},
                    "Check the key and value in eventbox.kafka_options.");
    }
}

}  // namespace

rd_kafka_conf_t* ClientEvents::new_conf(const std::string& brokers,
                                        const std::vector<KafkaOption>& ours,
                                        const std::vector<KafkaOption>& user) {
    scrubber_ = SecretScrubber(user);
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    set_conf(conf, "bootstrap.servers", brokers);
    // Logs go to the main queue so they are emitted from the poll call, on our thread.
    set_conf(conf, "log.queue", "true");
    for (const KafkaOption& option : ours) set_conf(conf, option.first, option.second);
    for (const KafkaOption& option : user) set_conf(conf, option.first, option.second);
    rd_kafka_conf_set_opaque(conf, this);
    rd_kafka_conf_set_error_cb(conf, &ClientEvents::on_error);
    rd_kafka_conf_set_log_cb(conf, &ClientEvents::on_log);
    return conf;
}

rd_kafka_t* ClientEvents::new_handle(rd_kafka_type_t type, rd_kafka_conf_t* conf,
                                     const char* what) {
    char errstr[512];
    rd_kafka_t* rk = rd_kafka_new(type, conf, errstr, sizeof errstr);
    if (rk == nullptr) {
        rd_kafka_conf_destroy(conf);
        throw Error(sqlstate::kConfigFileError, std::string("could not create the Kafka ") + what,
                    scrubber_.scrub(errstr));
    }
    return rk;
}

void ClientEvents::enable_queue_events(rd_kafka_queue_t* queue) {
    if (pipe2(pipe_, O_NONBLOCK | O_CLOEXEC) != 0)
        throw Error(sqlstate::kInternalError, "could not create a Kafka event pipe",
                    std::strerror(errno));
    rd_kafka_queue_io_event_enable(queue, pipe_[1], "1", 1);
}

void ClientEvents::disable_queue_events(rd_kafka_queue_t* queue) {
    rd_kafka_queue_io_event_enable(queue, -1, nullptr, 0);
}

void ClientEvents::close_pipe() {
    for (int& fd : pipe_) {
        if (fd >= 0) close(fd);
        fd = -1;
    }
}

void ClientEvents::drain_pipe() {
    char buf[256];
    while (read(pipe_[0], buf, sizeof buf) > 0) {
    }
}

void ClientEvents::rethrow_deferred() {
    if (!deferred_) return;
    std::exception_ptr e = deferred_;
    deferred_ = nullptr;
    std::rethrow_exception(e);
}

void ClientEvents::on_error(rd_kafka_t* rk, int err, const char* reason, void* opaque) {
    auto* self = static_cast<ClientEvents*>(opaque);
    if (err == RD_KAFKA_RESP_ERR__FATAL) self->fatal_ = true;
    self->in_callback([&] {
        std::string text = reason ? reason : "";
        if (err == RD_KAFKA_RESP_ERR__FATAL) {
            char fatal[512];
            rd_kafka_fatal_error(rk, fatal, sizeof fatal);
            text = std::string("fatal error: ") + fatal;
        }
        self->logs_.push_back(LogLine{err == RD_KAFKA_RESP_ERR__FATAL ? 3 : 4,
                                      self->scrubber_.scrub(std::move(text))});
    });
}

void ClientEvents::on_log(const rd_kafka_t* rk, int level, const char* fac, const char* buf) {
    auto* self = static_cast<ClientEvents*>(rd_kafka_opaque(rk));
    self->in_callback([&] {
        self->logs_.push_back(LogLine{level, self->scrubber_.scrub(std::string(fac) + ": " + buf)});
    });
}

}  // namespace eventbox::kafka
