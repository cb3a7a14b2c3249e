// Lineage headers of messages sent from handlers (see outbox/lineage.hpp).
#include "outbox/lineage.hpp"

namespace eventbox::outbox {

namespace {

bool lower_hex(std::string_view s) {
    for (char c : s)
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    return true;
}

bool all_zero(std::string_view s) {
    return s.find_first_not_of('0') == std::string_view::npos;
}

// A value usable as a Kafka header from send(): non-empty, without CR, LF or NUL.
bool sendable(std::string_view v) {
    return !v.empty() && v.find_first_of(std::string_view("\r\n\0", 3)) == std::string_view::npos;
}

}  // namespace

std::optional<TraceContext> parse_traceparent(std::string_view h) {
    // version "-" trace-id "-" parent-id "-" flags: 2 + 1 + 32 + 1 + 16 + 1 + 2 = 55
    constexpr std::size_t kLength = 55;
    if (h.size() < kLength) return std::nullopt;
    std::string_view version = h.substr(0, 2), trace = h.substr(3, 32), parent = h.substr(36, 16),
                     flags = h.substr(53, 2);
    if (h[2] != '-' || h[35] != '-' || h[52] != '-') return std::nullopt;
    if (!lower_hex(version) || version == "ff") return std::nullopt;
    if (version == "00" ? h.size() != kLength : (h.size() > kLength && h[kLength] != '-'))
        return std::nullopt;
    if (!lower_hex(trace) || all_zero(trace) || !lower_hex(parent) || all_zero(parent) ||
        !lower_hex(flags))
        return std::nullopt;
    return TraceContext{std::string(trace), std::string(flags)};
}

std::string child_traceparent(const TraceContext& parent, const unsigned char span_id[8]) {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string span;
    for (int i = 0; i < 8; ++i) {
        span.push_back(kHex[span_id[i] >> 4]);
        span.push_back(kHex[span_id[i] & 15]);
    }
    if (all_zero(span)) span.back() = '1';
    return "00-" + parent.trace_id + "-" + span + "-" + parent.flags;
}

std::vector<std::pair<std::string, std::string>> lineage_headers(const Incoming& in,
                                                                 const unsigned char span_id[8],
                                                                 const bool caller_has[3]) {
    std::vector<std::pair<std::string, std::string>> out;
    if (!caller_has[0] && sendable(in.message_id))
        out.emplace_back(kCausationHeader, in.message_id);
    if (!caller_has[1]) {
        std::string_view correlation =
            in.correlation_id && sendable(*in.correlation_id) ? *in.correlation_id : in.message_id;
        if (sendable(correlation)) out.emplace_back(kCorrelationHeader, correlation);
    }
    if (!caller_has[2] && in.traceparent) {
        if (std::optional<TraceContext> parent = parse_traceparent(*in.traceparent))
            out.emplace_back(kTraceparentHeader, child_traceparent(*parent, span_id));
    }
    return out;
}

}  // namespace eventbox::outbox
