// Prometheus text exposition (src/metrics/exposition.cpp) and the metrics endpoint's request
// handling (src/metrics/http_server.cpp).
#include "metrics/exposition.hpp"
#include "metrics/http_server.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "core/error.hpp"

namespace eventbox::metrics {
namespace {

// The supervisor's endpoint calls these without a guard (metrics/endpoint.cpp): they must not
// throw.
static_assert(noexcept(std::declval<const HttpServer&>().pending()));
static_assert(noexcept(std::declval<const HttpServer&>().next_deadline_ms()));
static_assert(noexcept(std::declval<const HttpServer&>().event_fd()));

TEST(MetricsExposition, EscapesLabelValues) {
    EXPECT_EQ(escape_label_value("plain"), "plain");
    EXPECT_EQ(escape_label_value("a\\b"), "a\\\\b");
    EXPECT_EQ(escape_label_value("say \"hi\""), "say \\\"hi\\\"");
    EXPECT_EQ(escape_label_value("two\nlines"), "two\\nlines");
    // Other bytes, UTF-8 included, pass as they are.
    EXPECT_EQ(escape_label_value("tab\there \xc3\xa9"), "tab\there \xc3\xa9");
}

TEST(MetricsExposition, EscapesHelpButNotQuotes) {
    EXPECT_EQ(escape_help("a \"b\" \\ c\nd"), "a \"b\" \\\\ c\\nd");
}

TEST(MetricsExposition, FormatsValues) {
    EXPECT_EQ(format_value(0), "0");
    EXPECT_EQ(format_value(-0.0), "0");
    EXPECT_EQ(format_value(42), "42");
    EXPECT_EQ(format_value(12345678901234.0), "12345678901234");
    EXPECT_EQ(format_value(0.25), "0.25");
    EXPECT_EQ(format_value(std::numeric_limits<double>::infinity()), "+Inf");
    EXPECT_EQ(format_value(-std::numeric_limits<double>::infinity()), "-Inf");
    EXPECT_EQ(format_value(std::nan("")), "NaN");
}

TEST(MetricsExposition, RendersHelpTypeAndLabelledSamples) {
    Exposition e;
    Family& f =
        e.family("eventbox_ingest_records_total", "Records \\ read.\nSecond line.", Type::kCounter);
    e.add(f, {{"subscription", "bill\"ing"}}, 3);
    e.add(f, {{"subscription", "a\\b\nc"}}, 0);
    Family& g = e.family("eventbox_outbox_pending", "Rows waiting.", Type::kGauge);
    e.add(g, {}, 7);
    EXPECT_EQ(e.render(),
              "# HELP eventbox_ingest_records_total Records \\\\ read.\\nSecond line.\n"
              "# TYPE eventbox_ingest_records_total counter\n"
              "eventbox_ingest_records_total{subscription=\"bill\\\"ing\"} 3\n"
              "eventbox_ingest_records_total{subscription=\"a\\\\b\\nc\"} 0\n"
              "# HELP eventbox_outbox_pending Rows waiting.\n"
              "# TYPE eventbox_outbox_pending gauge\n"
              "eventbox_outbox_pending 7\n");
}

TEST(MetricsExposition, FamilyWithoutSamplesStillHasHelpAndType) {
    Exposition e;
    e.family("eventbox_handler_processed_total", "Processed.", Type::kCounter);
    EXPECT_EQ(e.render(),
              "# HELP eventbox_handler_processed_total Processed.\n"
              "# TYPE eventbox_handler_processed_total counter\n");
}

TEST(MetricsExposition, SameFamilyIsFoundAgain) {
    Exposition e;
    Family& a = e.family("eventbox_x_total", "X.", Type::kCounter);
    e.add(a, {}, 1);
    Family& b = e.family("eventbox_x_total", "X.", Type::kCounter);
    EXPECT_EQ(&a, &b);
    EXPECT_EQ(e.families().size(), 1u);
}

// collect.cpp holds two families while adding the samples of both: a family reference stays
// valid however many families are added after it. (Fails with the std::vector they were kept in:
// adding eventbox_ingest_conflicts_total moved eventbox_inbox_pending's samples into freed memory.)
TEST(MetricsExposition, FamilyReferencesSurviveMoreFamilies) {
    Exposition e;
    Family& first = e.family("eventbox_first", "First.", Type::kGauge);
    for (int i = 0; i < 100; ++i)
        e.family("eventbox_more_" + std::to_string(i), "More.", Type::kGauge);
    e.add(first, {{"subscription", "s"}}, 3);
    EXPECT_EQ(e.families().front().samples.size(), 1u);
    EXPECT_NE(e.render().find("eventbox_first{subscription=\"s\"} 3\n"), std::string::npos);
}

TEST(MetricsExposition, RejectsInvalidNames) {
    Exposition e;
    EXPECT_THROW(e.family("eventbox-bad", "", Type::kGauge), std::invalid_argument);
    EXPECT_THROW(e.family("1eventbox", "", Type::kGauge), std::invalid_argument);
    EXPECT_TRUE(valid_name("eventbox_a:b_1", false));
    EXPECT_FALSE(valid_name("a:b", true));
}

TEST(MetricsExposition, HistogramIsCumulativeWithInfSumAndCount) {
    Exposition e;
    Family& h = e.family("eventbox_handler_duration_seconds", "Duration.", Type::kHistogram);
    // 2 at or below 0.005, 1 in (0.005, 0.25], 3 above 0.25.
    e.add_histogram(h, {{"subscription", "s"}}, {0.005, 0.25}, {2, 1, 3}, 4.5);
    EXPECT_EQ(e.render(),
              "# HELP eventbox_handler_duration_seconds Duration.\n"
              "# TYPE eventbox_handler_duration_seconds histogram\n"
              "eventbox_handler_duration_seconds_bucket{subscription=\"s\",le=\"0.005\"} 2\n"
              "eventbox_handler_duration_seconds_bucket{subscription=\"s\",le=\"0.25\"} 3\n"
              "eventbox_handler_duration_seconds_bucket{subscription=\"s\",le=\"+Inf\"} 6\n"
              "eventbox_handler_duration_seconds_sum{subscription=\"s\"} 4.5\n"
              "eventbox_handler_duration_seconds_count{subscription=\"s\"} 6\n");
}

TEST(MetricsExposition, HistogramWithoutLabels) {
    Exposition e;
    Family& h = e.family("eventbox_relay_publish_latency_seconds", "L.", Type::kHistogram);
    e.add_histogram(h, {}, {1}, {0, 0}, 0);
    std::string text = e.render();
    EXPECT_NE(text.find("eventbox_relay_publish_latency_seconds_bucket{le=\"1\"} 0\n"),
              std::string::npos);
    EXPECT_NE(text.find("eventbox_relay_publish_latency_seconds_bucket{le=\"+Inf\"} 0\n"),
              std::string::npos);
    EXPECT_NE(text.find("eventbox_relay_publish_latency_seconds_sum 0\n"), std::string::npos);
    EXPECT_NE(text.find("eventbox_relay_publish_latency_seconds_count 0\n"), std::string::npos);
}

TEST(MetricsExposition, LabelsAsJson) {
    EXPECT_EQ(labels_json({}), "{}");
    EXPECT_EQ(labels_json({{"subscription", "a\"b"}, {"le", "+Inf"}}),
              "{\"subscription\": \"a\\\"b\", \"le\": \"+Inf\"}");
    EXPECT_EQ(labels_json({{"x", std::string("\x01", 1)}}), "{\"x\": \"\\u0001\"}");
}

TEST(MetricsHttp, ClassifiesRequests) {
    EXPECT_EQ(classify_request("GET /metrics HTTP/1.1\r\nHost: x\r\n"), Request::kIncomplete);
    EXPECT_EQ(classify_request("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), Request::kMetrics);
    EXPECT_EQ(classify_request("GET /metrics?x=1 HTTP/1.0\n\n"), Request::kMetrics);
    EXPECT_EQ(classify_request("HEAD /metrics HTTP/1.1\r\n\r\n"), Request::kHeadMetrics);
    EXPECT_EQ(classify_request("POST /metrics HTTP/1.1\r\n\r\n"), Request::kBadMethod);
    EXPECT_EQ(classify_request("GET / HTTP/1.1\r\n\r\n"), Request::kNotFound);
    EXPECT_EQ(classify_request("garbage\r\n\r\n"), Request::kBad);
    EXPECT_EQ(classify_request("GET /metrics SMTP\r\n\r\n"), Request::kBad);
}

TEST(MetricsHttp, ParsesAddresses) {
    std::string host;
    int port = 0;
    parse_address("127.0.0.1:9187", &host, &port);
    EXPECT_EQ(host, "127.0.0.1");
    EXPECT_EQ(port, 9187);
    parse_address("[::1]:80", &host, &port);
    EXPECT_EQ(host, "::1");
    EXPECT_THROW(parse_address("127.0.0.1", &host, &port), Error);
    EXPECT_THROW(parse_address("127.0.0.1:0", &host, &port), Error);
    EXPECT_THROW(parse_address("127.0.0.1:70000", &host, &port), Error);
    EXPECT_THROW(parse_address(":9187", &host, &port), Error);
    EXPECT_THROW(parse_address("h:9x", &host, &port), Error);
}

// A client connected to the server on an ephemeral port.
int connect_to(const HttpServer& server) {
    sockaddr_in addr{};
    socklen_t len = sizeof addr;
    getsockname(server.listen_fd(), reinterpret_cast<sockaddr*>(&addr), &len);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), len), 0);
    return fd;
}

std::string read_all(int fd) {
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
    return out;
}

// A loopback port free a moment ago.
int free_port() {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    socklen_t len = sizeof addr;
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    close(fd);
    return ntohs(addr.sin_port);
}

void send_text(int fd, const std::string& text) {
    ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
}

TEST(MetricsHttp, ServesScrapesAndBoundsBadClients) {
    HttpLimits limits;
    limits.max_request_bytes = 64;
    HttpServer server("127.0.0.1:" + std::to_string(free_port()), limits);
    int64_t now = 0;

    // A scrape waits for its body, then gets it and the connection is closed.
    int scrape = connect_to(server);
    send_text(scrape, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    usleep(20000);
    server.step(now);
    ASSERT_EQ(server.pending(), 1u);
    EXPECT_EQ(server.next_deadline_ms(), INT64_MAX);  // the owner answers it in its turn
    server.respond("eventbox_x 1\n", now);
    std::string reply = read_all(scrape);
    close(scrape);
    EXPECT_EQ(reply.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << reply;
    EXPECT_NE(reply.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
    EXPECT_NE(reply.find("Content-Length: 13\r\n"), std::string::npos);
    EXPECT_EQ(reply.substr(reply.size() - 13), "eventbox_x 1\n");
    EXPECT_EQ(server.pending(), 0u);
    EXPECT_EQ(server.connections(), 0u);

    // A client that closes its side after the request is still answered.
    int half = connect_to(server);
    send_text(half, "HEAD /metrics HTTP/1.0\r\n\r\n");
    shutdown(half, SHUT_WR);
    usleep(20000);
    server.step(now);
    ASSERT_EQ(server.pending(), 1u);
    server.respond("eventbox_x 1\n", now);
    reply = read_all(half);
    close(half);
    EXPECT_EQ(reply.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << reply;
    EXPECT_EQ(reply.substr(reply.size() - 4), "\r\n\r\n");  // no body

    // Another path is answered by the server itself.
    int other = connect_to(server);
    send_text(other, "GET /secret HTTP/1.1\r\n\r\n");
    usleep(20000);
    server.step(now);
    EXPECT_EQ(server.pending(), 0u);
    EXPECT_EQ(read_all(other).rfind("HTTP/1.1 404", 0), 0u);
    close(other);

    // An oversized request is refused without waiting for its end.
    int big = connect_to(server);
    send_text(big, "GET /metrics HTTP/1.1\r\nX-Padding: " + std::string(200, 'a'));
    usleep(20000);
    server.step(now);
    EXPECT_EQ(read_all(big).rfind("HTTP/1.1 431", 0), 0u);
    close(big);
    EXPECT_EQ(server.requests(), 2u);
    EXPECT_EQ(server.connections(), 0u);
}

TEST(MetricsHttp, SlowClientsAreClosedAtTheirDeadlineOrForNewerOnes) {
    HttpLimits limits;
    limits.max_connections = 2;
    limits.request_timeout_ms = 1000;
    HttpServer server("127.0.0.1:" + std::to_string(free_port()), limits);
    int64_t now = 0;

    // Two slow clients fill the connections; their requests are due a second after accept.
    int slow1 = connect_to(server);
    send_text(slow1, "GET /met");
    int slow2 = connect_to(server);
    usleep(20000);
    server.step(now);
    server.step(now);  // one accept per step with two connections at most
    EXPECT_EQ(server.connections(), 2u);
    EXPECT_EQ(server.next_deadline_ms(), now + 1000);

    // A newer connection is not refused: the oldest one still reading its request makes room.
    int slow3 = connect_to(server);
    usleep(20000);
    server.step(now + 10);
    EXPECT_EQ(server.connections(), 2u);
    EXPECT_EQ(server.evictions(), 1u);
    EXPECT_EQ(read_all(slow1), "");  // closed without an answer

    // A scrape waiting for its body is never the one closed.
    int scrape = connect_to(server);
    send_text(scrape, "GET /metrics HTTP/1.1\r\n\r\n");
    usleep(20000);
    server.step(now + 20);
    ASSERT_EQ(server.pending(), 1u);
    int slow4 = connect_to(server);
    usleep(20000);
    server.step(now + 30);
    EXPECT_EQ(server.evictions(), 3u);  // slow2, then slow3
    EXPECT_EQ(read_all(slow2), "");
    EXPECT_EQ(read_all(slow3), "");
    server.respond("eventbox_x 1\n", now + 30);
    EXPECT_EQ(read_all(scrape).rfind("HTTP/1.1 200 OK\r\n", 0), 0u);

    // Whatever it sends, a client without a complete request is closed at its deadline.
    send_text(slow4, "GET /metrics HTTP/1.1\r\n");
    usleep(20000);
    server.step(now + 1029);
    EXPECT_EQ(server.connections(), 1u);
    send_text(slow4, "X-Slow: 1\r\n");
    usleep(20000);
    server.step(now + 1030);
    EXPECT_EQ(server.connections(), 0u);
    EXPECT_EQ(read_all(slow4), "");
    EXPECT_EQ(server.next_deadline_ms(), INT64_MAX);
    for (int fd : {slow1, slow2, slow3, scrape, slow4}) close(fd);
    EXPECT_EQ(server.requests(), 1u);
}

}  // namespace
}  // namespace eventbox::metrics
