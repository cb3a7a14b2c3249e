// The relay's registry formats (see outbox/relay_formats.hpp).
#include "outbox/relay_formats.hpp"

#include <utility>

namespace eventbox::relay {

FormatSink::FormatSink(Sink& next, registry::Config config, std::vector<TopicFormat> formats,
                       std::function<int64_t()> now_ms)
    : next_(next), registry_(std::move(config)), now_ms_(std::move(now_ms)) {
    for (TopicFormat& f : formats) {
        std::string topic = f.topic;
        formats_.emplace(std::move(topic), std::move(f));
    }
}

void FormatSink::perform() {
    registry_.perform(now_ms_());
}

Produced FormatSink::produce(const Row& row, std::string& error) {
    auto it = formats_.find(std::string(row.topic));
    if (it == formats_.end() || row.payload == nullptr) return next_.produce(row, error);
    const TopicFormat& f = it->second;
    encoded_.clear();
    registry::Encoded e = registry_.encode(f.value_subject, f.value_version, row.payload,
                                           row.payload_len, &encoded_, now_ms_());
    switch (e.status) {
        case registry::Encoded::kPending:
            error = "waiting for the schema of subject \"" + f.value_subject + "\"";
            return Produced::kBusy;
        case registry::Encoded::kFailed:
            error = e.reason;
            return Produced::kFailed;
        case registry::Encoded::kRefused:
            error = e.reason;
            return Produced::kFailedPermanently;
        case registry::Encoded::kOk:
            break;
    }
    Row encoded = row;
    encoded.payload = encoded_.data();
    encoded.payload_len = encoded_.size();
    return next_.produce(encoded, error);
}

}  // namespace eventbox::relay
