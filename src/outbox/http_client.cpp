// HTTP destinations of the relay (see outbox/http_client.hpp).
#include "outbox/http_client.hpp"

#include <curl/curl.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <ctime>

#include "core/error.hpp"

namespace eventbox::http {

namespace {

int64_t steady_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

int64_t steady_ms() {
    return steady_us() / 1000;
}

bool global_ready = false;

// The response headers the relay reads.
struct ResponseHeaders {
    std::string retry_after;
    std::string remaining;  // RateLimit-Remaining or X-RateLimit-Remaining
    std::string reset;      // RateLimit-Reset or X-RateLimit-Reset
};

// A response's body, up to `limit` bytes.
struct ResponseBody {
    std::string data;
    std::size_t limit = kBodyExcerpt * 4;
    bool truncated = false;
};

}  // namespace

struct Client::Item {
    int64_t id = 0;
    int64_t created_ms = 0;
    bool keyed = false;
    int64_t ready_ms = 0;  // when it joined the ready queue (steady clock)
    BulkRecord record;     // message id, key, payload, headers
};

struct Client::Request {
    std::size_t dest = 0;
    std::vector<Item*> items;  // in id order
    bool bulk = false;
    std::string body;  // a bulk request's; a single one sends its item's payload
    curl_slist* headers = nullptr;
    CURL* easy = nullptr;
    ResponseBody response;
    ResponseHeaders answered;
    bool probe = false;  // the circuit breaker's probe
    int64_t started_us = 0;
    char errbuf[CURL_ERROR_SIZE] = {0};
};

namespace {

size_t on_body(char* data, size_t size, size_t nmemb, void* user) {
    auto* r = static_cast<ResponseBody*>(user);
    size_t n = size * nmemb;
    if (r->data.size() < r->limit) r->data.append(data, std::min(n, r->limit - r->data.size()));
    if (n > 0 && r->data.size() >= r->limit) r->truncated = true;
    return n;
}

// Whether the header line `line` is `name` (lower case, with its colon); its value in `value`.
bool header_is(std::string_view line, std::string_view name, std::string* value) {
    if (line.size() <= name.size()) return false;
    for (std::size_t i = 0; i < name.size(); ++i)
        if (std::tolower(static_cast<unsigned char>(line[i])) != name[i]) return false;
    value->assign(line.substr(name.size()));
    return true;
}

size_t on_header(char* data, size_t size, size_t nmemb, void* user) {
    size_t n = size * nmemb;
    auto* h = static_cast<ResponseHeaders*>(user);
    std::string_view line(data, n);
    (void)(header_is(line, "retry-after:", &h->retry_after) ||
           header_is(line, "ratelimit-remaining:", &h->remaining) ||
           header_is(line, "x-ratelimit-remaining:", &h->remaining) ||
           header_is(line, "ratelimit-reset:", &h->reset) ||
           header_is(line, "x-ratelimit-reset:", &h->reset));
    return n;
}

}  // namespace

Client::Client(std::vector<Destination> destinations, std::size_t queue_limit)
    : destinations_(std::move(destinations)),
      queue_limit_(
          std::max<std::size_t>(queue_limit / std::max<std::size_t>(destinations_.size(), 1), 1)) {
    if (!global_ready) {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
            throw Error(sqlstate::kInternalError, "could not initialise libcurl");
        global_ready = true;
    }
    for (std::size_t i = 0; i < destinations_.size(); ++i) by_topic_[destinations_[i].topic] = i;
    queues_.resize(destinations_.size());
    for (std::size_t i = 0; i < destinations_.size(); ++i) {
        const Destination& d = destinations_[i];
        queues_[i].requests = TokenBucket(d.rate_limit, d.rate_burst);
        // A bulk request takes its messages at once: the bucket holds at least one request's.
        queues_[i].messages =
            TokenBucket(d.max_messages_per_second,
                        std::max(d.max_messages_per_second, static_cast<double>(d.batch_size)));
        queues_[i].breaker = Breaker(d.breaker_failures, d.breaker_cooldown_ms);
    }
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd_ < 0)
        throw Error(sqlstate::kInternalError, "could not create an epoll set for HTTP requests");
    CURLM* multi = curl_multi_init();
    if (multi == nullptr) {
        close(epoll_fd_);
        throw Error(sqlstate::kInternalError, "could not create a libcurl multi handle");
    }
    multi_ = multi;
    curl_multi_setopt(multi, CURLMOPT_SOCKETFUNCTION, &Client::on_socket);
    curl_multi_setopt(multi, CURLMOPT_SOCKETDATA, this);
    curl_multi_setopt(multi, CURLMOPT_TIMERFUNCTION, &Client::on_timer);
    curl_multi_setopt(multi, CURLMOPT_TIMERDATA, this);
    curl_multi_setopt(multi, CURLMOPT_PIPELINING, static_cast<long>(CURLPIPE_MULTIPLEX));
    // Idle connections kept for reuse: enough for every destination's parallel requests.
    std::size_t connections = 0;
    for (const Destination& d : destinations_) connections += d.max_in_flight;
    curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS,
                      static_cast<long>(std::max<std::size_t>(connections, 8)));
}

