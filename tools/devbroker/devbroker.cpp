// eventbox-devbroker: a development/test Kafka broker for pg_eventbox.
//
// It runs librdkafka's mock cluster (rdkafka_mock.h) which speaks the real
// Kafka protocol on 127.0.0.1, and adds a tiny line-based TCP control
// interface (also 127.0.0.1 only) to create topics and inject faults.
//
// Usage:
//   eventbox-devbroker [--brokers N] [--partitions P] [--control-port PORT]
//                      [--ready-file PATH]
//
// Ready line (stdout, one line, flushed; also written atomically to
// --ready-file):  bootstrap=127.0.0.1:A[,127.0.0.1:B...] control=127.0.0.1:C
//
// Control protocol: one command per line, one reply line per command,
// "OK[ <text>]" or "ERR <reason>":
//   ping                                 -> OK pong
//   bootstrap                            -> OK <bootstrap servers>
//   create_topic NAME [PARTITIONS [REPL]] -> OK  (default P from --partitions,
//                                                 REPL default 1)
//   broker_down ID|all / broker_up ID|all -> OK  (ids are 1..N)
//   inject_errors APIKEY CODE[,CODE...]   -> OK  (next requests of APIKEY fail
//                                                 with these codes, in order)
//   clear_errors APIKEY                   -> OK  (drop pending injected errors)
//   broker_rtt ID|all MS                  -> OK
//   sockets                               -> OK connections=N nodelay=M
//                                            (accepted Kafka connections
//                                            open now, and how many of
//                                            them have TCP_NODELAY set)
//   quit                                  -> OK, then exit 0
//
// What librdkafka 2.0.2's mock cluster does (checked by test/devbroker):
//  * Auto topic creation: the mock only speaks Metadata v0..v2 (no
//    AllowAutoTopicCreation flag), so ANY Metadata request naming an unknown
//    topic creates it (producers, consumers, admin list_topics alike).
//    Auto-created topics always get 4 partitions (hard-wired mock default; no
//    public API changes it) and replication factor min(3, brokers).
//    A Produce to an unknown topic, without Metadata first, gets
//    UNKNOWN_TOPIC_OR_PARTITION (3). --partitions therefore only sets the
//    partition count for "create_topic NAME" without a count.
//  * create_topic on an existing topic fails (ERR TOPIC_ALREADY_EXISTS).
//  * broker_down closes the broker's connections and its listener: new
//    connects get "connection refused". broker_up listens again on the SAME
//    port, so the bootstrap string never changes. Down/up does not move
//    partition leadership.
//  * Partitions keep at most ~5 MiB or 100k message sets (older ones are
//    dropped); idempotent-producer sequence numbers are not checked; the
//    CreateTopics admin API is not supported.
//  * Accepted connections get TCP_NODELAY from the owning handle's
//    socket.nagle.disable (rd_kafka_mock_connection_new() ->
//    rd_kafka_transport_post_connect_setup() with the cluster's dummy
//    broker, whose rk is the handle passed to rd_kafka_mock_cluster_new).
//    Without it a response written in pieces waits for the client's delayed
//    ACK: ~40 ms per produce round trip over several partitions.
//  * Injected errors are cluster-wide (any client, any broker) and consumed
//    one per matching request. librdkafka producers retry retriable codes
//    such as NOT_LEADER_FOR_PARTITION (6) even with retries=0.

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace {

volatile sig_atomic_t g_stop = 0;  // set by SIGTERM/SIGINT

constexpr size_t kMaxLine = 4096;        // longest accepted command line
constexpr size_t kMaxClients = 64;       // concurrent control connections
constexpr size_t kMaxOutBuffer = 65536;  // unread replies before we drop

// Command-line options.
struct Options {
    int brokers = 1;
    int partitions = 4;
    int control_port = 0;
    std::string ready_file;
};

// One connected control client with its partial input and pending output.
struct Client {
    int fd = -1;
    std::string in;
    std::string out;
    bool discarding = false;  // dropping the rest of an over-long line
};

// Signal handler: only records that we should stop.
void on_signal(int) {
    g_stop = 1;
}

// Parses a whole decimal string into [lo, hi]; false on anything else.
bool parse_int(const std::string &s, long lo, long hi, long *out) {
    if (s.empty()) return false;
    errno = 0;
    char *end = nullptr;
    long v = std::strtol(s.c_str(), &end, 10);
    if (errno != 0 || end == s.c_str() || *end != '\0') return false;
    if (v < lo || v > hi) return false;
    *out = v;
    return true;
}

// Checks a Kafka topic name: 1..249 chars of [A-Za-z0-9._-], not "." / "..".
bool valid_topic(const std::string &t) {
    if (t.empty() || t.size() > 249 || t == "." || t == "..") return false;
    for (char c : t) {
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        if (!ok) return false;
    }
    return true;
}

// Prints usage to stderr.
void usage(const char *argv0) {
    std::fprintf(stderr,
                 "usage: %s [--brokers N] [--partitions P] "
                 "[--control-port PORT] [--ready-file PATH]\n",
                 argv0);
}

// Parses argv into opts; false (after printing why) on bad usage.
bool parse_args(int argc, char **argv, Options *opts) {
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        std::string val;
        bool has_val = false;
        size_t eq = a.find('=');
        if (a.rfind("--", 0) == 0 && eq != std::string::npos) {
            val = a.substr(eq + 1);
            a = a.substr(0, eq);
            has_val = true;
        }
        if (a == "-h" || a == "--help") {
            usage(argv[0]);
            std::exit(0);
        }
        if (a != "--brokers" && a != "--partitions" && a != "--control-port" &&
            a != "--ready-file") {
            std::fprintf(stderr, "devbroker: unknown option %s\n", a.c_str());
            return false;
        }
        if (!has_val) {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "devbroker: %s needs a value\n", a.c_str());
                return false;
            }
            val = argv[++i];
        }
        long v = 0;
        if (a == "--ready-file") {
            if (val.empty()) return false;
            opts->ready_file = val;
        } else if (a == "--brokers") {
            if (!parse_int(val, 1, 64, &v)) {
                std::fprintf(stderr, "devbroker: --brokers must be 1..64\n");
                return false;
            }
            opts->brokers = static_cast<int>(v);
        } else if (a == "--partitions") {
            if (!parse_int(val, 1, 10000, &v)) {
                std::fprintf(stderr, "devbroker: --partitions must be 1..10000\n");
                return false;
            }
            opts->partitions = static_cast<int>(v);
        } else {
            if (!parse_int(val, 0, 65535, &v)) {
                std::fprintf(stderr, "devbroker: --control-port must be 0..65535\n");
                return false;
            }
            opts->control_port = static_cast<int>(v);
        }
    }
    return true;
}

