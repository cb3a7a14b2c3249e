// The relay's HTTP side (src/outbox/http_client.cpp): response classification, Retry-After,
// header names, content types, and the client against a small local server: per-key order,
// rows held back behind a failed request of their key, queue limit, timeouts.
#include "outbox/http_client.hpp"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "outbox/relay_dispatch.hpp"

namespace eventbox::http {
namespace {

// The relay's PostgreSQL side calls these without a guard (outbox/relay_worker.hpp): they must
// not throw.
static_assert(noexcept(std::declval<const Client&>().event_fd()));
static_assert(noexcept(std::declval<const Client&>().timeout_ms(0)));

TEST(HttpClassify, StatusClasses) {
    EXPECT_EQ(classify(200), Verdict::kDelivered);
    EXPECT_EQ(classify(204), Verdict::kDelivered);
    EXPECT_EQ(classify(299), Verdict::kDelivered);
    EXPECT_EQ(classify(408), Verdict::kTransient);
    EXPECT_EQ(classify(429), Verdict::kTransient);
    EXPECT_EQ(classify(500), Verdict::kTransient);
    EXPECT_EQ(classify(503), Verdict::kTransient);
    EXPECT_EQ(classify(400), Verdict::kPermanent);
    EXPECT_EQ(classify(404), Verdict::kPermanent);
    EXPECT_EQ(classify(301), Verdict::kPermanent);
}

TEST(HttpRetryAfter, SecondsAndDates) {
    EXPECT_EQ(parse_retry_after("5", 0), 5000);
    EXPECT_EQ(parse_retry_after(" 0 \r\n", 0), 0);
    EXPECT_EQ(parse_retry_after("99999999999", 0), kMaxRetryAfterMs);
    EXPECT_EQ(parse_retry_after("", 0), -1);
    EXPECT_EQ(parse_retry_after("soon", 0), -1);
    // Wed, 21 Oct 2015 07:28:00 GMT = 1445412480
    EXPECT_EQ(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 1445412470), 10000);
    EXPECT_EQ(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 1445412490), 0);
}

TEST(HttpHeaders, NamesBecomeTokens) {
    EXPECT_EQ(header_token("event_type"), "event_type");
    EXPECT_EQ(header_token("odd name/x"), "odd%20name%2Fx");
    EXPECT_EQ(header_token("100%"), "100%25");
    EXPECT_EQ(header_token("caf\xc3\xa9"), "caf%C3%A9");
}

TEST(HttpContentType, JsonOrBytes) {
    EXPECT_TRUE(is_json("{\"a\":1}", 7));
    EXPECT_TRUE(is_json("[1, 2]", 6));
    EXPECT_FALSE(is_json("{\"a\":", 5));
    EXPECT_FALSE(is_json("\x00\xff", 2));
    EXPECT_FALSE(is_json(nullptr, 0));
    EXPECT_EQ(describe_response(400, "bad\nthing"), "HTTP 400: bad\\x0athing");
    EXPECT_EQ(describe_response(503, ""), "HTTP 503");
}

TEST(HttpText, Utf8WithNulsIsUtf8) {
    using namespace std::string_view_literals;
    EXPECT_TRUE(is_utf8(""));
    EXPECT_TRUE(is_utf8("caf\xc3\xa9"));
    EXPECT_TRUE(is_utf8("a\0b\0"sv));
    EXPECT_TRUE(is_utf8("\0caf\xc3\xa9"sv));
    EXPECT_FALSE(is_utf8("a\0\xff"sv));
    EXPECT_FALSE(is_utf8("\xc3"));          // truncated
    EXPECT_FALSE(is_utf8("\xc0\xaf"));      // overlong
    EXPECT_FALSE(is_utf8("\xed\xa0\x80"));  // surrogate
    EXPECT_FALSE(is_json("{\"a\":\"\0\"}", 8));
}

// A keep-alive HTTP/1.1 server on 127.0.0.1: a body containing "fail" gets 500, "slow" an answer
// after 2 s, anything else 204. Requests are recorded in arrival order.
class Server {
  public:
    Server() {
        fd_ = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
        listen(fd_, 64);
        socklen_t len = sizeof a;
        getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
        port_ = ntohs(a.sin_port);
        thread_ = std::thread([this] { run(); });
    }
    ~Server() {
        stop_ = true;
        thread_.join();
        close(fd_);
        for (auto& t : workers_) t.join();
    }
    std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/in"; }
    std::vector<std::string> bodies() {
        std::lock_guard<std::mutex> g(mu_);
        return bodies_;
    }
    std::vector<std::string> heads() {
        std::lock_guard<std::mutex> g(mu_);
        return heads_;
    }

