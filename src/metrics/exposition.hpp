// Prometheus text exposition format 0.0.4 (pure C++): metric families with their samples,
// rendered as text (for eventbox.metrics() and GET /metrics) or walked sample by sample (for the
// eventbox.metrics view).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace eventbox::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

struct Sample {
    std::string name;  // the family's name, or name_bucket / _sum / _count for histograms
    Labels labels;
    double value = 0;
};

enum class Type { kCounter, kGauge, kHistogram };

struct Family {
    std::string name;
    std::string help;
    Type type = Type::kCounter;
    std::vector<Sample> samples;
};

class Exposition {
  public:
    // The family `name`, added (with its HELP and TYPE) on first use. Families render in the
    // order they were first added, even those without samples (HELP and TYPE only).
    Family& family(std::string_view name, std::string_view help, Type type);
    // One sample of a counter or gauge family.
    void add(Family& family, Labels labels, double value);
    // One histogram: `counts[i]` observations fell at or below `bounds[i]` (not cumulative),
    // `counts[bounds.size()]` above the last bound. Renders cumulative _bucket samples with
    // le="..." and le="+Inf", then _sum and _count.
    void add_histogram(Family& family, const Labels& labels, const std::vector<double>& bounds,
                       const std::vector<uint64_t>& counts, double sum);

    // Puts label `name`="value" first on every sample added so far (the database label).
    void label_all(std::string_view name, std::string_view value);

    const std::deque<Family>& families() const { return families_; }
    std::string render() const;

  private:
    // A deque: the references family() returns stay valid while more families are added (the
    // callers hold several at once).
    std::deque<Family> families_;
};

// Label value escaping of the text format: backslash, double quote and line feed.
std::string escape_label_value(std::string_view value);
// HELP text escaping: backslash and line feed.
std::string escape_help(std::string_view help);
// A sample value as the text format writes it: integers without exponent or fraction,
// +Inf, -Inf, NaN; other values in the fewest digits (15 to 17) that read back exactly.
std::string format_value(double value);
// The labels as a JSON object (for the view), keys in label order.
std::string labels_json(const Labels& labels);
// Whether `name` is a legal metric or label name ([a-zA-Z_:][a-zA-Z0-9_:]*; no ':' for labels).
bool valid_name(std::string_view name, bool label);

}  // namespace eventbox::metrics