// Opens the control listener on 127.0.0.1:port; returns fd or -1.
int open_listener(int port, int *bound_port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sin.sin_port = htons(static_cast<uint16_t>(port));
    socklen_t len = sizeof(sin);
    if (bind(fd, reinterpret_cast<sockaddr *>(&sin), sizeof(sin)) != 0 || listen(fd, 16) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr *>(&sin), &len) != 0) {
        std::fprintf(stderr, "devbroker: control listener: %s\n", std::strerror(errno));
        close(fd);
        return -1;
    }
    *bound_port = ntohs(sin.sin_port);
    return fd;
}

// Writes line+"\n" to path atomically (tmp file + rename).
bool write_ready_file(const std::string &path, const std::string &line) {
    std::string tmp = path + ".tmp." + std::to_string(getpid());
    FILE *f = std::fopen(tmp.c_str(), "w");
    if (!f) return false;
    bool ok = std::fprintf(f, "%s\n", line.c_str()) > 0;
    ok = (std::fflush(f) == 0) && ok;
    ok = (fsync(fileno(f)) == 0) && ok;
    ok = (std::fclose(f) == 0) && ok;
    if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        return false;
    }
    return true;
}

// librdkafka log callback: one line to stderr, except the expected warning
// that our cluster-owning handle has no bootstrap.servers.
void log_cb(const rd_kafka_t *, int level, const char *fac, const char *buf) {
    if (std::strcmp(fac, "CONFWARN") == 0 && std::strstr(buf, "bootstrap.servers")) return;
    std::fprintf(stderr, "devbroker: rdkafka %d %s: %s\n", level, fac, buf);
}

