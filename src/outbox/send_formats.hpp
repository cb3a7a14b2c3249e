// send()'s check of payloads and keys sent to topics with a registry format
// (eventbox.set_topic_format(), docs/guide/formats.md): a payload the subject's schema cannot
// encode is refused at send() when this backend already has the schema; otherwise it is
// accepted and the relay decides (it fails the row with the reason, and its key moves on).
// The schemas are fetched in the background (libcurl's multi interface, driven by the next
// send() calls): a send() never waits for the registry. Pure C++.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/relay_formats.hpp"
#include "registry/registry.hpp"

namespace eventbox::outbox {

// What the check made of a payload and key.
struct FormatVerdict {
    bool refused = false;
    bool key = false;    // the key was refused (else the payload)
    std::string reason;  // the registry's reason: subject, schema id, the value's path
};

class FormatCheck {
  public:
    FormatCheck();
    ~FormatCheck();
    FormatCheck(const FormatCheck&) = delete;
    FormatCheck& operator=(const FormatCheck&) = delete;

    // The topics' formats, and the registry's settings (`settings`: what they were made of; a
    // change of them starts a new registry client, the same keeps the schemas fetched).
    void configure(std::vector<relay::TopicFormat> formats, const std::string& settings,
                   registry::Config config);
    bool empty() const noexcept { return formats_.empty(); }
    // Whether the settings configure() was given were `url` + "|" + `options`.
    bool same_settings(std::string_view url, std::string_view options) const noexcept {
        return settings_.size() == url.size() + 1 + options.size() &&
               settings_.compare(0, url.size(), url) == 0 && settings_[url.size()] == '|' &&
               settings_.compare(url.size() + 1, std::string::npos, options) == 0;
    }
    // The format of `topic`, or nullptr.
    const relay::TopicFormat* format(std::string_view topic) const noexcept;

    // Checks the JSON texts of a payload and a key (nullptr: none) against `format`'s subjects at
    // `now_ms`. Refused only when the schema is at hand and refuses them; a schema still to be
    // fetched, or a registry that cannot be asked, lets them through (the fetch goes on).
    FormatVerdict check(const relay::TopicFormat& format, const char* payload,
                        std::size_t payload_len, const char* key, std::size_t key_len,
                        int64_t now_ms);

  private:
    std::vector<relay::TopicFormat> formats_;  // by topic
    std::string settings_;
    std::unique_ptr<registry::Registry> registry_;
    std::string scratch_;
};

}  // namespace eventbox::outbox
