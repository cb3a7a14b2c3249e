// Schema references (docs/guide/formats.md): Avro named types from referenced schemas written
// into the referencing one, Protobuf imports given to the descriptor pool, the bookkeeping of
// the references to fetch (bounds, cycles, order), and a registry answer with its references;
// the registry client against a registry on loopback (references kept, probes).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "registry/avro_json.hpp"
#include "registry/avro_refs.hpp"
#include "registry/protobuf_json.hpp"
#include "registry/references.hpp"
#include "registry/registry.hpp"

namespace eventbox::registry {
namespace {

const char* kAddress = R"({"type":"record","name":"Address","namespace":"com.acme.common",
    "fields":[{"name":"city","type":"string"},
              {"name":"kind","type":{"type":"enum","name":"Kind","symbols":["HOME","WORK"]}}]})";
const char* kCustomer = R"({"type":"record","name":"Customer","namespace":"com.acme.crm",
    "fields":[{"name":"name","type":"string"},
              {"name":"home","type":"com.acme.common.Address"},
              {"name":"work","type":["null","com.acme.common.Address"],"default":null},
              {"name":"kind","type":"com.acme.common.Kind"}]})";

std::string avro_string(const std::string& s) {
    return std::string(1, static_cast<char>(s.size() * 2)) + s;
}

TEST(AvroReferences, NamedTypesAreWrittenInAtTheirFirstUse) {
    std::string full = avro::inline_references(kCustomer, {kAddress});
    nlohmann::json j = nlohmann::json::parse(full);
    EXPECT_EQ(j["fields"][1]["type"]["name"], "com.acme.common.Address");
    EXPECT_EQ(j["fields"][2]["type"][1], "com.acme.common.Address");  // then a reference
    EXPECT_EQ(j["fields"][3]["type"], "com.acme.common.Kind");
    AvroSchema s(full);
    EXPECT_EQ(s.full_name(), "com.acme.crm.Customer");
    // name, home {city, kind}, work (null branch), kind
    std::string data = avro_string("Ann") + avro_string("Lyon") + std::string("\x02\x00\x00", 3);
    std::string out, why;
    ASSERT_TRUE(s.to_json(data.data(), data.size(), &out, &why)) << why;
    EXPECT_EQ(out, R"({"name":"Ann","home":{"city":"Lyon","kind":"WORK"},"work":null,)"
                   R"("kind":"HOME"})");
    std::string encoded;
    ASSERT_TRUE(s.from_json(out, &encoded, &why)) << why;
    EXPECT_EQ(encoded, data);
}

TEST(AvroReferences, TransitiveReferencesAndSimpleNamesInTheirNamespace) {
    const char* country = R"({"type":"enum","name":"Country","namespace":"geo",
        "symbols":["FR","DE"]})";
    // A simple name refers to the enclosing namespace's type; the referenced schema itself
    // uses a type of another reference.
    const char* place = R"({"type":"record","name":"Place","namespace":"geo",
        "fields":[{"name":"country","type":"Country"}]})";
    const char* trip = R"({"type":"record","name":"Trip","namespace":"geo",
        "fields":[{"name":"from","type":"Place"},{"name":"to","type":"Place"},
                  {"name":"via","type":{"type":"array","items":"Country"}}]})";
    AvroSchema s(avro::inline_references(trip, {country, place}));
    std::string data("\x00\x02\x04\x00\x02\x00", 6);
    std::string out, why;
    ASSERT_TRUE(s.to_json(data.data(), data.size(), &out, &why)) << why;
    EXPECT_EQ(out, R"({"from":{"country":"FR"},"to":{"country":"DE"},"via":["FR","DE"]})");
}

TEST(AvroReferences, NullNamespaceTypesKeepTheirNameInsideANamespace) {
    const char* money = R"({"type":"fixed","name":"Money","size":2})";
    const char* order = R"({"type":"record","name":"Order","namespace":"shop",
        "fields":[{"name":"total","type":"Money"}]})";
    AvroSchema s(avro::inline_references(order, {money}));
    std::string data = "\x01\x02";
    std::string out, why;
    ASSERT_TRUE(s.to_json(data.data(), data.size(), &out, &why)) << why;
    EXPECT_EQ(out, R"({"total":"AQI="})");  // fixed: base64
}