// The mock cluster plus the command interpreter operating on it.
class Broker {
  public:
    // Creates the handle and mock cluster; check ok() afterwards.
    explicit Broker(const Options &opts) : opts_(opts) {
        char errstr[512];
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        // Notice and worse only: keeps stderr quiet during normal operation.
        rd_kafka_conf_set(conf, "log_level", "5", errstr, sizeof(errstr));
        rd_kafka_conf_set_log_cb(conf, log_cb);
        // The mock cluster sets up every accepted connection with this handle's
        // settings: TCP_NODELAY on the broker side, as a real broker does.
        if (rd_kafka_conf_set(conf, "socket.nagle.disable", "true", errstr, sizeof(errstr)) !=
            RD_KAFKA_CONF_OK) {
            rd_kafka_conf_destroy(conf);
            std::fprintf(stderr, "devbroker: socket.nagle.disable: %s\n", errstr);
            return;
        }
        rk_ = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
        if (!rk_) {
            rd_kafka_conf_destroy(conf);
            std::fprintf(stderr, "devbroker: rd_kafka_new: %s\n", errstr);
            return;
        }
        mcluster_ = rd_kafka_mock_cluster_new(rk_, opts.brokers);
        if (!mcluster_) {
            std::fprintf(stderr, "devbroker: rd_kafka_mock_cluster_new failed\n");
            return;
        }
        bootstrap_ = rd_kafka_mock_cluster_bootstraps(mcluster_);
    }

    // Destroys the mock cluster, then the handle.
    ~Broker() {
        if (mcluster_) rd_kafka_mock_cluster_destroy(mcluster_);
        if (rk_) rd_kafka_destroy(rk_);
    }

    Broker(const Broker &) = delete;
    Broker &operator=(const Broker &) = delete;

    bool ok() const { return mcluster_ != nullptr; }
    const std::string &bootstrap() const { return bootstrap_; }

    // Executes one command line; returns the reply (no newline).
    // Sets *quit when the command was "quit".
    std::string execute(const std::string &line, bool *quit) {
        std::vector<std::string> args;
        std::istringstream ss(line);
        for (std::string w; ss >> w;) args.push_back(w);
        if (args.empty()) return "ERR empty command";
        const std::string &cmd = args[0];
        size_t n = args.size() - 1;

        if (cmd == "ping") return n == 0 ? "OK pong" : "ERR usage: ping";
        if (cmd == "bootstrap") return n == 0 ? "OK " + bootstrap_ : "ERR usage: bootstrap";
        if (cmd == "quit") {
            if (n != 0) return "ERR usage: quit";
            *quit = true;
            return "OK";
        }
        if (cmd == "create_topic") return create_topic(args);
        if (cmd == "broker_down" || cmd == "broker_up") return broker_updown(args);
        if (cmd == "inject_errors") return inject_errors(args);
        if (cmd == "clear_errors") return clear_errors(args);
        if (cmd == "broker_rtt") return broker_rtt(args);
        if (cmd == "sockets") return n == 0 ? sockets() : "ERR usage: sockets";
        std::string shown = cmd.size() > 64 ? cmd.substr(0, 64) + "..." : cmd;
        return "ERR unknown command " + shown;
    }

