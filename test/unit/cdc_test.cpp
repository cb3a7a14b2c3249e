// Message ids and event types of change-data-capture records (src/inbox/cdc.cpp), on the
// examples of Debezium's and CockroachDB's documentation (docs/guide/cdc.md).
#include "inbox/cdc.hpp"

#include <gtest/gtest.h>

#include <string>

#include "inbox/fingerprint.hpp"

namespace eventbox::inbox {
namespace {

using Kind = ChangeEvent::Kind;

ChangeEvent debezium(const std::string& key, const std::string& value, const char* topic = "t") {
    ChangeRecord r{topic, key.data(), key.size(), value.data(), value.size()};
    return debezium_event(r);
}

ChangeEvent cockroach(const std::string& key, const std::string& value,
                      const char* topic = "office_dogs") {
    ChangeRecord r{topic, key.data(), key.size(), value.data(), value.size()};
    return cockroachdb_event(r);
}

std::string row(const std::string& key) {
    std::string scratch;
    return fingerprint(key, &scratch).substr(0, 32);
}

// A Postgres connector's event, after Debezium's documentation (schemas off).
std::string pg_event(const char* op, const char* before, const char* after, long lsn, int tx,
                     const char* table = "customers", const char* snapshot = "false") {
    return std::string(R"({"before":)") + before + R"(,"after":)" + after +
           R"(,"source":{"version":"2.7.0.Final","connector":"postgresql",)"
           R"("name":"PostgreSQL_server","ts_ms":1559033904863,"snapshot":")" +
           snapshot + R"(","db":"postgres","schema":"public","table":")" + table + R"(","txId":)" +
           std::to_string(tx) + R"(,"lsn":)" + std::to_string(lsn) + R"(,"xmin":null},"op":")" +
           op + R"(","ts_ms":1559033904863})";
}

const char* const kAnne = R"({"id":1,"first_name":"Anne","email":"annek@noanswer.org"})";
const char* const kAnneNew = R"({"id":1,"first_name":"Anne","email":"noreply@example.org"})";

TEST(Debezium, PostgresCreateId) {
    ChangeEvent e = debezium(R"({"id":1})", pg_event("c", "null", kAnne, 24023128, 555));
    ASSERT_EQ(e.kind, Kind::kEvent);
    EXPECT_EQ(e.message_id,
              "postgresql:PostgreSQL_server:postgres.public.customers:lsn=24023128,txId=555:c:" +
                  row(R"({"id":1})"));
    EXPECT_EQ(e.event_type, "create");
}

TEST(Debezium, OperationsAreEventTypes) {
    EXPECT_EQ(debezium("{}", pg_event("u", "null", kAnneNew, 2, 1)).event_type, "update");
    EXPECT_EQ(debezium("{}", pg_event("d", kAnne, "null", 3, 1)).event_type, "delete");
    EXPECT_EQ(debezium("{}", pg_event("r", "null", kAnne, 4, 1, "customers", "true")).event_type,
              "read");
    EXPECT_EQ(debezium("{}", pg_event("t", "null", "null", 5, 1)).event_type, "truncate");
    EXPECT_EQ(debezium("{}", pg_event("m", "null", "null", 6, 1)).event_type, "message");
}

// The same change emitted again (a connector restarted from an older offset) has the same id,
// however the JSON is spelled; another position is another change.
TEST(Debezium, ReplayedChangeKeepsItsId) {
    std::string key = R"({"id":1})";
    ChangeEvent first = debezium(key, pg_event("u", "null", kAnneNew, 24024264, 556));
    std::string respelled = pg_event("u", "null", kAnneNew, 24024264, 556);
    respelled.insert(1, "  ");
    ChangeEvent again = debezium(R"({ "id": 1 })", respelled);
    EXPECT_EQ(first.message_id, again.message_id);
    ChangeEvent later = debezium(key, pg_event("u", "null", kAnneNew, 24025000, 557));
    EXPECT_NE(first.message_id, later.message_id);
}

// A snapshot reads every row at one position: the key (and the table) tell them apart.
TEST(Debezium, SnapshotRowsAtOnePositionDiffer) {
    std::string v = pg_event("r", "null", kAnne, 24023128, 555, "customers", "true");
    EXPECT_NE(debezium(R"({"id":1})", v).message_id, debezium(R"({"id":2})", v).message_id);
    std::string other = pg_event("r", "null", kAnne, 24023128, 555, "orders", "true");
    EXPECT_NE(debezium(R"({"id":1})", v).message_id, debezium(R"({"id":1})", other).message_id);
}

// A primary key update is a delete and a create at one position: the op tells them apart.
TEST(Debezium, KeyChangeDeleteAndCreateDiffer) {
    ChangeEvent d = debezium(R"({"id":1})", pg_event("d", kAnne, "null", 7, 9));
    ChangeEvent c = debezium(R"({"id":2})", pg_event("c", "null", kAnne, 7, 9));
    EXPECT_NE(d.message_id, c.message_id);
}

// Without a key the row image stands for the row.
TEST(Debezium, KeylessRowsByImage) {
    std::string a = pg_event("r", "null", R"({"v":1})", 8, 1);
    std::string b = pg_event("r", "null", R"({"v":2})", 8, 1);
    ChangeRecord ra{"t", nullptr, 0, a.data(), a.size()};
    ChangeRecord rb{"t", nullptr, 0, b.data(), b.size()};
    EXPECT_EQ(debezium_event(ra).kind, Kind::kEvent);
    EXPECT_NE(debezium_event(ra).message_id, debezium_event(rb).message_id);
}