TEST(AvroReferences, UnknownNamesStillRefusedAndBadJsonThrows) {
    EXPECT_THROW(AvroSchema(avro::inline_references(kCustomer, {})), Error);
    EXPECT_THROW(avro::inline_references(kCustomer, {"{nope"}), Error);
}

TEST(ProtobufImports, ImportedMessagesDecodeAndEncode) {
    const char* money =
        "syntax = \"proto3\"; package common;\n"
        "message Money { string currency = 1; int64 units = 2; }\n";
    const char* order =
        "syntax = \"proto3\"; package shop;\n"
        "import \"common/money.proto\";\n"
        "import \"google/protobuf/timestamp.proto\";\n"
        "message Order { string id = 1; common.Money total = 2;\n"
        "  google.protobuf.Timestamp at = 3; }\n";
    ProtobufSchema s(order, {{"common/money.proto", money}});
    std::string out, why;
    ASSERT_TRUE(s.from_json(R"({"id":"o1","total":{"currency":"EUR","units":"5"},)"
                            R"("at":"2024-05-01T12:00:00Z"})",
                            &out, &why))
        << why;
    std::string json;
    const std::string* name = nullptr;
    ASSERT_TRUE(s.to_json(out.data(), out.size(), &json, &why, &name)) << why;
    EXPECT_EQ(*name, "shop.Order");
    EXPECT_EQ(nlohmann::json::parse(json),
              nlohmann::json::parse(R"({"id":"o1","total":{"currency":"EUR","units":"5"},)"
                                    R"("at":"2024-05-01T12:00:00Z"})"));
}

TEST(ProtobufImports, MissingCyclicAndBrokenImportsAreRefused) {
    try {
        ProtobufSchema s("syntax = \"proto3\"; import \"a.proto\"; message M {}", {});
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("neither one of the registry's references"),
                  std::string::npos)
            << e.what();
    }
    const char* a = "syntax = \"proto3\"; import \"b.proto\"; message A {}";
    const char* b = "syntax = \"proto3\"; import \"a.proto\"; message B {}";
    try {
        ProtobufSchema s("syntax = \"proto3\"; import \"a.proto\"; message M { A a = 1; }",
                         {{"a.proto", a}, {"b.proto", b}});
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("cycle"), std::string::npos) << e.what();
    }
    EXPECT_THROW((ProtobufSchema{"syntax = \"proto3\"; import \"a.proto\"; message M {}",
                                 {{"a.proto", "message {"}}}),
                 Error);
}

std::string answer(uint32_t id, const std::string& schema, const std::string& refs,
                   const std::string& type = "AVRO") {
    nlohmann::json j = {{"id", id}, {"schema", schema}, {"schemaType", type}};
    if (!refs.empty()) j["references"] = nlohmann::json::parse(refs);
    return j.dump();
}

TEST(ReferenceSet, FetchesEachOnceInDependencyOrder) {
    ReferenceSet set;
    set.start(answer(1, "{}", R"([{"name":"b","subject":"b","version":1},
                                 {"name":"c","subject":"c","version":2}])"),
              1);
    EXPECT_EQ(set.take_wanted(), (std::vector<std::string>{"b@1", "c@2"}));
    EXPECT_TRUE(set.take_wanted().empty());
    set.arrived("b@1", answer(2, "B", R"([{"name":"c","subject":"c","version":2}])"));
    EXPECT_TRUE(set.take_wanted().empty());  // c@2 is asked already
    set.arrived("c@2", answer(3, "C", ""));
    std::vector<Reference> order = set.ordered();
    ASSERT_EQ(order.size(), 2u) << set.refused();
    EXPECT_EQ(order[0].text, "C");
    EXPECT_EQ(order[1].text, "B");
    EXPECT_TRUE(set.refused().empty());
}

