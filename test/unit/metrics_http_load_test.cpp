// The metrics endpoint's server (src/metrics/http_server.cpp) under hostile clients: slow
// sockets and a client that keeps reconnecting must not keep a scrape from its answer.
#include "metrics/http_server.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <iomanip>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

namespace eventbox::metrics {
namespace {

// Only keeps a broken server from hanging the run; the scrapes are expected far sooner.
constexpr int64_t kHangGuardMs = 20000;

int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

sockaddr_in loopback(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    return addr;
}

// A loopback port free a moment ago.
int free_port() {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = loopback(0);
    bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    socklen_t len = sizeof addr;
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    close(fd);
    return ntohs(addr.sin_port);
}

int port_of(const HttpServer& server) {
    sockaddr_in addr{};
    socklen_t len = sizeof addr;
    getsockname(server.listen_fd(), reinterpret_cast<sockaddr*>(&addr), &len);
    return ntohs(addr.sin_port);
}

// A non-blocking client socket connecting to the port (the connection may still be under way).
// Closing it resets the connection, so that thousands of them leave no TIME_WAIT behind.
int open_client(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    linger reset{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    sockaddr_in addr = loopback(port);
    (void)connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    return fd;
}

// Whether the server closed (or reset) the client socket.
bool closed_by_server(int fd) {
    char buf[512];
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) return true;
    return n < 0 && (errno == ECONNRESET || errno == EPIPE || errno == ECONNREFUSED);
}

// The server, run by a thread as the supervisor runs it: wait for its sockets or its next
// deadline, step, answer the waiting scrapes.
class ServerThread {
  public:
    explicit ServerThread(HttpServer& server) : server_(server) {
        EXPECT_EQ(pipe2(stop_, O_CLOEXEC), 0);
        thread_ = std::thread([this] { run(); });
    }
    ~ServerThread() {
        (void)write(stop_[1], "x", 1);
        thread_.join();
        close(stop_[0]);
        close(stop_[1]);
    }

  private:
    void run() {
        for (;;) {
            pollfd fds[2] = {{stop_[0], POLLIN, 0}, {server_.event_fd(), POLLIN, 0}};
            int64_t deadline = server_.next_deadline_ms();
            int timeout = deadline == INT64_MAX
                              ? -1
                              : static_cast<int>(std::max<int64_t>(deadline - now_ms(), 0));
            (void)poll(fds, 2, timeout);
            if (fds[0].revents != 0) return;
            int64_t now = now_ms();
            server_.step(now);
            if (server_.pending() > 0) server_.respond("eventbox_up 1\n", now);
        }
    }

    HttpServer& server_;
    int stop_[2] = {-1, -1};
    std::thread thread_;
};

// `n` sockets that each send one byte of an endless request head every 100 ms, and connect
// again whenever the server closes one: `n` are held all the time.
class SlowClients {
  public:
    SlowClients(int port, int n) : port_(port), n_(n), thread_([this] { run(); }) {}
    ~SlowClients() {
        stop_ = true;
        thread_.join();
    }
    int rounds() const { return rounds_; }
    int opened() const { return opened_; }