Client::~Client() {
    auto* multi = static_cast<CURLM*>(multi_);
    for (Queue& q : queues_) {
        for (Item* item : q.ready) delete item;
        for (auto& entry : q.keys)
            for (Item* item : entry.second) delete item;
    }
    for (Request* r : open_) {
        curl_multi_remove_handle(multi, r->easy);
        curl_easy_cleanup(r->easy);
        curl_slist_free_all(r->headers);
        for (Item* item : r->items) delete item;
        delete r;
    }
    curl_multi_cleanup(multi);
    if (epoll_fd_ >= 0) close(epoll_fd_);
}

int Client::destination_of(std::string_view topic) const {
    if (by_topic_.empty()) return -1;
    auto it = by_topic_.find(std::string(topic));
    return it == by_topic_.end() ? -1 : static_cast<int>(it->second);
}

std::size_t Client::open_requests() const noexcept {
    return open_.size();
}

relay::Produced Client::produce(const relay::Row& row, std::string& error) {
    int index = destination_of(row.topic);
    if (index < 0) {
        error = "no HTTP destination for this topic";
        return relay::Produced::kFailed;
    }
    Queue& q = queues_[static_cast<std::size_t>(index)];
    const Destination& d = destinations_[static_cast<std::size_t>(index)];
    // A destination may hold at least enough rows to fill its requests.
    if (q.held >= std::max(queue_limit_, d.max_in_flight * d.batch_size)) {
        error = "HTTP destination busy";
        return relay::Produced::kBusy;
    }
    auto* item = new Item();
    item->id = row.id;
    item->created_ms = row.created_ms;
    BulkRecord& rec = item->record;
    rec.message_id.assign(row.message_id);
    if (row.key != nullptr) {
        item->keyed = true;
        rec.has_key = true;
        rec.key.assign(row.key, row.key_len);
    }
    if (row.payload != nullptr) {
        rec.has_payload = true;
        rec.payload.assign(row.payload, row.payload_len);
        rec.json = is_json(row.payload, row.payload_len);
    }
    rec.headers.reserve(row.n_headers);
    for (std::size_t i = 0; i < row.n_headers; ++i)
        rec.headers.emplace_back(std::string(row.headers[i].name),
                                 std::string(row.headers[i].value));
    if (d.batch_size > 1 && !bulk_accepts(d.batch_format, rec)) {
        delete item;
        error = "batch_format sobject_collections needs a JSON object payload";
        return relay::Produced::kFailedPermanently;
    }

    ++q.held;
    if (item->keyed) {
        auto it = q.keys.find(rec.key);
        if (it != q.keys.end()) {
            it->second.push_back(item);  // behind the open row of its key
            return relay::Produced::kQueued;
        }
        q.keys.emplace(rec.key, std::deque<Item*>());
    }
    item->ready_ms = steady_ms();
    q.ready.push_back(item);
    start_ready();
    return relay::Produced::kQueued;
}

int64_t Client::next_start_ms(std::size_t i, int64_t now) const noexcept {
    const Queue& q = queues_[i];
    const Destination& d = destinations_[i];
    // Nothing to start, or only the end of a request can change that.
    if (q.ready.empty() || q.active >= d.max_in_flight || q.breaker.probing()) return -1;
    int64_t due = now;
    // A bulk request goes when it is full or its oldest row has waited batch_wait.
    if (d.batch_size > 1 && q.ready.size() < d.batch_size)
        due = std::max(due, q.ready.front()->ready_ms + d.batch_wait_ms);
    due = std::max(due, q.paused_until_ms);
    if (q.breaker.state() == Breaker::State::kOpen) due = std::max(due, q.breaker.due_ms());
    std::size_t n = std::min(d.batch_size, q.ready.size());
    due = std::max(due, now + q.requests.wait_ms(1, now));
    due = std::max(due, now + q.messages.wait_ms(static_cast<double>(n), now));
    return due <= now ? 0 : due;
}