TEST(ReferenceSet, CyclesMissingDeepAndMixedTypesAreRefused) {
    ReferenceSet cycle;
    cycle.start(answer(1, "{}", R"([{"name":"b","subject":"b","version":1}])"), 1);
    cycle.take_wanted();
    cycle.arrived("b@1", answer(2, "B", R"([{"name":"a","subject":"a","version":1}])"));
    EXPECT_EQ(cycle.take_wanted(), (std::vector<std::string>{"a@1"}));
    cycle.arrived("a@1", answer(1, "A", R"([{"name":"b","subject":"b","version":1}])"));
    EXPECT_TRUE(cycle.ordered().empty());
    EXPECT_NE(cycle.refused().find("references form a cycle: the schema -> subject \"b\" "
                                   "version 1 -> subject \"a\" version 1"),
              std::string::npos)
        << cycle.refused();

    ReferenceSet missing;
    missing.start(answer(1, "{}", R"([{"name":"x","subject":"x","version":3}])"), 1);
    missing.take_wanted();
    missing.missing("x@3", "http://r");
    EXPECT_EQ(missing.refused(),
              "reference \"x\" (subject \"x\" version 3) is not in the schema registry http://r");

    ReferenceSet deep;
    deep.start(answer(1, "{}", R"([{"name":"d1","subject":"d1","version":1}])"), 1);
    for (int depth = 1; depth <= kMaxReferenceDepth && deep.refused().empty(); ++depth) {
        std::string key = "d" + std::to_string(depth) + "@1";
        ASSERT_EQ(deep.take_wanted(), (std::vector<std::string>{key}));
        std::string next = "d" + std::to_string(depth + 1);
        deep.arrived(
            key, answer(depth + 1, "D",
                        R"([{"name":")" + next + R"(","subject":")" + next + R"(","version":1}])"));
    }
    EXPECT_NE(deep.refused().find("is nested deeper than 8 references"), std::string::npos)
        << deep.refused();
    EXPECT_TRUE(deep.take_wanted().empty());

    ReferenceSet mixed;
    mixed.start(answer(1, "{}", R"([{"name":"p","subject":"p","version":1}])"), 1);
    mixed.take_wanted();
    mixed.arrived("p@1", answer(2, "message P {}", "", "PROTOBUF"));
    EXPECT_NE(mixed.refused().find("is a PROTOBUF schema, not AVRO"), std::string::npos);
}

TEST(ReferenceSet, TooManyReferencesAreRefused) {
    nlohmann::json refs = nlohmann::json::array();
    for (std::size_t i = 0; i <= kMaxReferences; ++i)
        refs.push_back({{"name", "r"}, {"subject", "s" + std::to_string(i)}, {"version", 1}});
    ReferenceSet set;
    set.start(answer(1, "{}", refs.dump()), 1);
    EXPECT_TRUE(set.take_wanted().empty());
    EXPECT_NE(set.refused().find("more than 32 references"), std::string::npos);
}

TEST(RegistryReferences, AnswerWithItsReferences) {
    std::string body = answer(
        7, kCustomer, R"([{"name":"com.acme.common.Address","subject":"addr","version":1}])");
    EXPECT_TRUE(needs_references(body));
    EXPECT_FALSE(needs_references(answer(8, "{}", R"([{"subject":"x","version":1}])", "JSON")));
    auto unfetched = Registry::parse_response(7, body, 1 << 20);
    EXPECT_NE(unfetched->refused.find("references were not fetched"), std::string::npos);
    std::vector<Reference> refs = {{"com.acme.common.Address", kAddress}};
    auto s = Registry::parse_response(7, body, 1 << 20, &refs);
    ASSERT_TRUE(s->refused.empty()) << s->refused;
    EXPECT_EQ(s->name, "com.acme.crm.Customer");
    auto big = Registry::parse_response(7, body, std::string(kCustomer).size() + 10, &refs);
    EXPECT_NE(big->refused.find("(with its references) exceeds"), std::string::npos);
}

// A Schema Registry on 127.0.0.1 that answers GET `path` with `answers[path]` (else 404), one
// request per connection, and counts the requests of each path.
class FakeRegistry {
  public:
    // `slow`: a path answered after 300 ms.
    explicit FakeRegistry(std::map<std::string, std::string> answers, std::string slow = "")
        : answers_(std::move(answers)), slow_(std::move(slow)) {
        fd_ = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
        listen(fd_, 16);
        socklen_t len = sizeof a;
        getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
        port_ = ntohs(a.sin_port);
        thread_ = std::thread([this] { run(); });
    }
    ~FakeRegistry() {
        stop_ = true;
        thread_.join();
        close(fd_);
    }
    std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
    int count(const std::string& path) {
        std::lock_guard<std::mutex> g(mu_);
        return counts_[path];
    }

