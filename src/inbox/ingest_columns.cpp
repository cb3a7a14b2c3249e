// The ingest worker's rows: a batch's records classified in C++ (inbox/record.hpp), then turned
// into the array parameters of the insert (see inbox/ingest.hpp).
#include "inbox/ingest.hpp"

extern "C" {
#include "catalog/pg_type.h"
#include "utils/builtins.h"
}

#include <algorithm>
#include <string>
#include <vector>

#include "inbox/jsonb.hpp"
#include "inbox/raw_headers.hpp"
#include "pg/boundary.hpp"
#include "registry/registry.hpp"

namespace eventbox::ingest {

using pg::call_cpp;

// ---- the records, classified in C++ ---------------------------------------------------------

void order_rows(Subscription* sub, std::size_t n) {
    sub->order.clear();
    sub->skipped = 0;
    for (std::size_t k = 0; k < n; ++k) {
        if (sub->rows[k].skip)
            ++sub->skipped;
        else
            sub->order.push_back(static_cast<int>(k));
    }
    std::stable_sort(sub->order.begin(), sub->order.end(), [&](int a, int b) {
        return sub->rows[a].message_id < sub->rows[b].message_id;
    });
}

std::size_t IngestState::classify(Subscription* sub, std::size_t from, std::size_t to) {
    return call_cpp([&] {
        std::size_t n = to - from;
        // The rows of earlier batches are reused: their strings keep their buffers.
        if (sub->rows.size() < n) sub->rows.resize(n);
        std::vector<inbox::KafkaHeader> headers;
        const std::vector<rd_kafka_message_t*>& batch = consumer_->batch(sub->id);
        for (std::size_t i = 0; i < n; ++i) {
            rd_kafka_message_t* msg = batch[from + i];
            headers.clear();
            rd_kafka_headers_t* hdrs = nullptr;
            rd_kafka_resp_err_t herr = rd_kafka_message_headers(msg, &hdrs);
            if (herr == RD_KAFKA_RESP_ERR_NO_ERROR) {
                const char* name;
                const void* value;
                size_t size;
                for (size_t idx = 0; rd_kafka_header_get_all(hdrs, idx, &name, &value, &size) ==
                                     RD_KAFKA_RESP_ERR_NO_ERROR;
                     ++idx)
                    headers.push_back(
                        inbox::KafkaHeader{name, static_cast<const char*>(value), size});
            }
            inbox::Record record;
            record.topic = rd_kafka_topic_name(msg->rkt);
            record.partition = msg->partition;
            record.offset = msg->offset;
            record.value = static_cast<const char*>(msg->payload);
            record.value_len = msg->len;
            record.key = static_cast<const char*>(msg->key);
            record.key_len = msg->key_len;
            record.headers = headers.data();
            record.n_headers = headers.size();
            // NOENT: the record has no headers. Anything else: it has some we cannot read.
            if (herr != RD_KAFKA_RESP_ERR_NO_ERROR && herr != RD_KAFKA_RESP_ERR__NOENT) {
                record.headers_unreadable = true;
                record.headers_error = rd_kafka_err2str(herr);
            }
            inbox::classify(record, sub->options, sub->rows[i]);
            if (sub->rows[i].pending) {
                // This record waits for its schema, and so do the records after it; their
                // schemas are fetched in the same round (registry/registry.hpp).
                sub->waiting_for = sub->rows[i].pending_id;
                for (std::size_t k = i + 1; k < n; ++k) {
                    const rd_kafka_message_t* later = batch[from + k];
                    if (sub->options.registry_values)
                        sub->options.registry->prefetch(static_cast<const char*>(later->payload),
                                                        later->len);
                    if (sub->options.registry_keys && later->key != nullptr)
                        sub->options.registry->prefetch(static_cast<const char*>(later->key),
                                                        later->key_len);
                }
                n = i;
                break;
            }
        }
        // Rows go in by message id: ingest workers inserting the same ids at once (a message
        // republished to partitions of two workers; a partition read by its old and new owner
        // while eventbox.ingest_workers changes) then wait for each other in one order, never
        // in a cycle. Every worker sorts, whatever it believes the worker count is. Records the
        // rule skips (tombstones, resolved timestamps) get no row: only their offsets are stored.
        order_rows(sub, n);
        return n;
    });
}

int64 IngestState::backfill_until(const Subscription* sub, const rd_kafka_message_t* msg) const {
    return call_cpp([&] {
        return consumer_->backfill_until(sub->id, rd_kafka_topic_name(msg->rkt), msg->partition);
    });
}

// ---- the columns ----------------------------------------------------------------------------

Columns::Columns(int n)
    : count(n),
      ids(n, TEXTOID),
      topics(n, TEXTOID),
      partitions(n, INT4OID),
      offsets(n, INT8OID),
      keys(n, BYTEAOID),
      key_payloads(n, JSONBOID),
      headers(n, JSONBOID),
      payloads(n, JSONBOID),
      raws(n, BYTEAOID),
      types(n, TEXTOID),
      statuses(n, TEXTOID),
      notes(n, TEXTOID),
      modes(n, TEXTOID),
      raw_headers(n, BYTEAOID),
      unparsable_ids(n, TEXTOID) {}

namespace {

bytea* to_bytea(const void* data, std::size_t len) {
    auto* b = static_cast<bytea*>(palloc(VARHDRSZ + len));
    SET_VARSIZE(b, VARHDRSZ + len);
    if (len > 0) memcpy(VARDATA(b), data, len);
    return b;
}

}  // namespace

ColumnBuilder::ColumnBuilder(const Subscription* sub, Columns* columns)
    : sub_(sub),
      c_(columns),
      received_(CStringGetTextDatum("received")),
      unparsable_(CStringGetTextDatum("unparsable")),
      live_(CStringGetTextDatum("live")),
      backfill_(CStringGetTextDatum("backfill")) {}

void ColumnBuilder::add(int i, const RecordBytes& r, inbox::Classified& row) {
    c_->ids.set(
        i, PointerGetDatum(cstring_to_text_with_len(row.message_id.data(), row.message_id.size())));
    c_->transport_ids += row.transport_id ? 1 : 0;
    c_->topics.set(i, topic(r));
    c_->partitions.set(i, Int32GetDatum(r.partition));
    c_->offsets.set(i, Int64GetDatum(r.offset));
    if (r.key != nullptr) c_->keys.set(i, PointerGetDatum(to_bytea(r.key, r.key_len)));
    c_->headers.set(i, inbox::headers_jsonb(row));
    key_payload(i, r, row);
    payload(i, r, row);
    if (row.event_type) c_->types.set(i, event_type(*row.event_type));
    c_->statuses.set(i, row.parsable ? received_ : unparsable_);
    // Below the partition's boundary: in the partition when the subscription was created.
    if (sub_->backfill) c_->modes.set(i, r.backfill ? backfill_ : live_);
    if (!row.parsable) c_->unparsable_ids.set(c_->unparsable_rows++, c_->ids.value(i));
}

Datum ColumnBuilder::topic(const RecordBytes& r) {
    if (topic_of_ == nullptr || topic_len_ != r.topic_len ||
        (topic_of_ != r.topic && memcmp(topic_of_, r.topic, r.topic_len) != 0)) {
        topic_ = PointerGetDatum(cstring_to_text_with_len(r.topic, r.topic_len));
        topic_of_ = r.topic;
        topic_len_ = r.topic_len;
    }
    return topic_;
}

Datum ColumnBuilder::event_type(const std::string& type) {
    if (type_of_ == nullptr || *type_of_ != type) {
        type_of_ = &type;
        type_ = PointerGetDatum(cstring_to_text_with_len(type.data(), type.size()));
    }
    return type_;
}

// key_format 'registry': the decoded key; one jsonb refuses makes the record unparsable.
void ColumnBuilder::key_payload(int i, const RecordBytes& r, inbox::Classified& row) {
    if (!row.key_decoded_ok) return;
    Datum key;
    // The reason replaces the decoded key (no string on this frame: an ERROR may cross it).
    if (inbox::text_jsonb(row.key_decoded.data(), row.key_decoded.size(), &key, &row.key_decoded)) {
        c_->key_payloads.set(i, key);
        return;
    }
    if (row.parsable && !row.keep_raw) row.raw_len = r.value_len;
    row.parsable = false;
    row.key_decoded.insert(0, "key: ");
    if (!row.note.empty()) row.key_decoded.append("; ").append(row.note);
    row.note.swap(row.key_decoded);
}

// The value as jsonb, or else as raw bytes with the reason it is unparsable. The bytes of a
// value stored as jsonb too when the subscription keeps them (inbox::keeps_raw()); a registry
// format's payload is its decoded text, and its bytes stay in raw_payload.
void ColumnBuilder::payload(int i, const RecordBytes& r, inbox::Classified& row) {
    Datum payload;
    bool decoded = row.keep_raw;
    const char* text = decoded ? row.decoded.data() : r.value;
    std::size_t text_len = decoded ? row.decoded.size() : r.value_len;
    if (row.parsable && inbox::payload_jsonb(row, text, text_len, &payload, &row.note)) {
        c_->payloads.set(i, payload);
        if (sub_->options.keep_raw || row.keep_raw) {
            c_->raws.set(i, PointerGetDatum(to_bytea(r.value, r.value_len)));
            raw_headers(i, r);
        }
        return;
    }
    if (row.parsable) row.raw_len = r.value_len;  // jsonb refused what looked like JSON
    row.parsable = false;
    if (!row.raw_null) c_->raws.set(i, PointerGetDatum(to_bytea(r.value, row.raw_len)));
    if (!row.raw_null || sub_->options.keep_raw) raw_headers(i, r);
    c_->notes.set(i, CStringGetTextDatum(row.note.c_str()));
}

// Where the value's bytes are kept, a Kafka record's headers too, exactly
// (inbox/raw_headers.hpp): a dead letter publishes them again as they came. Nothing for a record
// without headers, or for a RabbitMQ delivery (its headers are an AMQP table, kept as jsonb).
void ColumnBuilder::raw_headers(int i, const RecordBytes& r) {
    if (r.kafka == nullptr) return;
    rd_kafka_headers_t* hdrs = nullptr;
    if (rd_kafka_message_headers(r.kafka, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR) return;
    std::size_t n = rd_kafka_header_cnt(hdrs);
    if (n == 0) return;
    auto* headers = static_cast<inbox::KafkaHeader*>(palloc(sizeof(inbox::KafkaHeader) * n));
    std::size_t got = 0;
    const char* name;
    const void* value;
    size_t size;
    while (got < n &&
           rd_kafka_header_get_all(hdrs, got, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        headers[got] = inbox::KafkaHeader{name, static_cast<const char*>(value), size};
        ++got;
    }
    std::size_t len = inbox::raw_headers_size(headers, got);
    auto* b = static_cast<bytea*>(palloc(VARHDRSZ + len));
    SET_VARSIZE(b, VARHDRSZ + len);
    inbox::write_raw_headers(headers, got, VARDATA(b));
    pfree(headers);
    c_->raw_headers.set(i, PointerGetDatum(b));
}

void build_columns(Subscription* sub, rd_kafka_message_t* const* messages, Columns* columns,
                   worker::WorkContext* context) {
    ColumnBuilder builder(sub, columns);
    bool one_lane = true;
    for (int i = 0; i < columns->count; ++i) {
        int k = sub->order[i];
        rd_kafka_message_t* msg = messages[k];
        one_lane =
            one_lane && msg->rkt == messages[0]->rkt && msg->partition == messages[0]->partition;
        context->topic = rd_kafka_topic_name(msg->rkt);
        context->partition = msg->partition;
        RecordBytes r;
        r.topic = context->topic;
        r.topic_len = strlen(r.topic);
        r.partition = msg->partition;
        r.offset = msg->offset;
        r.key = static_cast<const char*>(msg->key);
        r.key_len = msg->key_len;
        r.value = static_cast<const char*>(msg->payload);
        r.value_len = msg->len;
        r.backfill = sub->backfill && msg->offset < state.backfill_until(sub, msg);
        r.kafka = msg;
        builder.add(i, r, sub->rows[k]);
    }
    if (!one_lane) {
        context->topic = nullptr;
        context->partition = -1;
    }
}

}  // namespace eventbox::ingest
