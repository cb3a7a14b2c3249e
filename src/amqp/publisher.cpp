// The relay's RabbitMQ publisher (see amqp/publisher.hpp).
#include "amqp/publisher.hpp"

#include <amqp.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>

#include "amqp/connection.hpp"
#include "outbox/http_client.hpp"

namespace eventbox::amqp {

namespace {

constexpr int64_t kReconnectMinMs = 500;
constexpr int64_t kReconnectMaxMs = 30000;
constexpr int kChannel = 1;
constexpr int kFramesPerPoll = 100000;

int64_t clock_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

amqp_connection_state_t state(void* conn) {
    return static_cast<amqp_connection_state_t>(conn);
}

amqp_bytes_t bytes(const std::string& s) {
    amqp_bytes_t b;
    b.len = s.size();
    b.bytes = const_cast<char*>(s.data());
    return b;
}

}  // namespace

std::string_view event_type_of(const relay::Row& row) {
    for (std::size_t i = 0; i < row.n_headers; ++i)
        if (row.headers[i].name == "event_type") return row.headers[i].value;
    return {};
}

Publisher::Publisher(Settings settings, std::vector<Destination> destinations,
                     std::size_t queue_limit)
    : settings_(std::move(settings)),
      destinations_(std::move(destinations)),
      queue_limit_(std::max<std::size_t>(queue_limit, 1)) {
    for (std::size_t i = 0; i < destinations_.size(); ++i)
        by_topic_.emplace(destinations_[i].topic, i);
}

Publisher::~Publisher() {
    for (auto& [tag, m] : by_tag_) delete m;
    for (auto& [key, queue] : keys_)
        for (Message* m : queue) delete m;
    if (conn_ != nullptr) {
        // A polite close, bounded by the RPC timeout set at connect.
        amqp_channel_close(state(conn_), kChannel, AMQP_REPLY_SUCCESS);
        amqp_connection_close(state(conn_), AMQP_REPLY_SUCCESS);
        amqp_destroy_connection(state(conn_));
    }
}

int Publisher::destination_of(std::string_view topic) const {
    auto it = by_topic_.find(std::string(topic));
    return it == by_topic_.end() ? -1 : static_cast<int>(it->second);
}

int Publisher::fd() const noexcept {
    return conn_ == nullptr ? -1 : amqp_get_sockfd(state(conn_));
}

bool Publisher::connect(int64_t now_ms) {
    if (conn_ != nullptr) return true;
    if (now_ms < reconnect_at_ms_) return false;
    reconnect_delay_ms_ = std::clamp(reconnect_delay_ms_ * 2, kReconnectMinMs, kReconnectMaxMs);
    reconnect_at_ms_ = now_ms + reconnect_delay_ms_;
    std::string failed;
    // Ask for connection.blocked notifications: while blocked, rows wait (kBusy) instead of
    // filling the socket of a broker that stopped reading.
    auto c = static_cast<amqp_connection_state_t>(
        open_connection(settings_, {"connection.blocked"}, &failed));
    if (c == nullptr) {
        last_error_ = failed;
        return false;
    }
    if (failed.empty()) {
        amqp_channel_open(c, kChannel);
        amqp_rpc_reply_t reply = amqp_get_rpc_reply(c);
        if (reply.reply_type != AMQP_RESPONSE_NORMAL) failed = "channel.open: " + reply_text(reply);
    }
    if (failed.empty()) {
        amqp_confirm_select(c, kChannel);
        amqp_rpc_reply_t reply = amqp_get_rpc_reply(c);
        if (reply.reply_type != AMQP_RESPONSE_NORMAL)
            failed = "confirm.select: " + reply_text(reply);
    }
    if (!failed.empty()) {
        last_error_ = redacted(failed, settings_);
        amqp_destroy_connection(c);
        return false;
    }
    conn_ = c;
    next_tag_ = 1;
    blocked_ = false;
    reconnect_delay_ms_ = 0;
    reconnect_at_ms_ = 0;
    last_error_.clear();
    return true;
}

void Publisher::disconnect(const std::string& why) {
    if (conn_ != nullptr) amqp_destroy_connection(state(conn_));
    corked_ = false;
    conn_ = nullptr;
    last_error_ = redacted(why, settings_);
    pending_return_code_ = 0;
    // Every unconfirmed publish may or may not have reached a queue: each is published again
    // (same message_id) after the dispatcher's backoff.
    std::map<uint64_t, Message*> lost;
    lost.swap(by_tag_);
    for (auto& [tag, m] : lost) settle(m, false, false, last_error_);
}

relay::Produced Publisher::produce(const relay::Row& row, std::string& error) {
    int destination = destination_of(row.topic);
    if (destination < 0) {
        error = "no AMQP destination for this topic";
        return relay::Produced::kUnrouted;
    }
    const Destination& d = destinations_[static_cast<std::size_t>(destination)];
    if (d.key_routes && row.key_len > 255) {
        error = "the key is longer than 255 bytes: it cannot be an AMQP routing key";
        return relay::Produced::kFailedPermanently;
    }
    if (!refused_.empty()) {
        error = refused_;
        return relay::Produced::kFailed;
    }
    if (held_ >= queue_limit_ || blocked_) return relay::Produced::kBusy;
    auto* m = new Message();
    m->id = row.id;
    m->destination = static_cast<std::size_t>(destination);
    m->message_id = std::string(row.message_id);
    m->has_key = row.key != nullptr;
    if (m->has_key) m->key.assign(row.key, row.key_len);
    if (row.payload != nullptr) m->payload.assign(row.payload, row.payload_len);
    for (std::size_t i = 0; i < row.n_headers; ++i)
        m->headers.emplace_back(std::string(row.headers[i].name),
                                std::string(row.headers[i].value));
    ++held_;
    if (m->has_key) {
        auto open = keys_.find(m->key);
        if (open != keys_.end()) {
            open->second.push_back(m);  // behind the unconfirmed row of its key
            return relay::Produced::kQueued;
        }
        keys_.emplace(m->key, std::deque<Message*>());
    }
    publish(m, clock_ms());
    return relay::Produced::kQueued;
}

void Publisher::publish(Message* m, int64_t now_ms) {
    if (!connect(now_ms)) {
        settle(m, false, false, "not connected to RabbitMQ: " + last_error_);
        return;
    }
    const Destination& d = destinations_[m->destination];
    std::vector<amqp_table_entry_t> entries(m->headers.size());
    std::string event_type;
    for (std::size_t i = 0; i < m->headers.size(); ++i) {
        entries[i].key = bytes(m->headers[i].first);
        entries[i].value.kind = AMQP_FIELD_KIND_UTF8;
        entries[i].value.value.bytes = bytes(m->headers[i].second);
        if (m->headers[i].first == "event_type") event_type = m->headers[i].second;
    }
    amqp_basic_properties_t p;
    p._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
               AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_HEADERS_FLAG;
    p.content_type = amqp_cstring_bytes(http::is_json(m->payload.data(), m->payload.size())
                                            ? "application/json"
                                            : "application/octet-stream");
    p.delivery_mode = AMQP_DELIVERY_PERSISTENT;
    p.message_id = bytes(m->message_id);
    p.headers.num_entries = static_cast<int>(entries.size());
    p.headers.entries = entries.data();
    if (!event_type.empty()) {
        p._flags |= AMQP_BASIC_TYPE_FLAG;
        p.type = bytes(event_type);
    }
    const std::string& routing_key = d.key_routes ? m->key : d.routing_key;
    cork(true);
    int rc = amqp_basic_publish(state(conn_), kChannel, bytes(d.exchange), bytes(routing_key),
                                /*mandatory=*/1, /*immediate=*/0, &p, bytes(m->payload));
    if (rc != AMQP_STATUS_OK) {
        std::string why = std::string("publishing to RabbitMQ failed: ") + amqp_error_string2(rc);
        settle(m, false, false, why);
        disconnect(why);
        return;
    }
    m->tag = next_tag_++;
    m->published_ms = now_ms;
    by_tag_.emplace(m->tag, m);
    by_message_id_[m->message_id] = m;
}

// A burst of publishes (the heads released by one read of confirms, or the rows a pass offers)
// leaves in full TCP segments instead of one per publish: each segment costs the broker a read
// and a wakeup, and its CPU is what bounds the confirm round on a shared machine. The kernel
// sends a corked socket's data after 200 ms at the latest, should a flush() be missed.
void Publisher::cork(bool on) {
    if (corked_ == on || conn_ == nullptr) return;
    int value = on ? 1 : 0;
    setsockopt(amqp_get_sockfd(state(conn_)), IPPROTO_TCP, TCP_CORK, &value, sizeof value);
    corked_ = on;
}

void Publisher::flush() {
    cork(false);
}

void Publisher::settle(Message* m, bool delivered, bool permanent, const std::string& error) {
    outcomes_.push_back(Outcome{m->id, delivered, permanent, true, error});
    auto named = by_message_id_.find(m->message_id);
    if (named != by_message_id_.end() && named->second == m) by_message_id_.erase(named);
    release_key(m, delivered, clock_ms());
    delete m;
    --held_;
}

void Publisher::release_key(Message* m, bool delivered, int64_t now_ms) {
    if (!m->has_key) return;
    auto open = keys_.find(m->key);
    if (open == keys_.end()) return;
    if (delivered && !open->second.empty()) {
        Message* next = open->second.front();
        open->second.pop_front();
        publish(next, now_ms);  // its key stays open
        return;
    }
    // Hand the rows behind a failed one back uncounted: the dispatcher holds them behind it.
    std::deque<Message*> behind;
    behind.swap(open->second);
    keys_.erase(open);
    for (Message* q : behind) {
        outcomes_.push_back(Outcome{q->id, false, false, false, std::string()});
        delete q;
        --held_;
    }
}

void Publisher::on_confirm(uint64_t tag, bool multiple, bool ack) {
    std::vector<Message*> confirmed;
    auto end = by_tag_.upper_bound(tag);
    auto begin = multiple ? by_tag_.begin() : by_tag_.find(tag);
    if (begin == by_tag_.end()) return;
    if (!multiple) end = std::next(begin);
    for (auto it = begin; it != end; ++it) confirmed.push_back(it->second);
    by_tag_.erase(begin, end);
    for (Message* m : confirmed) {
        if (!ack) {
            settle(m, false, false, "RabbitMQ refused the message (basic.nack)");
        } else if (m->return_code != 0) {
            const Destination& d = destinations_[m->destination];
            settle(m, false, true,
                   "returned by RabbitMQ as unroutable: " + std::to_string(m->return_code) + " " +
                       m->return_text + " (exchange \"" + d.exchange + "\")");
        } else {
            settle(m, true, false, std::string());
        }
    }
}

bool Publisher::read_frames(int64_t) {
    amqp_connection_state_t c = state(conn_);
    for (int n = 0; n < kFramesPerPoll; ++n) {
        amqp_frame_t frame;
        struct timeval zero = {0, 0};
        int rc = amqp_simple_wait_frame_noblock(c, &frame, &zero);
        if (rc == AMQP_STATUS_TIMEOUT) break;
        if (rc != AMQP_STATUS_OK) {
            disconnect(std::string("connection to RabbitMQ lost: ") + amqp_error_string2(rc));
            return false;
        }
        if (frame.frame_type == AMQP_FRAME_METHOD) {
            void* decoded = frame.payload.method.decoded;
            switch (frame.payload.method.id) {
                case AMQP_BASIC_ACK_METHOD: {
                    auto* a = static_cast<amqp_basic_ack_t*>(decoded);
                    on_confirm(a->delivery_tag, a->multiple != 0, true);
                    break;
                }
                case AMQP_BASIC_NACK_METHOD: {
                    auto* a = static_cast<amqp_basic_nack_t*>(decoded);
                    on_confirm(a->delivery_tag, a->multiple != 0, false);
                    break;
                }
                case AMQP_BASIC_RETURN_METHOD: {
                    auto* r = static_cast<amqp_basic_return_t*>(decoded);
                    pending_return_code_ = r->reply_code;
                    pending_return_text_ = text_of(r->reply_text);
                    break;
                }
                case AMQP_CHANNEL_CLOSE_METHOD: {
                    auto* m = static_cast<amqp_channel_close_t*>(decoded);
                    disconnect("channel closed by RabbitMQ: " + std::to_string(m->reply_code) +
                               " " + text_of(m->reply_text));
                    return false;
                }
                case AMQP_CONNECTION_CLOSE_METHOD: {
                    auto* m = static_cast<amqp_connection_close_t*>(decoded);
                    disconnect("connection closed by RabbitMQ: " + std::to_string(m->reply_code) +
                               " " + text_of(m->reply_text));
                    return false;
                }
                case AMQP_CONNECTION_BLOCKED_METHOD:
                    blocked_ = true;
                    break;
                case AMQP_CONNECTION_UNBLOCKED_METHOD:
                    blocked_ = false;
                    break;
                default:
                    break;
            }
        } else if (frame.frame_type == AMQP_FRAME_HEADER && pending_return_code_ != 0) {
            // The returned message's properties: its message_id names the row. The broker
            // sends a basic.return before the basic.ack of the same publish.
            auto* p = static_cast<amqp_basic_properties_t*>(frame.payload.properties.decoded);
            if (p != nullptr && (p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG) != 0) {
                auto it = by_message_id_.find(text_of(p->message_id));
                if (it != by_message_id_.end()) {
                    it->second->return_code = pending_return_code_;
                    it->second->return_text = pending_return_text_;
                }
            }
            pending_return_code_ = 0;
        }
        amqp_maybe_release_buffers(c);
    }
    return true;
}

void Publisher::poll(int64_t) {
    if (conn_ == nullptr) return;
    int64_t now = clock_ms();
    if (!read_frames(now)) return;
    if (!by_tag_.empty() &&
        now - by_tag_.begin()->second->published_ms > settings_.confirm_timeout_ms)
        disconnect("no confirm from RabbitMQ within " +
                   std::to_string(settings_.confirm_timeout_ms) + " ms");
}

long Publisher::timeout_ms(int64_t) const noexcept {
    if (by_tag_.empty()) return -1;
    int64_t due = by_tag_.begin()->second->published_ms + settings_.confirm_timeout_ms + 1;
    return static_cast<long>(std::max<int64_t>(due - clock_ms(), 0));
}

}  // namespace eventbox::amqp