  private:
    void run() {
        while (!stop_) {
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, 20) <= 0) continue;
            int c = accept(fd_, nullptr, nullptr);
            if (c >= 0) serve(c);
        }
    }
    void serve(int c) {
        std::string head;
        char buf[4096];
        for (int reads = 0; reads < 100 && head.find("\r\n\r\n") == std::string::npos; ++reads) {
            pollfd p{c, POLLIN, 0};
            if (::poll(&p, 1, 1000) <= 0) break;
            ssize_t n = read(c, buf, sizeof buf);
            if (n <= 0) break;
            head.append(buf, static_cast<std::size_t>(n));
        }
        std::size_t sp = head.find(' ');
        std::string path = sp == std::string::npos ? "" : head.substr(sp + 1);
        path = path.substr(0, path.find(' '));
        if (path == slow_) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        std::string status = "404 Not Found", body = R"({"error_code":40401})";
        {
            std::lock_guard<std::mutex> g(mu_);
            counts_[path] += 1;
            auto it = answers_.find(path);
            if (it != answers_.end()) status = "200 OK", body = it->second;
        }
        std::string reply = "HTTP/1.1 " + status +
                            "\r\nContent-Length: " + std::to_string(body.size()) +
                            "\r\nConnection: close\r\n\r\n" + body;
        if (write(c, reply.data(), reply.size()) < 0) {
        }
        close(c);
    }

    std::map<std::string, std::string> answers_;
    std::string slow_;
    std::map<std::string, int> counts_;
    int fd_;
    int port_;
    std::atomic<bool> stop_{false};
    std::thread thread_;
    std::mutex mu_;
};

// Serves `r` until `done` (at most 10 s).
template <typename Done>
bool serve_until(Registry& r, int64_t now_ms, Done done) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done()) {
        if (std::chrono::steady_clock::now() > deadline) return false;
        r.perform(now_ms);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
}

TEST(RegistryReferences, ResolvedSubjectVersionsAreNotFetchedAgain) {
    std::string refs = R"([{"name":"com.acme.common.Address","subject":"addr","version":1}])";
    FakeRegistry server({
        {"/subjects/crm-value/versions/latest", answer(7, kCustomer, refs)},
        {"/schemas/ids/7", answer(7, kCustomer, refs)},
        {"/subjects/addr/versions/1", answer(3, kAddress, "")},
    });
    Registry r(make_config(server.url(), ""));
    std::string json = R"({"name":"Ann","home":{"city":"Lyon","kind":"WORK"},"work":null,)"
                       R"("kind":"HOME"})";
    std::string out;
    auto encode = [&](int64_t now) {
        out.clear();
        return r.encode("crm-value", 0, json.data(), json.size(), &out, now).status;
    };
    EXPECT_EQ(encode(0), Encoded::kPending);
    ASSERT_TRUE(serve_until(r, 0, [&] { return encode(0) == Encoded::kOk; }));
    EXPECT_EQ(server.count("/subjects/addr/versions/1"), 1);
    // 'latest' is looked up again after kLatestTtlMs (the cached version serves meanwhile); its
    // reference, a pinned version, is not fetched again.
    int64_t later = kLatestTtlMs + 1;
    EXPECT_EQ(encode(later), Encoded::kOk);
    ASSERT_TRUE(serve_until(r, later, [&] {
        return server.count("/subjects/crm-value/versions/latest") == 2 && !r.busy();
    }));
    EXPECT_EQ(server.count("/subjects/addr/versions/1"), 1);
    EXPECT_EQ(encode(later), Encoded::kOk);
    std::string wire = out;
    // The same schema by id (the inbox's way): its reference is not fetched again either.
    std::string decoded;
    EXPECT_EQ(r.decode(wire.data(), wire.size(), &decoded).status, Decoded::kPending);
    ASSERT_TRUE(serve_until(r, later, [&] { return r.cached(7) && !r.busy(); }));
    decoded.clear();
    ASSERT_EQ(r.decode(wire.data(), wire.size(), &decoded).status, Decoded::kOk);
    EXPECT_EQ(decoded, json);
    EXPECT_EQ(server.count("/schemas/ids/7"), 1);
    EXPECT_EQ(server.count("/subjects/addr/versions/1"), 1);
}

