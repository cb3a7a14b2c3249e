// Bulk requests and signatures of HTTP destinations (src/outbox/http_bulk.cpp): the body of each
// batch format, the request's idempotency key, the settling of each record from every shape of
// response (partial failures by position and by id, as a JSON array or NDJSON lines, 207 with
// garbage, mismatched counts, mixed shapes), and the Standard Webhooks signature against a known
// vector.
#include "outbox/http_bulk.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace eventbox::http {
namespace {

BulkRecord record(const std::string& id, const std::string& payload, bool json = true) {
    BulkRecord r;
    r.message_id = id;
    r.has_key = true;
    r.key = "k-" + id;
    r.has_payload = true;
    r.payload = payload;
    r.json = json;
    r.headers = {{"event_type", "Created"}};
    return r;
}

TEST(HttpBulkFormat, Names) {
    BatchFormat f;
    EXPECT_TRUE(parse_batch_format("json_array", &f));
    EXPECT_EQ(f, BatchFormat::kJsonArray);
    EXPECT_TRUE(parse_batch_format("ndjson", &f));
    EXPECT_EQ(f, BatchFormat::kNdjson);
    EXPECT_TRUE(parse_batch_format("sobject_collections", &f));
    EXPECT_EQ(f, BatchFormat::kSobjectCollections);
    EXPECT_FALSE(parse_batch_format("xml", &f));
    EXPECT_STREQ(bulk_content_type(BatchFormat::kNdjson), "application/x-ndjson");
    EXPECT_STREQ(bulk_content_type(BatchFormat::kJsonArray), "application/json");
}

TEST(HttpBulkBody, JsonArrayCarriesIdsKeysHeadersAndPayloads) {
    BulkRecord a = record("a", "{\"n\":1}");
    BulkRecord b = record("b", std::string("\x00\xff", 2), false);
    b.has_key = false;
    BulkRecord c = record("c", "");
    c.has_payload = false;
    c.key = "\xff\xfe";  // not UTF-8
    std::string body = bulk_body(BatchFormat::kJsonArray, "crm.t", {&a, &b, &c});
    auto doc = nlohmann::json::parse(body);
    ASSERT_EQ(doc.size(), 3u);
    EXPECT_EQ(doc[0]["id"], "a");
    EXPECT_EQ(doc[0]["topic"], "crm.t");
    EXPECT_EQ(doc[0]["key"], "k-a");
    EXPECT_EQ(doc[0]["headers"]["event_type"], "Created");
    EXPECT_EQ(doc[0]["payload"]["n"], 1);
    EXPECT_TRUE(doc[1]["key"].is_null());
    EXPECT_EQ(doc[1]["payload_base64"], "AP8=");
    EXPECT_TRUE(doc[2]["payload"].is_null());
    EXPECT_EQ(doc[2]["key_base64"], "//4=");
}

TEST(HttpBulkBody, NdjsonIsOneRecordALine) {
    BulkRecord a = record("a", "{\"n\":1}");
    BulkRecord b = record("b", "[1,2]");
    std::string body = bulk_body(BatchFormat::kNdjson, "t", {&a, &b});
    auto nl = body.find('\n');
    ASSERT_NE(nl, std::string::npos);
    EXPECT_EQ(nlohmann::json::parse(body.substr(0, nl))["id"], "a");
    EXPECT_EQ(nlohmann::json::parse(body.substr(nl + 1))["payload"][1], 2);
    EXPECT_EQ(body.back(), '\n');
}

TEST(HttpBulkBody, SobjectCollectionsCarriesThePayloadsAsRecords) {
    BulkRecord a = record("a", "{\"attributes\":{\"type\":\"Account\"},\"Name\":\"x\"}");
    BulkRecord b = record("b", " {\"Name\":\"y\"}");
    EXPECT_TRUE(bulk_accepts(BatchFormat::kSobjectCollections, a));
    EXPECT_TRUE(bulk_accepts(BatchFormat::kSobjectCollections, b));
    EXPECT_FALSE(bulk_accepts(BatchFormat::kSobjectCollections, record("c", "[1]")));
    EXPECT_FALSE(bulk_accepts(BatchFormat::kSobjectCollections, record("d", "xx", false)));
    EXPECT_TRUE(bulk_accepts(BatchFormat::kJsonArray, record("d", "xx", false)));
    auto doc = nlohmann::json::parse(bulk_body(BatchFormat::kSobjectCollections, "t", {&a, &b}));
    EXPECT_EQ(doc["allOrNone"], false);
    ASSERT_EQ(doc["records"].size(), 2u);
    EXPECT_EQ(doc["records"][1]["Name"], "y");
}

TEST(HttpBulkKey, DerivedFromTheMessagesInOrder) {
    std::string k1 = bulk_idempotency_key({"a", "b"});
    EXPECT_EQ(k1, bulk_idempotency_key({"a", "b"}));
    EXPECT_NE(k1, bulk_idempotency_key({"b", "a"}));
    EXPECT_NE(k1, bulk_idempotency_key({"ab"}));
    ASSERT_EQ(k1.size(), 36u);
    EXPECT_EQ(k1[8], '-');
    EXPECT_EQ(k1[14], '8');  // version 8
}

std::vector<Settled> settled(const std::vector<RecordResult>& results) {
    std::vector<Settled> out;
    for (const auto& r : results) out.push_back(r.settled);
    return out;
}

const auto D = Settled::kDelivered;
const auto T = Settled::kTransient;
const auto P = Settled::kPermanent;

TEST(HttpBulkSettle, NoResultsMeansAllDelivered) {
    std::vector<std::string_view> ids = {"a", "b"};
    EXPECT_EQ(settled(settle_bulk(BatchFormat::kJsonArray, 204, "", "", false, ids)),
              (std::vector<Settled>{D, D}));
    EXPECT_EQ(settled(settle_bulk(BatchFormat::kNdjson, 200, "", "{\"ok\":true}", false, ids)),
              (std::vector<Settled>{D, D}));
    EXPECT_EQ(settled(settle_bulk(BatchFormat::kJsonArray, 202, "", "accepted", false, ids)),
              (std::vector<Settled>{D, D}));
}

TEST(HttpBulkSettle, ByPosition) {
    std::vector<std::string_view> ids = {"a", "b", "c", "d"};
    auto r = settle_bulk(BatchFormat::kJsonArray, 207, "",
                         R"([{"status":201},{"status":503,"error":"busy"},{"status":422,
                             "error":"bad total"},{}])",
                         false, ids);
    EXPECT_EQ(settled(r), (std::vector<Settled>{D, T, P, D}));
    EXPECT_NE(r[2].error.find("bad total"), std::string::npos);
    EXPECT_NE(r[2].error.find("HTTP 207"), std::string::npos);
}

