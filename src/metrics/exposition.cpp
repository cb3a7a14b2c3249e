// Prometheus text exposition format 0.0.4 (see metrics/exposition.hpp).
#include "metrics/exposition.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "messages/json_write.hpp"

namespace eventbox::metrics {

namespace {

const char* type_name(Type type) {
    switch (type) {
        case Type::kCounter:
            return "counter";
        case Type::kGauge:
            return "gauge";
        case Type::kHistogram:
            return "histogram";
    }
    return "untyped";
}

void render_labels(std::string& out, const Labels& labels) {
    if (labels.empty()) return;
    out += '{';
    bool first = true;
    for (const auto& [name, value] : labels) {
        if (!first) out += ',';
        first = false;
        out += name;
        out += "=\"";
        out += escape_label_value(value);
        out += '"';
    }
    out += '}';
}

}  // namespace

bool valid_name(std::string_view name, bool label) {
    if (name.empty()) return false;
    for (std::size_t i = 0; i < name.size(); ++i) {
        char c = name[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                  (!label && c == ':') || (i > 0 && c >= '0' && c <= '9');
        if (!ok) return false;
    }
    return true;
}

std::string escape_label_value(std::string_view value) {
    std::string out;
    out.reserve(value.size());
    for (char c : value) {
        if (c == '\\')
            out += "\\\\";
        else if (c == '"')
            out += "\\\"";
        else if (c == '\n')
            out += "\\n";
        else
            out += c;
    }
    return out;
}

std::string escape_help(std::string_view help) {
    std::string out;
    out.reserve(help.size());
    for (char c : help) {
        if (c == '\\')
            out += "\\\\";
        else if (c == '\n')
            out += "\\n";
        else
            out += c;
    }
    return out;
}

std::string format_value(double value) {
    if (std::isnan(value)) return "NaN";
    if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
    char buf[64];
    if (value == std::floor(value) && std::fabs(value) < 1e15) {
        std::snprintf(buf, sizeof buf, "%.0f", value);
        if (std::string_view(buf) == "-0") return "0";
    } else {
        // The shortest of 15..17 significant digits that reads back as the same double.
        for (int digits = 15; digits <= 17; ++digits) {
            std::snprintf(buf, sizeof buf, "%.*g", digits, value);
            if (std::strtod(buf, nullptr) == value) break;
        }
    }
    return buf;
}

std::string labels_json(const Labels& labels) {
    std::string out = "{";
    bool first = true;
    for (const auto& [name, value] : labels) {
        if (!first) out += ", ";
        first = false;
        messages::append_json_string(out, name);
        out += ": ";
        messages::append_json_string(out, value);
    }
    out += '}';
    return out;
}

Family& Exposition::family(std::string_view name, std::string_view help, Type type) {
    for (Family& f : families_)
        if (f.name == name) return f;
    if (!valid_name(name, false))
        throw std::invalid_argument("invalid metric name: " + std::string(name));
    families_.push_back(Family{std::string(name), std::string(help), type, {}});
    return families_.back();
}

void Exposition::add(Family& family, Labels labels, double value) {
    family.samples.push_back(Sample{family.name, std::move(labels), value});
}

void Exposition::add_histogram(Family& family, const Labels& labels,
                               const std::vector<double>& bounds,
                               const std::vector<uint64_t>& counts, double sum) {
    uint64_t cumulative = 0;
    for (std::size_t i = 0; i <= bounds.size(); ++i) {
        cumulative += i < counts.size() ? counts[i] : 0;
        Labels with_le = labels;
        with_le.emplace_back("le", i < bounds.size() ? format_value(bounds[i]) : "+Inf");
        family.samples.push_back(
            Sample{family.name + "_bucket", std::move(with_le), static_cast<double>(cumulative)});
    }
    family.samples.push_back(Sample{family.name + "_sum", labels, sum});
    family.samples.push_back(
        Sample{family.name + "_count", labels, static_cast<double>(cumulative)});
}

void Exposition::label_all(std::string_view name, std::string_view value) {
    for (Family& f : families_)
        for (Sample& s : f.samples)
            s.labels.insert(s.labels.begin(), {std::string(name), std::string(value)});
}

std::string Exposition::render() const {
    std::string out;
    for (const Family& f : families_) {
        out += "# HELP ";
        out += f.name;
        out += ' ';
        out += escape_help(f.help);
        out += "\n# TYPE ";
        out += f.name;
        out += ' ';
        out += type_name(f.type);
        out += '\n';
        for (const Sample& s : f.samples) {
            out += s.name;
            render_labels(out, s.labels);
            out += ' ';
            out += format_value(s.value);
            out += '\n';
        }
    }
    return out;
}

}  // namespace eventbox::metrics