  private:
    // Maps an rd_kafka_resp_err_t to the reply line.
    static std::string result(rd_kafka_resp_err_t err) {
        if (err == RD_KAFKA_RESP_ERR_NO_ERROR) return "OK";
        return std::string("ERR ") + rd_kafka_err2name(err) + ": " + rd_kafka_err2str(err);
    }

    // Parses "all" (-> -1) or a broker id 1..N.
    bool parse_broker(const std::string &s, int32_t *id) const {
        if (s == "all") {
            *id = -1;
            return true;
        }
        long v = 0;
        if (!parse_int(s, 1, opts_.brokers, &v)) return false;
        *id = static_cast<int32_t>(v);
        return true;
    }

    // create_topic NAME [PARTITIONS [REPLICATION]]
    std::string create_topic(const std::vector<std::string> &a) {
        if (a.size() < 2 || a.size() > 4)
            return "ERR usage: create_topic NAME [PARTITIONS [REPLICATION]]";
        if (!valid_topic(a[1])) return "ERR invalid topic name";
        long parts = opts_.partitions, repl = 1;
        if (a.size() >= 3 && !parse_int(a[2], 1, 10000, &parts))
            return "ERR partitions must be 1..10000";
        if (a.size() == 4 && !parse_int(a[3], 1, opts_.brokers, &repl))
            return "ERR replication must be 1.." + std::to_string(opts_.brokers);
        return result(rd_kafka_mock_topic_create(mcluster_, a[1].c_str(), static_cast<int>(parts),
                                                 static_cast<int>(repl)));
    }

    // broker_down ID|all, broker_up ID|all
    std::string broker_updown(const std::vector<std::string> &a) {
        int32_t id = 0;
        if (a.size() != 2) return "ERR usage: " + a[0] + " ID|all";
        if (!parse_broker(a[1], &id))
            return "ERR broker id must be 1.." + std::to_string(opts_.brokers) + " or all";
        if (a[0] == "broker_down") return result(rd_kafka_mock_broker_set_down(mcluster_, id));
        return result(rd_kafka_mock_broker_set_up(mcluster_, id));
    }

    // inject_errors APIKEY CODE[,CODE...]
    std::string inject_errors(const std::vector<std::string> &a) {
        if (a.size() != 3) return "ERR usage: inject_errors APIKEY CODE[,CODE...]";
        long key = 0;
        if (!parse_int(a[1], 0, 1000, &key)) return "ERR APIKEY must be 0..1000";
        std::vector<rd_kafka_resp_err_t> codes;
        std::string item;
        std::istringstream ss(a[2]);
        while (std::getline(ss, item, ',')) {
            long c = 0;
            if (!parse_int(item, -200, RD_KAFKA_RESP_ERR_END_ALL - 1, &c))
                return "ERR bad error code '" + item.substr(0, 32) + "'";
            codes.push_back(static_cast<rd_kafka_resp_err_t>(c));
        }
        if (codes.empty() || codes.size() > 10000 || a[2].back() == ',')
            return "ERR need 1..10000 comma-separated codes";
        rd_kafka_mock_push_request_errors_array(mcluster_, static_cast<int16_t>(key), codes.size(),
                                                codes.data());
        return "OK";
    }

    // clear_errors APIKEY
    std::string clear_errors(const std::vector<std::string> &a) {
        long key = 0;
        if (a.size() != 2) return "ERR usage: clear_errors APIKEY";
        if (!parse_int(a[1], 0, 1000, &key)) return "ERR APIKEY must be 0..1000";
        rd_kafka_mock_clear_request_errors(mcluster_, static_cast<int16_t>(key));
        return "OK";
    }