TEST(HttpBulkSettle, ById) {
    std::vector<std::string_view> ids = {"a", "b", "c"};
    // Any order; "c" has no entry: it is retried, never taken as delivered.
    auto r = settle_bulk(BatchFormat::kNdjson, 200, "",
                         R"([{"id":"b","success":false,"errors":["dup"]},{"id":"a","success":true},
                             {"id":"zz","success":true}])",
                         false, ids);
    EXPECT_EQ(settled(r), (std::vector<Settled>{D, P, T}));
}

TEST(HttpBulkSettle, SobjectCollectionsByPositionOnly) {
    std::vector<std::string_view> ids = {"m1", "m2", "m3"};
    auto r = settle_bulk(BatchFormat::kSobjectCollections, 200, "",
                         R"([{"id":"001xx1","success":true,"errors":[]},
                             {"success":false,"errors":[{"statusCode":"REQUIRED_FIELD_MISSING",
                               "message":"Required fields are missing: [Name]","fields":["Name"]}]},
                             {"id":"001xx3","success":true,"errors":[]}])",
                         false, ids);
    EXPECT_EQ(settled(r), (std::vector<Settled>{D, P, D}));
    EXPECT_NE(r[1].error.find("REQUIRED_FIELD_MISSING"), std::string::npos);
    // A 2xx without a readable array is not proof of delivery for sObject Collections.
    EXPECT_EQ(settled(settle_bulk(BatchFormat::kSobjectCollections, 200, "", "", false, ids)),
              (std::vector<Settled>{T, T, T}));
}