void Client::start_ready() {
    for (std::size_t i = 0; i < queues_.size(); ++i) {
        Queue& q = queues_[i];
        const Destination& d = destinations_[i];
        for (;;) {
            int64_t now = steady_ms();
            if (next_start_ms(i, now) != 0) break;
            // Open: rows wait here, without requests and without attempts; half-open: one probe.
            if (!q.breaker.allow(now)) break;
            std::size_t n = d.batch_size <= 1 ? 1 : std::min(d.batch_size, q.ready.size());
            std::vector<Item*> items(q.ready.begin(), q.ready.begin() + n);
            q.ready.erase(q.ready.begin(), q.ready.begin() + n);
            std::sort(items.begin(), items.end(),
                      [](const Item* a, const Item* b) { return a->id < b->id; });
            q.requests.take(1, now);
            q.messages.take(static_cast<double>(n), now);
            Request* r = make_request(i, std::move(items));
            r->probe = q.breaker.started();
            start(r);
        }
    }
}

Client::Request* Client::make_request(std::size_t dest, std::vector<Item*> items) {
    const Destination& d = destinations_[dest];
    auto* r = new Request();
    r->dest = dest;
    r->items = std::move(items);
    r->bulk = d.batch_size > 1;
    curl_slist* h = nullptr;
    auto add = [&](const std::string& line) {
        curl_slist* next = curl_slist_append(h, line.c_str());
        if (next == nullptr) {
            curl_slist_free_all(h);
            for (Item* item : r->items) delete item;
            delete r;
            throw std::bad_alloc();
        }
        h = next;
    };
    std::string id;  // the request's Idempotency-Key and webhook-id
    const std::string* body = &r->body;
    if (r->bulk) {
        std::vector<const BulkRecord*> records;
        std::vector<std::string_view> ids;
        for (const Item* item : r->items) {
            records.push_back(&item->record);
            ids.push_back(item->record.message_id);
        }
        r->body = bulk_body(d.batch_format, d.topic, records);
        r->response.limit = kMaxBulkResponse;
        id = bulk_idempotency_key(ids);
        add(std::string("Content-Type: ") + bulk_content_type(d.batch_format));
        add("Eventbox-Message-Count: " + std::to_string(r->items.size()));
    } else {
        const BulkRecord& rec = r->items[0]->record;
        id = rec.message_id;
        body = &rec.payload;
        if (rec.has_payload)
            add(rec.json ? "Content-Type: application/json"
                         : "Content-Type: application/octet-stream");
        else
            add("Content-Type:");  // no body: no type
        for (const auto& header : rec.headers) {
            // send() refuses such values, but a dead letter's headers are the producer's bytes
            // (__eventbox.raw_headers): never let them end a header line.
            if (header.second.find_first_of(std::string_view("\r\n\0", 3)) != std::string::npos)
                continue;
            add(std::string(kHeaderPrefix) + header_token(header.first) + ": " + header.second);
        }
    }
    // IETF httpapi Idempotency-Key: a structured-field string.
    add("Idempotency-Key: \"" + id + "\"");
    add("Eventbox-Topic: " + d.topic);
    if (!d.signing_keys.empty()) {
        int64_t now = static_cast<int64_t>(time(nullptr));
        add("webhook-id: " + id);
        add("webhook-timestamp: " + std::to_string(now));
        add("webhook-signature: " + webhook_signature(d.signing_keys, id, now, *body));
    }
    for (const auto& header : d.headers) add(header.first + ": " + header.second);
    add("Expect:");  // no 100-continue round trip
    r->headers = h;
    return r;
}