    // broker_rtt ID|all MS
    std::string broker_rtt(const std::vector<std::string> &a) {
        int32_t id = 0;
        long ms = 0;
        if (a.size() != 3) return "ERR usage: broker_rtt ID|all MS";
        if (!parse_broker(a[1], &id))
            return "ERR broker id must be 1.." + std::to_string(opts_.brokers) + " or all";
        if (!parse_int(a[2], 0, 3600000, &ms)) return "ERR MS must be 0..3600000";
        return result(rd_kafka_mock_broker_set_rtt(mcluster_, id, static_cast<int>(ms)));
    }

    // sockets: walks /proc/self/fd for connected TCP sockets whose local port
    // is one of the mock brokers' listeners (the accepted Kafka connections)
    // and reads their TCP_NODELAY back.
    std::string sockets() const {
        std::vector<int> ports;
        std::istringstream ss(bootstrap_);
        for (std::string addr; std::getline(ss, addr, ',');) {
            long port = 0;
            size_t colon = addr.rfind(':');
            if (colon != std::string::npos && parse_int(addr.substr(colon + 1), 1, 65535, &port))
                ports.push_back(static_cast<int>(port));
        }
        DIR *dir = opendir("/proc/self/fd");
        if (!dir) return std::string("ERR /proc/self/fd: ") + std::strerror(errno);
        int conns = 0, nodelay = 0;
        while (dirent *e = readdir(dir)) {
            long fd = 0;
            if (!parse_int(e->d_name, 0, 1 << 30, &fd) || fd == dirfd(dir)) continue;
            sockaddr_in local{}, peer{};
            socklen_t llen = sizeof(local), plen = sizeof(peer);
            int type = 0;
            socklen_t tlen = sizeof(type);
            if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_TYPE, &type, &tlen) != 0 ||
                type != SOCK_STREAM)
                continue;
            if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr *>(&local), &llen) !=
                    0 ||
                local.sin_family != AF_INET ||
                getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr *>(&peer), &plen) != 0)
                continue;  // not IPv4, or a listener
            bool broker_side = false;
            for (int p : ports) broker_side |= ntohs(local.sin_port) == p;
            if (!broker_side) continue;
            int on = 0;
            socklen_t olen = sizeof(on);
            conns++;
            if (getsockopt(static_cast<int>(fd), IPPROTO_TCP, TCP_NODELAY, &on, &olen) == 0 && on)
                nodelay++;
        }
        closedir(dir);
        return "OK connections=" + std::to_string(conns) + " nodelay=" + std::to_string(nodelay);
    }

    Options opts_;
    rd_kafka_t *rk_ = nullptr;
    rd_kafka_mock_cluster_t *mcluster_ = nullptr;
    std::string bootstrap_;
};

// Consumes complete lines from c.in, queueing replies in c.out. An over-long
// line gets one "ERR line too long" and is skipped up to its newline.
void handle_input(Broker &broker, Client &c, bool *quit) {
    size_t pos;
    while ((pos = c.in.find('\n')) != std::string::npos) {
        std::string line = c.in.substr(0, pos);
        c.in.erase(0, pos + 1);
        if (c.discarding) {
            c.discarding = false;
            continue;
        }
        if (!line.empty() && line.back() == '\r') line.pop_back();
        c.out += broker.execute(line, quit) + "\n";
        if (*quit) return;
    }
    if (c.in.size() > kMaxLine) {
        if (!c.discarding) c.out += "ERR line too long\n";
        c.discarding = true;
        c.in.clear();
    }
}

// Sends as much of c.out as the socket takes; false if the client is gone.
bool flush_client(Client &c) {
    while (!c.out.empty()) {
        ssize_t w = send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
        if (w > 0) {
            c.out.erase(0, static_cast<size_t>(w));
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return c.out.size() <= kMaxOutBuffer;  // drop clients that never read
        } else {
            return false;
        }
    }
    return true;
}

// Best effort: waits up to 1 s to deliver the final replies (e.g. to quit).
void drain_client(Client &c) {
    for (int i = 0; i < 100 && !c.out.empty(); i++) {
        if (!flush_client(c)) return;
        if (!c.out.empty()) {
            pollfd p{c.fd, POLLOUT, 0};
            poll(&p, 1, 10);
        }
    }
}