TEST(HttpBulkSettle, GarbageAndMismatchesAreRetried) {
    std::vector<std::string_view> ids = {"a", "b"};
    EXPECT_EQ(settled(settle_bulk(BatchFormat::kJsonArray, 207, "", "<html>oops", false, ids)),
              (std::vector<Settled>{T, T}));
    EXPECT_EQ(settled(settle_bulk(BatchFormat::kJsonArray, 207, "", "", false, ids)),
              (std::vector<Settled>{T, T}));
    EXPECT_EQ(
        settled(settle_bulk(BatchFormat::kJsonArray, 200, "", "[{\"status\":200}", false, ids)),
        (std::vector<Settled>{T, T}));
    // Three results for two records, by position: which is which cannot be known.
    auto r = settle_bulk(BatchFormat::kJsonArray, 207, "", "[{},{},{}]", false, ids);
    EXPECT_EQ(settled(r), (std::vector<Settled>{T, T}));
    EXPECT_NE(r[0].error.find("3 per-record results for 2 records"), std::string::npos);
    EXPECT_EQ(settled(settle_bulk(BatchFormat::kJsonArray, 207, "", "[{}, 7]", false, ids)),
              (std::vector<Settled>{D, T}));
    EXPECT_EQ(settled(settle_bulk(BatchFormat::kJsonArray, 207, "", "[{},{}]", true, ids)),
              (std::vector<Settled>{T, T}));
}

// The entries of a JSON array written one a line, as NDJSON.
std::string as_lines(const std::string& array, const char* eol = "\n") {
    std::string out;
    for (const auto& entry : nlohmann::json::parse(array)) out += entry.dump() + eol;
    return out;
}

TEST(HttpBulkSettleNdjson, SameRulesAsTheArray) {
    std::vector<std::string_view> ids = {"a", "b", "c", "d"};
    for (const std::string array :
         {R"([{"status":201},{"status":503,"error":"busy"},{"status":422,"error":"bad"},{}])",
          R"([{"id":"c","success":false,"status":429},{"id":"a","success":true},
                 {"id":"b","success":false,"errors":["dup"]},{"id":"zz","success":true}])",
          R"([{"success":true},{"errors":[]},{"error":"no"},{"id":"x","status":200}])",
          R"([{"status":200},{"status":200},{"status":200}])"}) {
        auto want = settle_bulk(BatchFormat::kJsonArray, 207, "", array, false, ids);
        for (const char* type : {"application/x-ndjson", "application/jsonl"}) {
            auto got = settle_bulk(BatchFormat::kNdjson, 200, type, as_lines(array), false, ids);
            ASSERT_EQ(got.size(), want.size()) << array;
            for (std::size_t i = 0; i < got.size(); ++i) {
                EXPECT_EQ(got[i].settled, want[i].settled) << array << " #" << i;
                if (want[i].settled == P) {
                    // Same error, but for the status of the response.
                    EXPECT_EQ(got[i].error.substr(8), want[i].error.substr(8));
                }
            }
        }
    }
}

