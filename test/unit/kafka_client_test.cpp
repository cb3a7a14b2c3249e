// Callbacks librdkafka calls (src/kafka/client.hpp, ClientEvents::in_callback): an exception
// thrown in one never crosses librdkafka's C frames; it is rethrown after the poll that served it.
#include "kafka/client.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <new>
#include <stdexcept>
#include <thread>

namespace eventbox::kafka {
namespace {

class Probe : public ClientEvents {
  public:
    using ClientEvents::in_callback;
    using ClientEvents::rethrow_deferred;

    // A producer handle on a port nobody listens on, whose error callback throws: librdkafka
    // reports "all brokers down" from rd_kafka_poll().
    void open() {
        rd_kafka_conf_t* conf = new_conf("127.0.0.1:1", {}, {});
        rd_kafka_conf_set_error_cb(conf, &Probe::throwing_error_cb);
        rk_ = new_handle(RD_KAFKA_PRODUCER, conf, "producer");
        rd_kafka_set_log_queue(rk_, nullptr);
    }
    void poll() {
        rd_kafka_poll(rk_, 100);
        rethrow_deferred();
    }
    int errors_seen = 0;
    ~Probe() {
        if (rk_ != nullptr) rd_kafka_destroy(rk_);
    }

  private:
    static void throwing_error_cb(rd_kafka_t*, int, const char*, void* opaque) {
        auto* self = static_cast<Probe*>(static_cast<ClientEvents*>(opaque));
        self->in_callback([&] {
            ++self->errors_seen;
            throw std::runtime_error("thrown in the error callback");
        });
    }
    rd_kafka_t* rk_ = nullptr;
};

TEST(KafkaClientCallbacks, KeepsTheFirstExceptionAndRethrowsItOnce) {
    Probe p;
    p.in_callback([] { throw std::bad_alloc(); });
    p.in_callback([] { throw std::runtime_error("second"); });
    EXPECT_THROW(p.rethrow_deferred(), std::bad_alloc);
    EXPECT_NO_THROW(p.rethrow_deferred());
}

TEST(KafkaClientCallbacks, ABodyThatReturnsLeavesNothingToRethrow) {
    Probe p;
    int ran = 0;
    p.in_callback([&] { ++ran; });
    EXPECT_EQ(ran, 1);
    EXPECT_NO_THROW(p.rethrow_deferred());
}

TEST(KafkaClientCallbacks, AnExceptionInALibrdkafkaCallbackComesOutOfThePoll) {
    Probe p;
    p.open();
    bool thrown = false;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!thrown && std::chrono::steady_clock::now() < deadline) {
        try {
            p.poll();
        } catch (const std::runtime_error& e) {
            EXPECT_STREQ(e.what(), "thrown in the error callback");
            thrown = true;
        }
    }
    ASSERT_TRUE(thrown) << "librdkafka reported no error for a broker at 127.0.0.1:1 in 30 s";
    EXPECT_GE(p.errors_seen, 1);
    EXPECT_NO_THROW(p.rethrow_deferred());
}

}  // namespace
}  // namespace eventbox::kafka
