// Message ids and event types of change-data-capture records (subscription option
// message_id_rule => 'debezium' or 'cockroachdb'): the id comes from where the change is in the
// source database's log, so that a connector that emits the same change again (a restart, a
// replayed snapshot) at new Kafka offsets is deduplicated (docs/guide/cdc.md). Pure C++.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace eventbox::inbox {

// What a change-data-capture rule makes of one record.
struct ChangeEvent {
    enum class Kind {
        kOther,  // not a change event of the rule's source: the default rule applies
        kEvent,  // a change: message_id and event_type are set
        kSkip,   // a Debezium tombstone or a CockroachDB resolved timestamp: not stored
    };
    Kind kind = Kind::kOther;
    std::string message_id;
    std::string event_type;  // create, update, delete, read, truncate, message, upsert
    std::string skipped;     // kSkip: "tombstone" or "resolved"
};

// Bytes of a record as the rules read them (nullptr: absent, e.g. a tombstone's value).
struct ChangeRecord {
    std::string_view topic;
    const char* key = nullptr;
    std::size_t key_len = 0;
    const char* value = nullptr;
    std::size_t value_len = 0;
};

// A Debezium change event (JSON converter, with or without schemas): id
// "<connector>:<server name>:<db.schema.table>:<position>:<op>:<row>", position the source
// fields of the connector (postgresql: lsn, txId; mysql: file, pos, row; sqlserver: change_lsn,
// commit_lsn, event_serial_no), row the first 32 hex digits of the SHA-256 of the key's canonical
// JSON (of the row's after/before image when there is no key). Event type from op (c create,
// u update, d delete, r read, t truncate, m message). A null value is the tombstone that follows
// a delete: kSkip. Anything else (another connector, a heartbeat, a schema change) is kOther.
ChangeEvent debezium_event(const ChangeRecord& record);

// A CockroachDB changefeed message (JSON, envelope wrapped, option `updated`): id
// "cockroachdb:<topic>:<updated>:<row>" (row as for Debezium, from the key). Event type delete
// (after is null), create or update (with option diff: before null or not), else upsert. A
// resolved-timestamp message ({"resolved": ...}) is kSkip; a message without `updated` is
// kOther.
ChangeEvent cockroachdb_event(const ChangeRecord& record);

// A CDC id longer than this is replaced by "<connector>:sha256:<hex of the id>".
inline constexpr std::size_t kMaxChangeIdBytes = 256;

}  // namespace eventbox::inbox
