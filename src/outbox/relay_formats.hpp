// The relay's registry formats: rows of topics set with eventbox.set_topic_format() are encoded
// (their values, their keys, or both: each JSON text) into the Schema Registry's wire format
// with their subject's schema before they go to Kafka
// (docs/guide/formats.md). A relay::Sink in front of Kafka's. Pure C++.
//
// A row whose subject's schema is not cached yet is handed back as kBusy (the dispatcher holds
// it, in its lane's order, and offers it again after a short backoff) while the schema is
// fetched; a registry that cannot be asked makes it a failed attempt (retried with backoff); a
// subject the registry does not have, or a payload its schema refuses, fails the row
// permanently with the reason: its key moves on once it is 'failed'.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "outbox/relay_dispatch.hpp"
#include "registry/registry.hpp"

namespace eventbox::relay {

struct TopicFormat {
    std::string topic;
    std::string value_subject;  // value_format 'registry': its subject ("": values as sent)
    int value_version = 0;      // 0: latest
    std::string key_subject;    // key_format 'registry': its subject ("": keys as sent)
    int key_version = 0;
};

class FormatSink final : public Sink {
  public:
    // `now_ms` gives the clock (epoch ms) the registry's subject cache is kept by.
    FormatSink(Sink& next, registry::Config config, std::vector<TopicFormat> formats,
               std::function<int64_t()> now_ms);
    Produced produce(const Row& row, std::string& error) override;

    // Serves the registry's transfers; whether some are open (the relay then wakes up soon).
    void perform();
    bool busy() const noexcept { return registry_.busy(); }
    std::size_t topics() const noexcept { return formats_.size(); }

  private:
    Sink& next_;
    registry::Registry registry_;
    // By topic, looked up by the row's string_view (no string built per row).
    std::map<std::string, TopicFormat, std::less<>> formats_;
    std::function<int64_t()> now_ms_;
    // Encodes `json` with `subject` into `out`; what produce() answers unless kQueued.
    bool encode(const std::string& subject, int version, const char* json, std::size_t len,
                const char* what, std::string* out, std::string& error, Produced* answer);

    std::string value_, key_;  // the last row's wire bytes (the next sink copies them)
};

}  // namespace eventbox::relay