TEST(RegistryReferences, SchemaIdsWithMissingReferencesAreRefusedAndFetchedOnce) {
    const char* order =
        "syntax = \"proto3\"; package shop;\n"
        "import \"common/money.proto\";\n"
        "message Order { string id = 1; common.Money total = 2; }\n";
    FakeRegistry server(
        {
            {"/schemas/ids/9",
             answer(9, order, R"([{"name":"common/money.proto","subject":"money","version":1}])",
                    "PROTOBUF")},
            {"/schemas/ids/10",
             answer(10, kCustomer,
                    R"([{"name":"com.acme.common.Address","subject":"addr","version":2}])")},
        },
        "/subjects/money/versions/1");
    Registry r(make_config(server.url(), ""));
    std::string proto = std::string("\0\0\0\0\x09\0", 6),
                avro = std::string("\0\0\0\0\x0a", 5) + avro_string("x");
    std::string json;
    EXPECT_EQ(r.decode(proto.data(), proto.size(), &json).status, Decoded::kPending);
    EXPECT_EQ(r.decode(avro.data(), avro.size(), &json).status, Decoded::kPending);
    // While the (slow) reference is fetched, the schema id is not asked again.
    ASSERT_TRUE(serve_until(r, 0, [&] { return server.count("/subjects/money/versions/1") == 1; }));
    EXPECT_EQ(r.decode(proto.data(), proto.size(), &json).status, Decoded::kPending);
    ASSERT_TRUE(serve_until(r, 0, [&] { return r.cached(9) && r.cached(10) && !r.busy(); }));
    EXPECT_EQ(server.count("/schemas/ids/9"), 1);
    Decoded p = r.decode(proto.data(), proto.size(), &json);
    EXPECT_EQ(p.status, Decoded::kBad);
    EXPECT_NE(p.reason.find("schema id 9: "), std::string::npos) << p.reason;
    EXPECT_NE(p.reason.find("subject \"money\" version 1"), std::string::npos) << p.reason;
    Decoded a = r.decode(avro.data(), avro.size(), &json);
    EXPECT_EQ(a.status, Decoded::kBad);
    EXPECT_NE(a.reason.find("subject \"addr\" version 2"), std::string::npos) << a.reason;
}

TEST(RegistryProbe, ProbesOnlyUntilARecordWaitsForTheSchema) {
    FakeRegistry server({{"/schemas/ids/5", R"({"schema":"\"string\""})"}}, "/schemas/ids/5");
    Registry r(make_config(server.url(), ""));
    r.probe(5);
    EXPECT_TRUE(r.busy());
    EXPECT_TRUE(r.probes_only());
    // A record waits for the same id: the fetch under way is no longer a probe only.
    std::string value = std::string("\0\0\0\0\x05", 5) + avro_string("hi"), json;
    EXPECT_EQ(r.decode(value.data(), value.size(), &json).status, Decoded::kPending);
    EXPECT_FALSE(r.probes_only());
    ASSERT_TRUE(serve_until(r, 0, [&] { return r.cached(5) && !r.busy(); }));
    EXPECT_EQ(server.count("/schemas/ids/5"), 1);
    r.probe(5);  // cached: nothing to ask
    EXPECT_FALSE(r.busy());
    r.probe(6);  // answered 404: cached as refused, the probe ends
    EXPECT_TRUE(r.probes_only());
    ASSERT_TRUE(serve_until(r, 0, [&] { return r.cached(6) && !r.busy(); }));
    EXPECT_FALSE(r.probes_only());
    // Without a URL a probe fails at once and leaves nothing open.
    Registry none(Config{});
    none.probe(7);
    EXPECT_FALSE(none.busy());
    EXPECT_FALSE(none.probes_only());
    EXPECT_FALSE(none.failure(7).empty());
}

TEST(ReferenceSet, KnowsTheReferencingSchemasType) {
    ReferenceSet avro, proto;
    avro.start(answer(1, kCustomer, R"([{"name":"a","subject":"s","version":1}])"), 1);
    proto.start(answer(2, "syntax = \"proto3\";", R"([{"name":"a","subject":"s","version":1}])",
                       "PROTOBUF"),
                2);
    EXPECT_EQ(avro.type(), "AVRO");
    EXPECT_EQ(proto.type(), "PROTOBUF");
}

}  // namespace
}  // namespace eventbox::registry
