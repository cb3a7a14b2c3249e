// The ingest worker's RabbitMQ consumer (see amqp/consumer.hpp).
#include "amqp/consumer.hpp"

#include <amqp.h>

#include <algorithm>
#include <chrono>
#include <climits>

#include "amqp/connection.hpp"

namespace eventbox::amqp {

namespace {

constexpr int64_t kReconnectMinMs = 500;
constexpr int64_t kReconnectMaxMs = 30000;
constexpr int64_t kRetryMinMs = 1000;
constexpr int64_t kRetryMaxMs = 30000;
constexpr int kMaxChannel = 2047;  // RabbitMQ's default channel_max

amqp_connection_state_t state(void* conn) {
    return static_cast<amqp_connection_state_t>(conn);
}

amqp_bytes_t bytes(const std::string& s) {
    amqp_bytes_t b;
    b.len = s.size();
    b.bytes = const_cast<char*>(s.data());
    return b;
}

// A header's value as text; nullopt for void and for kinds without a text form (tables,
// arrays), which are left out.
bool value_text(const amqp_field_value_t& v, std::optional<std::string>* out) {
    switch (v.kind) {
        case AMQP_FIELD_KIND_UTF8:
        case AMQP_FIELD_KIND_BYTES:
            *out = text_of(v.value.bytes);
            return true;
        case AMQP_FIELD_KIND_BOOLEAN:
            *out = v.value.boolean ? "true" : "false";
            return true;
        case AMQP_FIELD_KIND_I8:
            *out = std::to_string(v.value.i8);
            return true;
        case AMQP_FIELD_KIND_U8:
            *out = std::to_string(v.value.u8);
            return true;
        case AMQP_FIELD_KIND_I16:
            *out = std::to_string(v.value.i16);
            return true;
        case AMQP_FIELD_KIND_U16:
            *out = std::to_string(v.value.u16);
            return true;
        case AMQP_FIELD_KIND_I32:
            *out = std::to_string(v.value.i32);
            return true;
        case AMQP_FIELD_KIND_U32:
            *out = std::to_string(v.value.u32);
            return true;
        case AMQP_FIELD_KIND_I64:
            *out = std::to_string(v.value.i64);
            return true;
        case AMQP_FIELD_KIND_U64:
        case AMQP_FIELD_KIND_TIMESTAMP:
            *out = std::to_string(v.value.u64);
            return true;
        case AMQP_FIELD_KIND_F32:
            *out = std::to_string(v.value.f32);
            return true;
        case AMQP_FIELD_KIND_F64:
            *out = std::to_string(v.value.f64);
            return true;
        case AMQP_FIELD_KIND_VOID:
            *out = std::nullopt;
            return true;
        default:
            return false;
    }
}

int64_t integer_of(const amqp_field_value_t& v) {
    switch (v.kind) {
        case AMQP_FIELD_KIND_I64:
            return v.value.i64;
        case AMQP_FIELD_KIND_U64:
            return v.value.u64 > static_cast<uint64_t>(INT64_MAX)
                       ? -1
                       : static_cast<int64_t>(v.value.u64);
        case AMQP_FIELD_KIND_I32:
            return v.value.i32;
        case AMQP_FIELD_KIND_U32:
            return v.value.u32;
        default:
            return -1;
    }
}

}  // namespace

Consumer::Consumer(Settings settings) : settings_(std::move(settings)) {}

Consumer::~Consumer() {
    if (conn_ != nullptr) {
        amqp_connection_close(state(conn_), AMQP_REPLY_SUCCESS);
        amqp_destroy_connection(state(conn_));
    }
}

int Consumer::add(ConsumerSubscription config) {
    int id = next_id_++;
    Sub& s = subs_[id];
    for (const std::string& q : config.queues) s.queues.push_back(Queue{q, -1, -1});
    s.config = std::move(config);
    return id;
}

void Consumer::remove(int id) {
    auto it = subs_.find(id);
    if (it == subs_.end()) return;
    if (conn_ != nullptr && it->second.channel != 0)
        amqp_channel_close(state(conn_), it->second.channel, AMQP_REPLY_SUCCESS);
    subs_.erase(it);
}

void Consumer::set_next_offset(int id, const std::string& queue, int64_t next) {
    for (Queue& q : subs_.at(id).queues)
        if (q.name == queue) q.next_offset = next;
}

void Consumer::restart(int id, int64_t delay_ms, int64_t now_ms) {
    Sub& s = subs_.at(id);
    if (conn_ != nullptr && s.channel != 0) {
        amqp_channel_close(state(conn_), s.channel, AMQP_REPLY_SUCCESS);
        amqp_rpc_reply_t reply = amqp_get_rpc_reply(state(conn_));
        if (reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION) {
            disconnect(std::string("connection to RabbitMQ lost: ") +
                       amqp_error_string2(reply.library_error));
        }
    }
    s.channel = 0;
    s.pending = false;
    s.batch.clear();
    s.open_at_ms = now_ms + delay_ms;
}

int64_t stream_offset_of(const amqp_field_value_t& v) {
    return integer_of(v);
}

void read_properties(const amqp_basic_properties_t& p, Delivery& d) {
    if ((p._flags & AMQP_BASIC_MESSAGE_ID_FLAG) != 0) d.message_id = text_of(p.message_id);
    if ((p._flags & AMQP_BASIC_TYPE_FLAG) != 0) d.type = text_of(p.type);
    if ((p._flags & AMQP_BASIC_CONTENT_TYPE_FLAG) != 0) d.content_type = text_of(p.content_type);
    if ((p._flags & AMQP_BASIC_HEADERS_FLAG) == 0) return;
    for (int i = 0; i < p.headers.num_entries; ++i) {
        const amqp_table_entry_t& e = p.headers.entries[i];
        std::string name = text_of(e.key);
        if (name == "x-stream-offset") {
            d.stream_offset = stream_offset_of(e.value);
            continue;
        }
        std::optional<std::string> value;
        if (value_text(e.value, &value)) d.headers.emplace_back(name, value);
    }
}

void record_headers(const Delivery& d, std::vector<inbox::KafkaHeader>& out) {
    out.clear();
    auto add = [&](std::string_view name, const std::optional<std::string>& value) {
        out.push_back(
            inbox::KafkaHeader{name, value ? value->data() : nullptr, value ? value->size() : 0});
    };
    if (d.message_id) add("message_id", d.message_id);
    bool has_type = false;
    for (const auto& [name, value] : d.headers) {
        if (name == "message_id" && d.message_id) continue;
        has_type |= name == "event_type";
        add(name, value);
    }
    if (d.type && !has_type) add("event_type", d.type);
}

bool Consumer::buffered() const noexcept {
    return conn_ != nullptr &&
           (amqp_data_in_buffer(state(conn_)) || amqp_frames_enqueued(state(conn_)));
}

int Consumer::fd() const noexcept {
    return conn_ == nullptr ? -1 : amqp_get_sockfd(state(conn_));
}

bool Consumer::connect(int64_t now_ms) {
    if (conn_ != nullptr) return true;
    if (now_ms < reconnect_at_ms_) return false;
    reconnect_delay_ms_ = std::clamp(reconnect_delay_ms_ * 2, kReconnectMinMs, kReconnectMaxMs);
    reconnect_at_ms_ = now_ms + reconnect_delay_ms_;
    std::string failed;
    // consumer_cancel_notify: a deleted queue cancels its consumer with a basic.cancel, which
    // the subscription then retries, instead of silently consuming nothing.
    conn_ = open_connection(settings_, {"consumer_cancel_notify"}, &failed);
    if (conn_ == nullptr) {
        last_error_ = redacted(failed, settings_);
        failed = last_error_;
        for (auto& [id, s] : subs_) s.error = "not connected to RabbitMQ: " + failed;
        return false;
    }
    next_channel_ = 1;
    reconnect_delay_ms_ = 0;
    reconnect_at_ms_ = 0;
    last_error_.clear();
    return true;
}

void Consumer::disconnect(const std::string& why) {
    if (conn_ != nullptr) amqp_destroy_connection(state(conn_));
    conn_ = nullptr;
    last_error_ = redacted(why, settings_);
    // What was delivered and not acknowledged goes back to the queues: read again later.
    for (auto& [id, s] : subs_) {
        s.channel = 0;
        s.pending = false;
        s.batch.clear();
        s.open_at_ms = 0;
        s.error = last_error_;
    }
}

void Consumer::close_channel(Sub& s, const std::string& why, int64_t now_ms) {
    s.channel = 0;
    s.pending = false;
    s.batch.clear();
    s.error = redacted(why, settings_);
    s.backoff_ms = std::clamp(s.backoff_ms * 2, kRetryMinMs, kRetryMaxMs);
    s.open_at_ms = now_ms + s.backoff_ms;
}

bool Consumer::open(Sub& s, int64_t now_ms) {
    amqp_connection_state_t c = state(conn_);
    // A plain queue refuses x-stream-offset (406) and closes the channel: it is consumed again
    // without, on a new channel. Bounded: each queue refuses at most once.
    for (std::size_t attempt = 0; attempt <= s.queues.size(); ++attempt) {
        int channel = next_channel_;
        next_channel_ = next_channel_ >= kMaxChannel ? 1 : next_channel_ + 1;
        amqp_channel_open(c, channel);
        amqp_rpc_reply_t reply = amqp_get_rpc_reply(c);
        int code = 0;
        if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
            std::string why = "channel.open: " + reply_text(reply, &code);
            if (code == 0 || code == -1)
                disconnect(why);
            else
                close_channel(s, why, now_ms);
            return false;
        }
        uint16_t prefetch = static_cast<uint16_t>(std::clamp(s.config.prefetch, 1, 65535));
        amqp_basic_qos(c, channel, 0, prefetch, 0);
        reply = amqp_get_rpc_reply(c);
        bool retry = false;
        std::string failed;
        if (reply.reply_type != AMQP_RESPONSE_NORMAL)
            failed = "basic.qos: " + reply_text(reply, &code);
        for (std::size_t i = 0; failed.empty() && i < s.queues.size(); ++i) {
            Queue& q = s.queues[i];
            amqp_table_entry_t offset;
            offset.key = amqp_cstring_bytes("x-stream-offset");
            if (q.next_offset >= 0) {
                offset.value.kind = AMQP_FIELD_KIND_I64;
                offset.value.value.i64 = q.next_offset;
            } else {
                offset.value.kind = AMQP_FIELD_KIND_UTF8;
                offset.value.value.bytes =
                    amqp_cstring_bytes(s.config.start_first ? "first" : "next");
            }
            amqp_table_t args;
            args.num_entries = q.stream == 0 ? 0 : 1;
            args.entries = &offset;
            std::string tag = "q" + std::to_string(i);
            amqp_basic_consume(c, channel, bytes(q.name), bytes(tag), 0, /*no_ack=*/0, 0, args);
            reply = amqp_get_rpc_reply(c);
            if (reply.reply_type == AMQP_RESPONSE_NORMAL) {
                if (q.stream == -1) q.stream = 1;  // only a stream takes x-stream-offset
                continue;
            }
            failed = "basic.consume of queue \"" + q.name + "\": " + reply_text(reply, &code);
            if (code == 406 && q.stream == -1 &&
                failed.find("x-stream-offset") != std::string::npos) {
                q.stream = 0;
                retry = true;
            }
        }
        if (failed.empty()) {
            s.channel = channel;
            s.epoch = next_epoch_++;
            s.error.clear();
            s.backoff_ms = 0;
            return true;
        }
        if (code == 0 || code == -1) {
            disconnect(failed);
            return false;
        }
        // The broker closed the channel: it waits for our close-ok.
        amqp_channel_close_ok_t ok;
        amqp_send_method(c, channel, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
        if (!retry) {
            close_channel(s, failed, now_ms);
            return false;
        }
    }
    close_channel(s, "could not consume the queues", now_ms);
    return false;
}

Consumer::Sub* Consumer::by_channel(int channel) {
    for (auto& [id, s] : subs_)
        if (s.channel == channel) return &s;
    return nullptr;
}

bool Consumer::read_frames(std::size_t max, std::size_t* read) {
    amqp_connection_state_t c = state(conn_);
    int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count();
    // Bounded: at most three frames a delivery beyond `max`, or what the socket holds.
    for (std::size_t n = 0; *read < max && n < 4 * max + 64; ++n) {
        amqp_frame_t frame;
        struct timeval zero = {0, 0};
        int rc = amqp_simple_wait_frame_noblock(c, &frame, &zero);
        if (rc == AMQP_STATUS_TIMEOUT) break;
        if (rc != AMQP_STATUS_OK) {
            disconnect(std::string("connection to RabbitMQ lost: ") + amqp_error_string2(rc));
            return false;
        }
        Sub* s = frame.channel == 0 ? nullptr : by_channel(frame.channel);
        if (frame.frame_type == AMQP_FRAME_METHOD) {
            void* decoded = frame.payload.method.decoded;
            switch (frame.payload.method.id) {
                case AMQP_BASIC_DELIVER_METHOD: {
                    if (s == nullptr) break;
                    auto* d = static_cast<amqp_basic_deliver_t*>(decoded);
                    s->pending = true;
                    s->partial = Delivery{};
                    s->partial.tag = d->delivery_tag;
                    s->partial.redelivered = d->redelivered != 0;
                    s->partial.routing_key = text_of(d->routing_key);
                    std::string tag = text_of(d->consumer_tag);
                    std::size_t index = tag.size() > 1 ? std::stoul(tag.substr(1)) : 0;
                    if (index < s->queues.size()) s->partial.queue = s->queues[index].name;
                    break;
                }
                case AMQP_BASIC_CANCEL_METHOD:
                    // The queue was deleted: consumed again after a backoff (once re-declared).
                    if (s != nullptr) {
                        amqp_channel_close(c, s->channel, AMQP_REPLY_SUCCESS);
                        close_channel(*s, "RabbitMQ cancelled the consumer (queue deleted?)", now);
                        return true;  // channel.close was a synchronous call
                    }
                    break;
                case AMQP_CHANNEL_CLOSE_METHOD: {
                    auto* m = static_cast<amqp_channel_close_t*>(decoded);
                    amqp_channel_close_ok_t ok;
                    amqp_send_method(c, frame.channel, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
                    if (s != nullptr)
                        close_channel(
                            *s,
                            "channel closed by RabbitMQ: " + std::to_string(m->reply_code) + " " +
                                text_of(m->reply_text),
                            now);
                    break;
                }
                case AMQP_CONNECTION_CLOSE_METHOD: {
                    auto* m = static_cast<amqp_connection_close_t*>(decoded);
                    disconnect("connection closed by RabbitMQ: " + std::to_string(m->reply_code) +
                               " " + text_of(m->reply_text));
                    return false;
                }
                default:
                    break;
            }
        } else if (frame.frame_type == AMQP_FRAME_HEADER && s != nullptr && s->pending) {
            Delivery& d = s->partial;
            read_properties(
                *static_cast<amqp_basic_properties_t*>(frame.payload.properties.decoded), d);
            s->body_left = frame.payload.properties.body_size;
            d.body.reserve(s->body_left);
        } else if (frame.frame_type == AMQP_FRAME_BODY && s != nullptr && s->pending) {
            amqp_bytes_t b = frame.payload.body_fragment;
            s->partial.body.append(static_cast<const char*>(b.bytes), b.len);
            s->body_left -= std::min<uint64_t>(s->body_left, b.len);
        }
        if (s != nullptr && s->pending && frame.frame_type != AMQP_FRAME_METHOD &&
            s->body_left == 0) {
            if (s->batch.empty()) s->batch_channel_epoch = s->epoch;
            s->batch.push_back(std::move(s->partial));
            s->pending = false;
            ++*read;
        }
        amqp_maybe_release_buffers(c);
    }
    return true;
}

std::size_t Consumer::poll(int64_t now_ms, std::size_t max) {
    if (subs_.empty()) {
        if (conn_ != nullptr) disconnect("no subscriptions");
        last_error_.clear();
        return 0;
    }
    if (!connect(now_ms)) return 0;
    for (auto& [id, s] : subs_) {
        if (conn_ == nullptr) return 0;
        if (s.channel == 0 && now_ms >= s.open_at_ms) open(s, now_ms);
    }
    if (conn_ == nullptr) return 0;
    std::size_t read = 0;
    read_frames(max, &read);
    return read;
}

void Consumer::ack_batch(int id) {
    Sub& s = subs_.at(id);
    if (s.batch.empty()) return;
    if (conn_ != nullptr && s.channel != 0 && s.batch_channel_epoch == s.epoch) {
        int rc = amqp_basic_ack(state(conn_), s.channel, s.batch.back().tag, /*multiple=*/1);
        if (rc != AMQP_STATUS_OK)
            disconnect(std::string("acknowledging to RabbitMQ failed: ") + amqp_error_string2(rc));
    }
    s.batch.clear();
}

long Consumer::timeout_ms(int64_t now_ms) const noexcept {
    if (subs_.empty()) return -1;
    int64_t due = -1;
    if (conn_ == nullptr) {
        due = reconnect_at_ms_;
    } else {
        for (const auto& [id, s] : subs_)
            if (s.channel == 0 && (due < 0 || s.open_at_ms < due)) due = s.open_at_ms;
    }
    if (due < 0) return -1;
    return static_cast<long>(std::max<int64_t>(due - now_ms, 0));
}

}  // namespace eventbox::amqp
