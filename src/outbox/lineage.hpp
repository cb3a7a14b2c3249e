// Lineage headers that eventbox.send() adds to a message sent while a handler runs: what caused
// it, the conversation it belongs to, and its place in the trace. Pure C++.
//
//   causation_id    the id of the message being handled
//   correlation_id  that message's correlation_id header, else its id
//   traceparent     W3C Trace Context: the incoming trace id and flags with a new parent id,
//                   when the incoming message carried a valid traceparent
//
// A header the caller sets itself is left as the caller set it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace eventbox::outbox {

inline constexpr std::string_view kCausationHeader = "causation_id";
inline constexpr std::string_view kCorrelationHeader = "correlation_id";
inline constexpr std::string_view kTraceparentHeader = "traceparent";

// The parts of a W3C traceparent header that a child keeps.
struct TraceContext {
    std::string trace_id;  // 32 lower-case hex digits, not all zero
    std::string flags;     // 2 lower-case hex digits
};

// Parses a traceparent header as W3C Trace Context (level 1) says: version 00 exactly
// "00-<trace-id>-<parent-id>-<flags>"; a later version (not "ff") as at least those fields,
// followed by nothing or by "-..." . Upper-case hex and all-zero ids are invalid.
std::optional<TraceContext> parse_traceparent(std::string_view header);

// A version-00 traceparent continuing `parent` with `span_id` (8 bytes; all zero is replaced by
// ...01, since an all-zero parent id is invalid) as its parent id.
std::string child_traceparent(const TraceContext& parent, const unsigned char span_id[8]);

// What the handled message says about lineage.
struct Incoming {
    std::string_view message_id;
    std::optional<std::string_view> correlation_id;  // its header of that name
    std::optional<std::string_view> traceparent;     // its header of that name
};

// The headers to add (name, value) in the order causation_id, correlation_id, traceparent,
// leaving out header i when caller_has[i] (the caller set it), and those whose value could not
// be sent as a header (empty, or with CR, LF or NUL).
std::vector<std::pair<std::string, std::string>> lineage_headers(const Incoming& in,
                                                                 const unsigned char span_id[8],
                                                                 const bool caller_has[3]);

}  // namespace eventbox::outbox