  private:
    static char byte_at(std::size_t i) {
        static const std::string line = "GET /metrics HTTP/1.1\r\n";
        static const std::string header = "X-Slow: 1\r\n";
        return i < line.size() ? line[i] : header[(i - line.size()) % header.size()];
    }
    void run() {
        std::vector<int> fds(static_cast<std::size_t>(n_), -1);
        std::vector<std::size_t> sent(fds.size(), 0);
        while (!stop_) {
            for (std::size_t i = 0; i < fds.size(); ++i) {
                if (fds[i] >= 0 && closed_by_server(fds[i])) {
                    close(fds[i]);
                    fds[i] = -1;
                }
                if (fds[i] < 0) {
                    fds[i] = open_client(port_);
                    sent[i] = 0;
                    ++opened_;
                }
                char c = byte_at(sent[i]);
                if (send(fds[i], &c, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1) ++sent[i];
            }
            ++rounds_;
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        for (int fd : fds) close(fd);
    }

    int port_;
    int n_;
    std::atomic<bool> stop_{false};
    std::atomic<int> rounds_{0};
    std::atomic<int> opened_{0};
    std::thread thread_;
};

// A client that connects again and again (about once a millisecond), sends the start of a
// request each time and keeps the socket, closing its oldest beyond `hold`.
class Reconnector {
  public:
    Reconnector(int port, std::size_t hold)
        : port_(port), hold_(hold), thread_([this] { run(); }) {}
    ~Reconnector() {
        stop_ = true;
        thread_.join();
    }
    int connects() const { return connects_; }

  private:
    void run() {
        std::deque<int> fds;
        while (!stop_) {
            int fd = open_client(port_);
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
            (void)send(fd, "GET /metrics HTTP/1.1\r\n", 23, MSG_NOSIGNAL | MSG_DONTWAIT);
            fds.push_back(fd);
            ++connects_;
            if (fds.size() > hold_) {
                close(fds.front());
                fds.pop_front();
            }
        }
        for (int fd : fds) close(fd);
    }

    int port_;
    std::size_t hold_;
    std::atomic<bool> stop_{false};
    std::atomic<int> connects_{0};
    std::thread thread_;
};

struct Scrape {
    std::string reply;  // empty when the guard ran out first
    double ms;
};

// One well-formed GET /metrics, read to the end of the response (the server closes it).
Scrape scrape(int port) {
    auto started = std::chrono::steady_clock::now();
    int64_t start = now_ms();
    int fd = open_client(port);
    const std::string request = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    std::size_t sent = 0;
    std::string reply;
    for (;;) {
        int64_t left = start + kHangGuardMs - now_ms();
        if (left <= 0) break;
        pollfd p{fd, static_cast<short>(sent < request.size() ? POLLOUT : POLLIN), 0};
        if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
        if (sent < request.size()) {
            ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
            if (n > 0) sent += static_cast<std::size_t>(n);
            if (n < 0 && errno != EAGAIN && errno != EINTR) break;
            continue;
        }
        char buf[4096];
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n > 0) reply.append(buf, static_cast<std::size_t>(n));
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) break;
    }
    close(fd);
    return Scrape{
        reply, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
                   .count()};
}

// Whether a scrape got its answer (printing how long it took, a figure only, never asserted).
bool answered(const Scrape& s, const char* while_what) {
    bool ok = s.reply.rfind("HTTP/1.1 200 OK\r\n", 0) == 0 &&
              s.reply.find("\r\n\r\neventbox_up 1\n") != std::string::npos;
    std::cout << "[ scrape   ] " << while_what << ": " << (ok ? "answered in " : "no answer in ")
              << std::fixed << std::setprecision(2) << s.ms << " ms\n";
    return ok;
}

// Before: 4 connections at a time, each held 5 s from its accept whatever it sent, and a listen
// backlog of 16; 100 slow sockets kept every slot and the backlog full, and a scrape waited
// behind them (24 s on the supervisor's endpoint; here no answer within the guard).
TEST(MetricsHttpLoad, ScrapeIsAnsweredWhile100SlowSocketsAreHeld) {
    HttpServer server("127.0.0.1:" + std::to_string(free_port()), HttpLimits{});
    int port = port_of(server);
    int opened = 0;
    {
        ServerThread serving(server);
        SlowClients slow(port, 100);
        while (slow.rounds() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        // Scrapes for longer than a request may take, so that slow sockets also reach their
        // deadline meanwhile.
        for (int i = 0; i < 4; ++i) {
            Scrape s = scrape(port);
            ASSERT_TRUE(answered(s, "100 slow sockets")) << "\"" << s.reply << "\"";
            std::this_thread::sleep_for(std::chrono::milliseconds(800));
        }
        opened = slow.opened();
    }
    std::cout << "[ scrape   ] slow sockets opened (again when closed): " << opened
              << ", closed by the server for newer ones: " << server.evictions() << "\n";
    EXPECT_EQ(server.requests(), 4u);
}

// Before: a client that reconnected as soon as the server let one of its connections go kept
// the 4 slots and the listen backlog full, and a scrape's connection was not even accepted.
TEST(MetricsHttpLoad, ReconnectingClientCannotStarveAScrape) {
    HttpServer server("127.0.0.1:" + std::to_string(free_port()), HttpLimits{});
    int port = port_of(server);
    int connects = 0;
    {
        ServerThread serving(server);
        Reconnector flood(port, 150);
        while (flood.connects() < 300) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        for (int i = 0; i < 4; ++i) {
            Scrape s = scrape(port);
            ASSERT_TRUE(answered(s, "a reconnecting client")) << "\"" << s.reply << "\"";
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
        }
        connects = flood.connects();
    }
    std::cout << "[ scrape   ] connections of the reconnecting client: " << connects
              << ", closed by the server for newer ones: " << server.evictions() << "\n";
    EXPECT_EQ(server.requests(), 4u);
}

}  // namespace
}  // namespace eventbox::metrics