// The JSON converter with schemas wraps the event in {"schema": ..., "payload": ...}.
TEST(Debezium, SchemaEnvelope) {
    std::string plain = pg_event("c", "null", kAnne, 24023128, 555);
    std::string wrapped = R"({"schema":{"type":"struct","optional":false,)"
                          R"("name":"PostgreSQL_server.public.customers.Envelope"},"payload":)" +
                          plain + "}";
    EXPECT_EQ(debezium(R"({"id":1})", plain).message_id,
              debezium(R"({"id":1})", wrapped).message_id);
}

TEST(Debezium, MySqlPosition) {
    std::string v =
        R"({"before":null,"after":{"id":1004},"source":{"version":"2.7.0.Final",)"
        R"("connector":"mysql","name":"mysql-server-1","ts_ms":1465491411000,"snapshot":"false",)"
        R"("db":"inventory","table":"customers","server_id":223344,"gtid":null,)"
        R"("file":"mysql-bin.000003","pos":484,"row":0,"thread":7,"query":null},)"
        R"("op":"c","ts_ms":1465491411815})";
    ChangeEvent e = debezium(R"({"id":1004})", v);
    ASSERT_EQ(e.kind, Kind::kEvent);
    EXPECT_EQ(e.message_id,
              "mysql:mysql-server-1:inventory.customers:"
              "file=mysql-bin.000003,pos=484,row=0:c:" +
                  row(R"({"id":1004})"));
}

TEST(Debezium, TombstoneIsSkipped) {
    std::string key = R"({"id":1})";
    ChangeRecord r{"t", key.data(), key.size(), nullptr, 0};
    ChangeEvent e = debezium_event(r);
    EXPECT_EQ(e.kind, Kind::kSkip);
    EXPECT_EQ(e.skipped, "tombstone");
}

// Not a change event this rule can place: the default rule applies.
TEST(Debezium, OtherRecords) {
    EXPECT_EQ(debezium("{}", R"({"ts_ms":1})").kind, Kind::kOther);               // a heartbeat
    EXPECT_EQ(debezium("{}", R"({"ddl":"CREATE TABLE x"})").kind, Kind::kOther);  // schema
    EXPECT_EQ(debezium("{}", "[1,2]").kind, Kind::kOther);
    EXPECT_EQ(debezium("{}", "not json").kind, Kind::kOther);
    std::string mongo = R"({"op":"c","source":{"connector":"mongodb","name":"m","ord":1}})";
    EXPECT_EQ(debezium("{}", mongo).kind, Kind::kOther);
    std::string no_position = R"({"op":"c","source":{"connector":"postgresql","name":"p"}})";
    EXPECT_EQ(debezium("{}", no_position).kind, Kind::kOther);
}

// A deep value is parsed only as deep as the rules read; the id does not depend on the rest.
TEST(Debezium, DeepValuesAreBounded) {
    std::string deep(100000, '[');
    deep += std::string(100000, ']');
    std::string v = pg_event("c", "null", deep.c_str(), 9, 1);
    ChangeEvent e = debezium(R"({"id":1})", v);
    EXPECT_EQ(e.kind, Kind::kEvent);
}

TEST(Debezium, LongIdsAreHashed) {
    std::string table(300, 'x');
    ChangeEvent e = debezium(R"({"id":1})", pg_event("c", "null", kAnne, 1, 1, table.c_str()));
    ASSERT_EQ(e.kind, Kind::kEvent);
    EXPECT_LE(e.message_id.size(), kMaxChangeIdBytes);
    EXPECT_EQ(e.message_id.rfind("postgresql:sha256:", 0), 0u);
}

// CockroachDB, after its changefeed-messages page: key [1], value wrapped with `updated`.
TEST(CockroachDb, KeyAndUpdatedAreTheId) {
    ChangeEvent e = cockroach(
        "[1]",
        R"({"after": {"id": 1, "name": "Petee H"}, "updated": "1563898016883227000.0000000000"})");
    ASSERT_EQ(e.kind, Kind::kEvent);
    EXPECT_EQ(e.message_id, "cockroachdb:office_dogs:1563898016883227000.0000000000:" + row("[1]"));
    EXPECT_EQ(e.event_type, "upsert");
    ChangeEvent later = cockroach(
        "[1]",
        R"({"after": {"id": 1, "name": "Petee"}, "updated": "1563898016883227001.0000000000"})");
    EXPECT_NE(e.message_id, later.message_id);
    EXPECT_NE(
        e.message_id,
        cockroach("[2]", R"({"after": {"id": 2}, "updated": "1563898016883227000.0000000000"})")
            .message_id);
}

TEST(CockroachDb, OperationsWithDiff) {
    EXPECT_EQ(cockroach("[1]", R"({"after": null, "updated": "1.0"})").event_type, "delete");
    EXPECT_EQ(
        cockroach("[1]", R"({"after": {"id": 1}, "before": null, "updated": "1.0"})").event_type,
        "create");
    EXPECT_EQ(cockroach("[1]", R"({"after": {"id": 1}, "before": {"id": 1}, "updated": "1.0"})")
                  .event_type,
              "update");
}

TEST(CockroachDb, ResolvedIsSkipped) {
    ChangeEvent e = cockroach("", R"({"resolved": "1563898016883227000.0000000000"})");
    EXPECT_EQ(e.kind, Kind::kSkip);
    EXPECT_EQ(e.skipped, "resolved");
}

TEST(CockroachDb, WithoutUpdatedTheDefaultRuleApplies) {
    EXPECT_EQ(cockroach("[1]", R"({"after": {"id": 1}})").kind, Kind::kOther);
    EXPECT_EQ(cockroach("[1]", R"({"id": 1})").kind, Kind::kOther);
    EXPECT_EQ(cockroach("[1]", "nope").kind, Kind::kOther);
}

}  // namespace
}  // namespace eventbox::inbox
