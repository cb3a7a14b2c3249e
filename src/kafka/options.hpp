// Parsing of eventbox.kafka_options ("key=value,key=value"; "\," and "\\" escape). Values may be
// credentials: no error message produced here ever contains a value.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace eventbox {

using KafkaOption = std::pair<std::string, std::string>;

// Parses the option string; throws eventbox::Error (22023) naming the position or key, never
// the value.
std::vector<KafkaOption> parse_kafka_options(std::string_view text);

// Removes the values of sensitive options (passwords, secrets, tokens, keys, JAAS and OAUTHBEARER
// configs) from text librdkafka produced, such as its log lines, which may quote them whole or in
// part: every token of such a value (split on spaces, ',', ';', '=') is replaced by "***".
class SecretScrubber {
  public:
    SecretScrubber() = default;
    explicit SecretScrubber(const std::vector<KafkaOption>& options);
    std::string scrub(std::string text) const;

  private:
    std::vector<std::string> secrets_;  // longest first
};

// Non-throwing check for GUC check hooks: on failure writes a value-free reason to `why`.
bool kafka_options_valid(const char* text, char* why, std::size_t why_size) noexcept;

}  // namespace eventbox