  private:
    void run() {
        while (!stop_) {
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, 50) <= 0) continue;
            int c = accept(fd_, nullptr, nullptr);
            if (c >= 0) workers_.emplace_back([this, c] { serve(c); });
        }
    }
    void serve(int c) {
        std::string buf;
        char tmp[4096];
        while (!stop_) {
            std::size_t end = buf.find("\r\n\r\n");
            if (end == std::string::npos) {
                pollfd p{c, POLLIN, 0};
                if (::poll(&p, 1, 50) <= 0) continue;
                ssize_t n = read(c, tmp, sizeof tmp);
                if (n <= 0) break;
                buf.append(tmp, static_cast<std::size_t>(n));
                continue;
            }
            std::size_t length = 0;
            std::size_t cl = buf.find("Content-Length: ");
            if (cl != std::string::npos && cl < end) length = std::stoul(buf.substr(cl + 16));
            while (buf.size() < end + 4 + length) {
                ssize_t n = read(c, tmp, sizeof tmp);
                if (n <= 0) break;
                buf.append(tmp, static_cast<std::size_t>(n));
            }
            std::string body = buf.substr(end + 4, length);
            std::string head = buf.substr(0, end);
            buf.erase(0, end + 4 + length);
            {
                std::lock_guard<std::mutex> g(mu_);
                bodies_.push_back(body);
                heads_.push_back(head);
            }
            if (body.find("slow") != std::string::npos)
                std::this_thread::sleep_for(std::chrono::seconds(2));
            const char* answer = body.find("fail") != std::string::npos
                                     ? "HTTP/1.1 500 Oops\r\nContent-Length: 4\r\n\r\noops"
                                     : "HTTP/1.1 204 No Content\r\n\r\n";
            if (write(c, answer, strlen(answer)) < 0) break;
        }
        close(c);
    }

    int fd_;
    int port_;
    std::atomic<bool> stop_{false};
    std::thread thread_;
    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::vector<std::string> bodies_;
    std::vector<std::string> heads_;
};

relay::Row row(int64_t id, const char* key, const std::string& payload) {
    static std::vector<std::string> keep;  // the row's views must outlive produce()
    keep.push_back(payload);
    relay::Row r;
    r.id = id;
    r.message_id = "00000000-0000-7000-8000-000000000000";
    r.topic = "crm";
    r.key = key;
    r.key_len = key ? strlen(key) : 0;
    r.payload = keep.back().data();
    r.payload_len = keep.back().size();
    return r;
}

// Polls the client until `n` outcomes arrived (or 10 s passed).
std::vector<Outcome> run_until(Client& c, std::size_t n) {
    std::vector<Outcome> out;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
        pollfd p{c.event_fd(), POLLIN, 0};
        long t = c.timeout_ms(0);
        ::poll(&p, 1, t < 0 || t > 20 ? 20 : static_cast<int>(t));
        c.poll(0);
        for (Outcome& o : c.outcomes()) out.push_back(o);
        c.outcomes().clear();
    }
    return out;
}

Destination dest(const std::string& url, std::size_t max_in_flight = 8, int64_t timeout_ms = 5000) {
    Destination d;
    d.topic = "crm";
    d.url = url;
    d.method = "POST";
    d.timeout_ms = timeout_ms;
    d.max_in_flight = max_in_flight;
    d.headers = {{"Authorization", "Bearer x"}};
    return d;
}

TEST(HttpClient, DeliversAndKeepsKeyOrder) {
    Server server;
    Client client({dest(server.url())}, 100);
    std::string error;
    for (int i = 0; i < 20; ++i)
        ASSERT_EQ(client.produce(row(i + 1, i % 2 ? "a" : "b", "{\"i\":" + std::to_string(i) + "}"),
                                 error),
                  relay::Produced::kQueued);
    std::vector<Outcome> out = run_until(client, 20);
    ASSERT_EQ(out.size(), 20u);
    for (const Outcome& o : out) EXPECT_TRUE(o.delivered) << o.error;
    // Per key, the server saw the bodies in order.
    std::vector<int> a, b;
    for (const std::string& body : server.bodies()) {
        int i = std::stoi(body.substr(5));
        (i % 2 ? a : b).push_back(i);
    }
    EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
    EXPECT_TRUE(std::is_sorted(b.begin(), b.end()));
    EXPECT_EQ(a.size() + b.size(), 20u);
    EXPECT_EQ(client.open_requests(), 0u);
}