void Client::start(Request* r) {
    const Destination& d = destinations_[r->dest];
    CURL* easy = curl_easy_init();
    r->started_us = steady_us();
    if (easy == nullptr) {
        // Counted as a failed attempt; finish() takes it from here.
        ++queues_[r->dest].active;
        open_.push_back(r);
        finish(r, CURLE_OUT_OF_MEMORY, steady_ms());
        return;
    }
    r->easy = easy;
    const std::string& body = r->bulk ? r->body : r->items[0]->record.payload;
    curl_easy_setopt(easy, CURLOPT_URL, d.url.c_str());
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, static_cast<long>(d.timeout_ms));
    curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(d.timeout_ms));
    curl_easy_setopt(easy, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_2TLS));
    // Over TLS, a new request waits for the first connection's handshake to say whether it
    // multiplexes (HTTP/2) rather than opening a connection of its own. Not over plain HTTP:
    // there curl learns it only from a response, and a slow first response would hold back
    // every other request.
    if (d.url.compare(0, 8, "https://") == 0 || d.url.compare(0, 8, "HTTPS://") == 0)
        curl_easy_setopt(easy, CURLOPT_PIPEWAIT, 1L);
    curl_easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(easy, CURLOPT_USERAGENT, "pg_eventbox relay");
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, r->headers);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body.data());
    if (d.method != "POST") curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, d.method.c_str());
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, &on_body);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, &r->response);
    curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, &on_header);
    curl_easy_setopt(easy, CURLOPT_HEADERDATA, &r->answered);
    curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, r->errbuf);
    curl_easy_setopt(easy, CURLOPT_PRIVATE, r);
    ++queues_[r->dest].active;
    open_.push_back(r);
    CURLMcode rc = curl_multi_add_handle(static_cast<CURLM*>(multi_), easy);
    if (rc != CURLM_OK) finish(r, CURLE_FAILED_INIT, steady_ms());
}

void Client::release_key(std::size_t dest, Item* item, bool delivered) {
    if (!item->keyed) return;
    Queue& q = queues_[dest];
    auto it = q.keys.find(item->record.key);
    if (it == q.keys.end()) return;
    if (delivered) {
        if (it->second.empty()) {
            q.keys.erase(it);
        } else {
            Item* next = it->second.front();
            it->second.pop_front();
            next->ready_ms = steady_ms();
            q.ready.push_back(next);
        }
        return;
    }
    // Not delivered: the rows behind it go back to the dispatcher, which holds them behind it.
    for (Item* behind : it->second) {
        outcomes_.push_back(Outcome{behind->id, dest, false, false, false, 0, 0, 0,
                                    "held back behind an earlier message of its key", false,
                                    behind->created_ms});
        --q.held;
        delete behind;
    }
    q.keys.erase(it);
}

void Client::settle(Request* r, int curl_code, std::vector<Outcome>& out) {
    const Destination& d = destinations_[r->dest];
    Outcome base{0, r->dest, false, false, true, 0, 0, steady_us() - r->started_us, {}, false, 0};
    std::vector<RecordResult> results;
    if (curl_code == CURLE_OK) {
        long status = 0;
        curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status);
        base.status = static_cast<int>(status);
        switch (classify(base.status)) {
            case Verdict::kDelivered:
                if (r->bulk) {
                    std::vector<std::string_view> ids;
                    for (const Item* item : r->items) ids.push_back(item->record.message_id);
                    char* type = nullptr;
                    curl_easy_getinfo(r->easy, CURLINFO_CONTENT_TYPE, &type);
                    results = settle_bulk(d.batch_format, base.status, type ? type : "",
                                          r->response.data, r->response.truncated, ids);
                } else {
                    base.delivered = true;
                }
                break;
            case Verdict::kTransient: {
                base.error = describe_response(base.status, r->response.data);
                int64_t after =
                    parse_retry_after(r->answered.retry_after, static_cast<int64_t>(time(nullptr)));
                base.retry_after_ms = after > 0 ? after : 0;
                break;
            }
            case Verdict::kPermanent:
                base.permanent = true;
                base.error = describe_response(base.status, r->response.data);
                break;
        }
    } else {
        base.error = std::string("HTTP request failed: ") +
                     curl_easy_strerror(static_cast<CURLcode>(curl_code));
        if (r->errbuf[0] != '\0') base.error += std::string(" (") + r->errbuf + ")";
    }
    for (std::size_t i = 0; i < r->items.size(); ++i) {
        Outcome o = base;
        o.id = r->items[i]->id;
        o.request = i == 0;
        o.created_ms = r->items[i]->created_ms;
        if (!results.empty()) {
            o.delivered = results[i].settled == Settled::kDelivered;
            o.permanent = results[i].settled == Settled::kPermanent;
            o.error = std::move(results[i].error);
        }
        out.push_back(std::move(o));
    }
}

