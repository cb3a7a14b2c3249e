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

bool FormatSink::encode(const std::string& subject, int version, const char* json, std::size_t len,
                        const char* what, std::string* out, std::string& error, Produced* answer) {
    out->clear();
    registry::Encoded e = registry_.encode(subject, version, json, len, out, now_ms_());
    switch (e.status) {
        case registry::Encoded::kOk:
            return true;
        case registry::Encoded::kPending:
            error = "waiting for the schema of subject \"" + subject + "\"";
            *answer = Produced::kBusy;
            return false;
        case registry::Encoded::kFailed:
            error = e.reason;
            *answer = Produced::kFailed;
            return false;
        case registry::Encoded::kRefused:
            error = std::string(what) + e.reason;
            *answer = Produced::kFailedPermanently;
            return false;
    }
    return false;
}

Produced FormatSink::produce(const Row& row, std::string& error) {
    auto it = formats_.find(row.topic);
    if (it == formats_.end()) return next_.produce(row, error);
    const TopicFormat& f = it->second;
    Row encoded = row;
    Produced answer = Produced::kFailed;
    if (!f.value_subject.empty() && row.payload != nullptr) {
        if (!encode(f.value_subject, f.value_version, row.payload, row.payload_len, "", &value_,
                    error, &answer))
            return answer;
        encoded.payload = value_.data();
        encoded.payload_len = value_.size();
    }
    if (!f.key_subject.empty() && row.key != nullptr) {
        if (!encode(f.key_subject, f.key_version, row.key, row.key_len, "key: ", &key_, error,
                    &answer))
            return answer;
        encoded.key = key_.data();
        encoded.key_len = key_.size();
    }
    return next_.produce(encoded, error);
}

}  // namespace eventbox::relay
