// send()'s check of registry formats (see outbox/send_formats.hpp).
#include "outbox/send_formats.hpp"

#include <algorithm>
#include <utility>

namespace eventbox::outbox {

FormatCheck::FormatCheck() = default;
FormatCheck::~FormatCheck() = default;

void FormatCheck::configure(std::vector<relay::TopicFormat> formats, const std::string& settings,
                            registry::Config config) {
    std::sort(
        formats.begin(), formats.end(),
        [](const relay::TopicFormat& a, const relay::TopicFormat& b) { return a.topic < b.topic; });
    formats_ = std::move(formats);
    if (registry_ != nullptr && settings == settings_) return;
    registry_.reset();
    settings_ = settings;
    if (!formats_.empty()) registry_ = std::make_unique<registry::Registry>(std::move(config));
}

const relay::TopicFormat* FormatCheck::format(std::string_view topic) const noexcept {
    auto it = std::lower_bound(
        formats_.begin(), formats_.end(), topic,
        [](const relay::TopicFormat& f, std::string_view t) { return f.topic < t; });
    return it != formats_.end() && it->topic == topic ? &*it : nullptr;
}

FormatVerdict FormatCheck::check(const relay::TopicFormat& format, const char* payload,
                                 std::size_t payload_len, const char* key, std::size_t key_len,
                                 int64_t now_ms) {
    FormatVerdict verdict;
    if (registry_ == nullptr) return verdict;
    registry_->perform(now_ms);
    auto refuses = [&](const std::string& subject, int version, const char* json, std::size_t len) {
        if (subject.empty() || json == nullptr) return false;
        scratch_.clear();
        registry::Encoded e = registry_->encode(subject, version, json, len, &scratch_, now_ms);
        if (e.status != registry::Encoded::kRefused || !e.payload_refused) return false;
        verdict.reason = std::move(e.reason);
        return true;
    };
    if (refuses(format.value_subject, format.value_version, payload, payload_len)) {
        verdict.refused = true;
    } else if (refuses(format.key_subject, format.key_version, key, key_len)) {
        verdict.refused = true;
        verdict.key = true;
    }
    return verdict;
}

}  // namespace eventbox::outbox
