// A Kafka record under construction for the tests of src/inbox/record.cpp (inbox_record_test.cpp,
// inbox_record_payload_test.cpp), and the checks they share.
#pragma once

#include "inbox/record.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace eventbox::inbox {

// A record under construction; owns the bytes the Record and KafkaHeader views point into.
class Rec {
  public:
    Rec& value(std::string v) {
        value_ = std::move(v);
        has_value_ = true;
        return *this;
    }
    Rec& tombstone() {
        has_value_ = false;
        return *this;
    }
    Rec& key(std::string k) {
        key_ = std::move(k);
        has_key_ = true;
        return *this;
    }
    Rec& header(std::string name, std::string value) {
        headers_.push_back({std::move(name), std::move(value), false});
        return *this;
    }
    Rec& null_header(std::string name) {
        headers_.push_back({std::move(name), std::string(), true});
        return *this;
    }
    // The client could not parse the record's headers (it reports none, and why).
    Rec& unreadable_headers(std::string why) {
        unreadable_ = std::move(why);
        return *this;
    }
    Rec& at(std::string topic, int32_t partition, int64_t offset) {
        topic_ = std::move(topic);
        partition_ = partition;
        offset_ = offset;
        return *this;
    }

    Classified classify(const Options& options = Options()) {
        Classified out;
        classify_into(out, options, false);
        return out;
    }

    // The same into `out`: reusing its buffers (the worker's way), or by assigning a fresh result.
    void classify_into(Classified& out, const Options& options = Options(), bool reuse = true) {
        views_.clear();
        for (const auto& h : headers_) {
            KafkaHeader k;
            k.name = h.name;
            k.value = h.is_null ? nullptr : h.value.data();
            k.value_len = h.is_null ? 0 : h.value.size();
            views_.push_back(k);
        }
        Record r;
        r.topic = topic_;
        r.partition = partition_;
        r.offset = offset_;
        r.value = has_value_ ? value_.data() : nullptr;
        r.value_len = has_value_ ? value_.size() : 0;
        r.key = has_key_ ? key_.data() : nullptr;
        r.key_len = has_key_ ? key_.size() : 0;
        r.headers = views_.empty() ? nullptr : views_.data();
        r.n_headers = views_.size();
        r.headers_unreadable = !unreadable_.empty();
        r.headers_error = unreadable_;
        if (reuse)
            eventbox::inbox::classify(r, options, out);
        else
            out = eventbox::inbox::classify(r, options);
    }

  private:
    struct Header {
        std::string name;
        std::string value;
        bool is_null;
    };
    std::string topic_ = "orders";
    int32_t partition_ = 2;
    int64_t offset_ = 41;
    std::string value_ = "{}";
    bool has_value_ = true;
    std::string key_;
    bool has_key_ = false;
    std::vector<Header> headers_;
    std::vector<KafkaHeader> views_;
    std::string unreadable_;
};

inline Options with_field(std::string field) {
    Options o;
    o.message_id_field = std::move(field);
    return o;
}

inline bool utf8(const std::string& s) {
    return valid_utf8(s.data(), s.size());
}

// Expects a value stored as raw bytes (payload NULL) with `note` in last_error.
inline void expect_unparsable(const std::string& value, std::size_t raw_len,
                              const std::string& note) {
    Classified c = Rec().value(value).classify();
    EXPECT_FALSE(c.parsable) << value;
    EXPECT_FALSE(c.raw_null) << value;
    EXPECT_EQ(c.raw_len, raw_len) << value;
    // JSON notes go on with the reason ("value is not valid JSON: expected ':'").
    EXPECT_EQ(c.note.substr(0, note.size()), note) << value;
}

inline void expect_parsable(const std::string& value) {
    Classified c = Rec().value(value).classify();
    EXPECT_TRUE(c.parsable) << value;
    EXPECT_FALSE(c.raw_null) << value;
    EXPECT_EQ(c.raw_len, 0u) << value;
    EXPECT_EQ(c.note, "") << value;
}

}  // namespace eventbox::inbox