TEST(HttpBulkSettleNdjson, ByPositionWithTheContentType) {
    std::vector<std::string_view> ids = {"a", "b", "c"};
    // Parameters and case of the type, CRLF, blank lines and no final newline are all fine.
    auto r = settle_bulk(BatchFormat::kNdjson, 200, "Application/X-NDJSON; charset=utf-8",
                         "{\"status\":201}\r\n\r\n{\"status\":503,\"error\":\"busy\"}\r\n"
                         "  {\"status\":422,\"error\":\"bad total\"}",
                         false, ids);
    EXPECT_EQ(settled(r), (std::vector<Settled>{D, T, P}));
    EXPECT_NE(r[2].error.find("HTTP 200, record:"), std::string::npos);
    EXPECT_NE(r[2].error.find("bad total"), std::string::npos);
    EXPECT_EQ(settled(settle_bulk(BatchFormat::kNdjson, 207, "application/jsonl",
                                  "{\"success\":false,\"status\":500}\n{}\n{}\n", false, ids)),
              (std::vector<Settled>{T, D, D}));
}

TEST(HttpBulkSettleNdjson, ByMessageIdInAnyOrder) {
    std::vector<std::string_view> ids = {"a", "b", "c"};
    auto r = settle_bulk(BatchFormat::kNdjson, 200, "application/x-ndjson",
                         "{\"id\":\"c\",\"success\":true}\n{\"id\":\"zz\",\"success\":false}\n"
                         "{\"id\":\"a\",\"success\":false,\"errors\":[\"dup\"]}\n",
                         false, ids);
    // "b" is not mentioned: retried, never taken as delivered.
    EXPECT_EQ(settled(r), (std::vector<Settled>{P, T, D}));
    EXPECT_NE(r[1].error.find("no per-record result for this message"), std::string::npos);
}

TEST(HttpBulkSettleNdjson, RecognisedByItsBodyWithoutTheContentType) {
    std::vector<std::string_view> ids = {"a", "b"};
    // Several lines, each a JSON object.
    EXPECT_EQ(
        settled(settle_bulk(BatchFormat::kNdjson, 200, "application/json",
                            "{\"status\":200}\n{\"status\":409,\"error\":\"x\"}\n", false, ids)),
        (std::vector<Settled>{D, P}));
    // One line naming a message of the request.
    EXPECT_EQ(settled(settle_bulk(BatchFormat::kNdjson, 200, "",
                                  "{\"id\":\"b\",\"success\":true}\n", false, ids)),
              (std::vector<Settled>{T, D}));
    // One line for a request of one message.
    EXPECT_EQ(settled(settle_bulk(BatchFormat::kNdjson, 200, "text/plain",
                                  "{\"success\":false,\"errors\":[\"no\"]}", false, {"a"})),
              (std::vector<Settled>{P}));
    // A single object naming no message, for several, is a summary; so is a pretty-printed one.
    EXPECT_EQ(settled(settle_bulk(BatchFormat::kNdjson, 200, "", "{\"ok\":true}\n", false, ids)),
              (std::vector<Settled>{D, D}));
    EXPECT_EQ(settled(settle_bulk(BatchFormat::kNdjson, 200, "application/json",
                                  "{\n  \"accepted\": 2\n}\n", false, ids)),
              (std::vector<Settled>{D, D}));
    // Only an ndjson destination's responses are read as NDJSON.
    EXPECT_EQ(settled(settle_bulk(BatchFormat::kJsonArray, 200, "application/x-ndjson",
                                  "{\"status\":500}\n{\"status\":500}\n", false, ids)),
              (std::vector<Settled>{D, D}));
    // An array still reads as an array.
    EXPECT_EQ(settled(settle_bulk(BatchFormat::kNdjson, 207, "application/json",
                                  "[{\"status\":200},{\"status\":503}]", false, ids)),
              (std::vector<Settled>{D, T}));
}