// Serves control clients until a signal or "quit"; sigmask is used while
// waiting so that blocked SIGTERM/SIGINT interrupt ppoll().
void serve(Broker &broker, int lfd, const sigset_t *waitmask) {
    std::vector<Client> clients;
    bool quit = false;
    while (!g_stop && !quit) {
        std::vector<pollfd> pfds;
        pfds.push_back({lfd, static_cast<short>(clients.size() < kMaxClients ? POLLIN : 0), 0});
        for (const Client &c : clients) {
            short ev = POLLIN;
            if (!c.out.empty()) ev |= POLLOUT;
            pfds.push_back({c.fd, ev, 0});
        }
        int rc = ppoll(pfds.data(), pfds.size(), nullptr, waitmask);
        if (rc < 0) {
            if (errno == EINTR) continue;
            std::fprintf(stderr, "devbroker: poll: %s\n", std::strerror(errno));
            break;
        }
        // Existing clients first (pfds[i + 1] belongs to clients[i]).
        std::vector<bool> dead(clients.size(), false);
        for (size_t i = 0; i < clients.size() && !quit; i++) {
            Client &c = clients[i];
            short re = pfds[i + 1].revents;
            if (re & (POLLIN | POLLHUP | POLLERR)) {
                char buf[4096];
                ssize_t r = recv(c.fd, buf, sizeof(buf), 0);
                if (r > 0) {
                    c.in.append(buf, static_cast<size_t>(r));
                    handle_input(broker, c, &quit);
                } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
                    dead[i] = true;
                    continue;
                }
            }
            if (quit) {
                drain_client(c);
                break;
            }
            if (!flush_client(c)) dead[i] = true;
        }
        for (size_t i = clients.size(); i-- > 0;) {
            if (dead[i]) {
                close(clients[i].fd);
                clients.erase(clients.begin() + static_cast<long>(i));
            }
        }
        if (quit) break;
        // Then new connections.
        if (pfds[0].revents & POLLIN) {
            while (clients.size() < kMaxClients) {
                int fd = accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0) break;
                Client c;
                c.fd = fd;
                clients.push_back(c);
            }
        }
    }
    for (Client &c : clients) close(c.fd);
}

}  // namespace

// Entry point: parse options, start cluster and listener, print ready line,
// serve until stopped, then tear down and exit 0.
int main(int argc, char **argv) {
    Options opts;
    if (!parse_args(argc, argv, &opts)) {
        usage(argv[0]);
        return 2;
    }

    // Block SIGTERM/SIGINT in all threads (librdkafka's inherit this mask);
    // the main loop unblocks them only inside ppoll().
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    std::signal(SIGPIPE, SIG_IGN);
    sigset_t block, waitmask;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &waitmask);
    sigdelset(&waitmask, SIGTERM);
    sigdelset(&waitmask, SIGINT);

    {
        Broker broker(opts);
        if (!broker.ok()) return 1;
        int control_port = 0;
        int lfd = open_listener(opts.control_port, &control_port);
        if (lfd < 0) return 1;

        std::string ready = "bootstrap=" + broker.bootstrap() +
                            " control=127.0.0.1:" + std::to_string(control_port);
        if (!opts.ready_file.empty() && !write_ready_file(opts.ready_file, ready)) {
            std::fprintf(stderr, "devbroker: cannot write %s\n", opts.ready_file.c_str());
            close(lfd);
            return 1;
        }
        std::printf("%s\n", ready.c_str());
        std::fflush(stdout);
        std::fprintf(stderr, "devbroker: ready, %d broker(s): %s\n", opts.brokers, ready.c_str());

        serve(broker, lfd, &waitmask);
        close(lfd);
        std::fprintf(stderr, "devbroker: shutting down\n");
    }
    return 0;
}