void Client::finish(Request* r, int curl_code, int64_t now_ms) {
    (void)now_ms;
    std::size_t first = outcomes_.size();
    settle(r, curl_code, outcomes_);
    Queue& q = queues_[r->dest];
    const Outcome& said = outcomes_[first];
    bool failed = said.status == 0 || classify(said.status) == Verdict::kTransient;
    int64_t now = steady_ms();
    q.breaker.ended(r->probe, failed, now);
    // The endpoint's own limits: no new request before its window resets or Retry-After ends.
    int64_t pause = limit_pause_ms(r->answered.remaining, r->answered.reset,
                                   static_cast<int64_t>(time(nullptr)));
    if (failed && said.retry_after_ms > 0) pause = std::max(pause, said.retry_after_ms);
    if (pause > 0) q.paused_until_ms = std::max(q.paused_until_ms, now + pause);
    if (r->easy != nullptr) {
        curl_multi_remove_handle(static_cast<CURLM*>(multi_), r->easy);
        curl_easy_cleanup(r->easy);
    }
    curl_slist_free_all(r->headers);
    --q.active;
    q.held -= r->items.size();
    open_.erase(std::find(open_.begin(), open_.end(), r));
    for (std::size_t i = 0; i < r->items.size(); ++i) {
        release_key(r->dest, r->items[i], outcomes_[first + i].delivered);
        delete r->items[i];
    }
    delete r;
}

void Client::drive(int fd, int mask) {
    int running = 0;
    curl_multi_socket_action(static_cast<CURLM*>(multi_), fd, mask, &running);
}

void Client::poll(int64_t now_ms) {
    (void)now_ms;
    auto* multi = static_cast<CURLM*>(multi_);
    for (int round = 0; round < 4; ++round) {
        epoll_event events[64];
        int n;
        bool any = false;
        do {
            n = epoll_wait(epoll_fd_, events, 64, 0);
            for (int i = 0; i < n; ++i) {
                int mask = 0;
                if (events[i].events & EPOLLIN) mask |= CURL_CSELECT_IN;
                if (events[i].events & EPOLLOUT) mask |= CURL_CSELECT_OUT;
                if (events[i].events & (EPOLLERR | EPOLLHUP)) mask |= CURL_CSELECT_ERR;
                drive(events[i].data.fd, mask);
                any = true;
            }
        } while (n == 64);
        if (timer_due_ms_ >= 0 && timer_due_ms_ <= steady_ms()) {
            timer_due_ms_ = -1;
            drive(CURL_SOCKET_TIMEOUT, 0);
            any = true;
        }
        int left = 0;
        while (CURLMsg* msg = curl_multi_info_read(multi, &left)) {
            if (msg->msg != CURLMSG_DONE) continue;
            Request* r = nullptr;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, reinterpret_cast<char**>(&r));
            finish(r, msg->data.result, steady_ms());
        }
        start_ready();
        if (!any) break;
    }
}

long Client::timeout_ms(int64_t now_ms) const noexcept {
    (void)now_ms;
    int64_t now = steady_ms();
    int64_t due = timer_due_ms_;
    // Rows waiting for batch_wait, a rate limit, a pause or the breaker's cooldown.
    for (std::size_t i = 0; i < queues_.size(); ++i) {
        int64_t start = next_start_ms(i, now);
        if (start < 0) continue;
        due = due < 0 ? start : std::min(due, start);
    }
    if (due < 0) return -1;
    return static_cast<long>(std::max<int64_t>(due - now, 0));
}

int Client::on_socket(void*, int fd, int what, void* self, void*) {
    auto* client = static_cast<Client*>(self);
    if (what == CURL_POLL_REMOVE) {
        epoll_ctl(client->epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
        return 0;
    }
    epoll_event ev{};
    if (what & CURL_POLL_IN) ev.events |= EPOLLIN;
    if (what & CURL_POLL_OUT) ev.events |= EPOLLOUT;
    ev.data.fd = fd;
    if (epoll_ctl(client->epoll_fd_, EPOLL_CTL_MOD, fd, &ev) != 0 && errno == ENOENT)
        epoll_ctl(client->epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    return 0;
}

int Client::on_timer(void*, long timeout_ms, void* self) {
    auto* client = static_cast<Client*>(self);
    client->timer_due_ms_ = timeout_ms < 0 ? -1 : steady_ms() + timeout_ms;
    return 0;
}

}  // namespace eventbox::http