// A row's headers become Eventbox-Header-* request headers; a value with CR, LF or NUL (a dead
// letter's producer bytes can hold them) is left out rather than ending the header line.
TEST(HttpClient, HeaderValuesThatWouldEndTheLineAreLeftOut) {
    Server server;
    Client client({dest(server.url())}, 100);
    relay::Header headers[3] = {
        {"ok", "v-1"}, {"evil", "x\r\nInjected: yes"}, {"nul", std::string_view("a\0b", 3)}};
    relay::Row r = row(1, "k", "{}");
    r.headers = headers;
    r.n_headers = 3;
    std::string error;
    ASSERT_EQ(client.produce(r, error), relay::Produced::kQueued) << error;
    std::vector<Outcome> out = run_until(client, 1);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_TRUE(out[0].delivered) << out[0].error;
    ASSERT_EQ(server.heads().size(), 1u);
    std::string head = server.heads()[0];
    EXPECT_NE(head.find("Eventbox-Header-ok: v-1\r\n"), std::string::npos) << head;
    EXPECT_EQ(head.find("Injected"), std::string::npos) << head;
    EXPECT_EQ(head.find("Eventbox-Header-evil"), std::string::npos) << head;
    EXPECT_EQ(head.find("Eventbox-Header-nul"), std::string::npos) << head;
}

TEST(HttpClient, FailureHandsBackTheRowsBehindItUncounted) {
    Server server;
    Client client({dest(server.url())}, 100);
    std::string error;
    client.produce(row(1, "k", "fail"), error);
    client.produce(row(2, "k", "{}"), error);
    client.produce(row(3, "k", "{}"), error);
    client.produce(row(4, "other", "{}"), error);
    std::vector<Outcome> out = run_until(client, 4);
    ASSERT_EQ(out.size(), 4u);
    for (const Outcome& o : out) {
        if (o.id == 1) {
            EXPECT_FALSE(o.delivered);
            EXPECT_FALSE(o.permanent);
            EXPECT_TRUE(o.counts);
            EXPECT_EQ(o.status, 500);
            EXPECT_EQ(o.error, "HTTP 500: oops");
        } else if (o.id == 4) {
            EXPECT_TRUE(o.delivered);
        } else {
            EXPECT_FALSE(o.counts) << o.id;  // never sent: the dispatcher holds it behind row 1
            EXPECT_FALSE(o.delivered);
        }
    }
    EXPECT_EQ(server.bodies().size(), 2u);
}

// While the breaker's probe is out no request can start: the client's timeout must not ask the
// relay to come back at once (before the fix it was 0 all along the probe: a busy loop).
TEST(HttpClient, NoBusyWaitWhileTheProbeIsOut) {
    Server server;
    Destination d = dest(server.url(), 4);
    d.breaker_failures = 1;
    d.breaker_cooldown_ms = 100;
    Client client({d}, 100);
    std::string error;
    client.produce(row(1, nullptr, "fail"), error);
    std::vector<Outcome> out = run_until(client, 1);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(client.breaker(0).state(), Breaker::State::kOpen);
    client.produce(row(2, nullptr, "slow"), error);
    client.produce(row(3, nullptr, "{}"), error);
    long wait = client.timeout_ms(0);
    EXPECT_GT(wait, 0);  // the cooldown
    EXPECT_LE(wait, 100);
    std::this_thread::sleep_for(std::chrono::milliseconds(110));
    client.poll(0);  // half-open: the probe (row 2, answered after 2 s) starts
    EXPECT_TRUE(client.breaker(0).probing());
    EXPECT_EQ(client.open_requests(), 1u);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    client.poll(0);
    EXPECT_NE(client.timeout_ms(0), 0);
    out = run_until(client, 2);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_TRUE(out[0].delivered && out[1].delivered);
    EXPECT_EQ(client.breaker(0).state(), Breaker::State::kClosed);
    EXPECT_EQ(server.bodies().size(), 3u);
}

TEST(HttpClient, BusyAtTheQueueLimitAndTimeouts) {
    Server server;
    Client client({dest(server.url(), 1, 300)}, 2);
    std::string error;
    EXPECT_EQ(client.produce(row(1, nullptr, "slow"), error), relay::Produced::kQueued);
    EXPECT_EQ(client.produce(row(2, nullptr, "{}"), error), relay::Produced::kQueued);
    EXPECT_EQ(client.produce(row(3, nullptr, "{}"), error), relay::Produced::kBusy);
    EXPECT_EQ(client.produce(row(4, "x", "{}"), error), relay::Produced::kBusy);
    std::vector<Outcome> out = run_until(client, 2);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[0].id, 1);
    EXPECT_FALSE(out[0].delivered);
    EXPECT_FALSE(out[0].permanent);
    EXPECT_NE(out[0].error.find("HTTP request failed: Timeout was reached"), std::string::npos)
        << out[0].error;
    EXPECT_TRUE(out[1].delivered);
}

TEST(HttpClient, ConnectionRefusedIsTransient) {
    Client client({dest("http://127.0.0.1:1/x")}, 10);
    std::string error;
    client.produce(row(1, "k", "{}"), error);
    std::vector<Outcome> out = run_until(client, 1);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_FALSE(out[0].delivered);
    EXPECT_FALSE(out[0].permanent);
    EXPECT_EQ(out[0].status, 0);
    EXPECT_NE(out[0].error.find("connect"), std::string::npos) << out[0].error;
}

}  // namespace
}  // namespace eventbox::http