TEST(HttpBulkSettleNdjson, GarbageLinesMismatchesAndMixesAreRetried) {
    std::vector<std::string_view> ids = {"a", "b"};
    auto all_transient = [&](int status, const char* type, const char* body,
                             bool truncated = false) {
        return settled(settle_bulk(BatchFormat::kNdjson, status, type, body, truncated, ids)) ==
               std::vector<Settled>{T, T};
    };
    // A line that is not JSON, typed or not; the error says which.
    auto r = settle_bulk(BatchFormat::kNdjson, 200, "application/x-ndjson",
                         "{\"status\":200}\n<html>oops\n", false, ids);
    EXPECT_EQ(settled(r), (std::vector<Settled>{T, T}));
    EXPECT_NE(r[0].error.find("HTTP 200: unreadable per-record results: line 2"),
              std::string::npos);
    EXPECT_TRUE(all_transient(200, "", "{\"status\":200}\n{\"status\":200},\n"));
    EXPECT_TRUE(all_transient(207, "", "{\"status\":200}\n{\"status\""));
    EXPECT_TRUE(all_transient(200, "application/x-ndjson", "accepted"));
    // A line that is JSON but not an object (an entry of the array would be, not a line).
    EXPECT_TRUE(all_transient(200, "application/x-ndjson", "{\"status\":200}\n7\n"));
    EXPECT_TRUE(all_transient(200, "application/jsonl", "{}\nnull\n"));
    // A mix of the shapes: an array in NDJSON, or lines after an array.
    EXPECT_TRUE(all_transient(200, "application/x-ndjson", "[{\"status\":200},{\"status\":200}]"));
    EXPECT_TRUE(all_transient(200, "", "{\"status\":200}\n[{\"status\":200}]\n"));
    EXPECT_TRUE(all_transient(207, "", "[{\"status\":200}]\n{\"status\":200}\n"));
    // A count other than the messages' when mapped by position.
    r = settle_bulk(BatchFormat::kNdjson, 200, "application/x-ndjson", "{}\n{}\n{}\n", false, ids);
    EXPECT_EQ(settled(r), (std::vector<Settled>{T, T}));
    EXPECT_NE(r[0].error.find("3 per-record results for 2 records"), std::string::npos);
    EXPECT_TRUE(all_transient(200, "", "{\"status\":200}\n{}\n{}\n"));
    EXPECT_TRUE(all_transient(207, "application/x-ndjson", "{\"status\":200}\n"));
    EXPECT_TRUE(all_transient(207, "application/x-ndjson", "\n"));
    // Longer than the relay reads.
    EXPECT_TRUE(all_transient(200, "application/x-ndjson", "{}\n{}\n", true));
    EXPECT_TRUE(all_transient(200, "", "{}\n{}\n", true));
    // Lines naming messages mixed with lines that do not: the named ones settle, the rest retry.
    EXPECT_EQ(settled(settle_bulk(BatchFormat::kNdjson, 200, "application/x-ndjson",
                                  "{\"id\":\"b\",\"status\":200}\n{\"status\":200}\n", false, ids)),
              (std::vector<Settled>{T, D}));
    // An empty 200 is still delivered, whatever its type says.
    EXPECT_EQ(
        settled(settle_bulk(BatchFormat::kNdjson, 200, "application/x-ndjson", "\n", false, ids)),
        (std::vector<Settled>{D, D}));
}

// The test vector of the Standard Webhooks specification's reference libraries.
TEST(HttpWebhookSignature, StandardWebhooksVector) {
    std::string key;
    ASSERT_TRUE(decode_webhook_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", &key));
    EXPECT_EQ(key.size(), 24u);
    EXPECT_EQ(webhook_signature({key}, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330,
                                R"({"test": 2432232314})"),
              "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    std::string other;
    ASSERT_TRUE(decode_webhook_secret("whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3", &other));
    std::string two = webhook_signature({key, other}, "id", 1, "body");
    EXPECT_EQ(two.find("v1,"), 0u);
    EXPECT_NE(two.find(" v1,"), std::string::npos);
    EXPECT_FALSE(decode_webhook_secret("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", &key));
    EXPECT_FALSE(decode_webhook_secret("whsec_abc", &key));
    EXPECT_FALSE(decode_webhook_secret("whsec_ab!d", &key));
}

}  // namespace
}  // namespace eventbox::http
