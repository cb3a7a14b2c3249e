// Definitions and check hooks of every eventbox.* setting.
#include "pg/guc.hpp"

extern "C" {
#include "postgres.h"

#include "utils/guc.h"
}

#include "amqp/settings.hpp"
#include "metrics/http_server.hpp"
#include "pg/shmem.hpp"
#include "workers/database_list.hpp"

#include <exception>
#include <string>

#include <cctype>
#include <climits>
#include <cstdlib>
#include <cstring>

namespace eventbox::guc {

char* database = nullptr;
char* brokers = nullptr;
char* kafka_options = nullptr;
char* amqp_url = nullptr;
char* worker_role = nullptr;
char* amqp_options = nullptr;
char* schema_registry_url = nullptr;
char* schema_registry_options = nullptr;
int max_message_bytes = 1000000;
int outbox_retention_s = 0;
int outbox_rotation_interval_s = 60;
int outbox_rotation_size_kb = 64 * 1024;
int relay_batch_size = 1000;
int relay_max_in_flight = 20000;
int relay_poll_interval_ms = 1000;
int relay_message_timeout_ms = 0;
int relay_linger_ms = 10;
int relay_retry_backoff_ms = 1000;
int relay_retry_backoff_max_ms = 60000;
int relay_max_attempts = 5;
int relay_sweep_interval_s = 60;
int ingest_workers = 1;
int handler_workers = 2;
int handler_timeout_ms = 30000;
bool allow_superuser_handlers = false;
int inbox_retention_s = 7 * 24 * 3600;
int dead_retention_s = 0;
char* metrics_address = nullptr;

namespace {

// Accepts a comma-separated list of database names (workers/database_list.hpp).
bool check_database(char** newval, void**, GucSource) {
    const char* value = *newval ? *newval : "";
    char detail[256] = "";
    try {
        (void)worker::parse_database_list(value);
    } catch (const std::exception& e) {
        snprintf(detail, sizeof detail, "%s", e.what());
    } catch (...) {
        snprintf(detail, sizeof detail, "eventbox.database is not a list of databases");
    }
    if (detail[0] == '\0') return true;
    GUC_check_errdetail("%s.", detail);
    GUC_check_errhint("List database names separated by commas, for example 'app, billing'.");
    return false;
}

// Accepts "" or a comma-separated list of host:port with a port in 1..65535.
bool check_brokers(char** newval, void**, GucSource) {
    const char* s = *newval ? *newval : "";
    while (*s == ' ') ++s;
    if (*s == '\0') return true;
    const char* item = s;
    for (;;) {
        const char* end = strchr(item, ',');
        size_t len = end ? static_cast<size_t>(end - item) : strlen(item);
        while (len > 0 && item[0] == ' ') ++item, --len;
        while (len > 0 && item[len - 1] == ' ') --len;
        const char* colon = static_cast<const char*>(memrchr(item, ':', len));
        bool ok = colon != nullptr && colon > item && colon < item + len - 1;
        long port = 0;
        for (const char* p = colon ? colon + 1 : item; ok && p < item + len; ++p) {
            if (!isdigit(static_cast<unsigned char>(*p)))
                ok = false;
            else
                port = port * 10 + (*p - '0');
            if (port > 65535) ok = false;
        }
        if (!ok || port < 1) {
            GUC_check_errdetail(
                "Each broker must be written host:port with a port from 1 to 65535.");
            GUC_check_errhint("Example: 'kafka1:9092,kafka2:9092'.");
            return false;
        }
        if (end == nullptr) break;
        item = end + 1;
    }
    return true;
}

// Accepts '' or host:port (a literal or a name; resolved when the supervisor starts).
bool check_metrics_address(char** newval, void**, GucSource) {
    if (*newval == nullptr || (*newval)[0] == '\0') return true;
    const char* value = *newval;
    bool ok = false;
    try {
        std::string host;
        int port;
        metrics::parse_address(value, &host, &port);
        ok = true;
    } catch (...) {
    }
    if (!ok) {
        GUC_check_errdetail(
            "eventbox.metrics_address must be host:port with a port from 1 to 65535.");
        GUC_check_errhint("Example: '127.0.0.1:9187'; '' turns the endpoint off.");
    }
    return ok;
}

// Accepts '' or amqp[s]://host[:port][/vhost] without credentials (amqp/settings.hpp).
bool check_amqp_url(char** newval, void**, GucSource) {
    if (*newval == nullptr || (*newval)[0] == '\0') return true;
    char why[256];
    if (amqp::url_valid(*newval, why, sizeof why)) return true;
    GUC_check_errdetail("%s", why);
    GUC_check_errhint(
        "Example: 'amqp://127.0.0.1:5672/%%2f'; credentials go in "
        "eventbox.amqp_options.");
    return false;
}

// RabbitMQ's connection (the relay's AMQP destinations).
void define_amqp() {
    DefineCustomStringVariable(
        "eventbox.amqp_url", "RabbitMQ server (amqp://host:port/vhost or amqps://...).",
        "Empty: no RabbitMQ; messages for AMQP destinations wait in the outbox.", &amqp_url, "",
        PGC_SIGHUP, 0, check_amqp_url, nullptr, nullptr);
    // As eventbox.kafka_options: no check hook (a rejected value would be echoed),
    // postmaster-level (a reload logs new values), parsed and reported by the relay.
    DefineCustomStringVariable(
        "eventbox.amqp_options",
        "RabbitMQ credentials and TLS (key=value, comma-separated: user, password, tls_ca_file, "
        "tls_cert_file, tls_key_file, tls_verify, connect_timeout, confirm_timeout).",
        "Superuser-only; never shown in logs or errors.", &amqp_options, "", PGC_POSTMASTER,
        GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL, nullptr, nullptr, nullptr);
}

}  // namespace

bool database_listed(const char* name) {
    const char* item = database;
    size_t want = strlen(name);
    while (item != nullptr) {
        const char* comma = strchr(item, ',');
        size_t len = comma ? static_cast<size_t>(comma - item) : strlen(item);
        while (len > 0 && (*item == ' ' || *item == '\t')) ++item, --len;
        while (len > 0 && (item[len - 1] == ' ' || item[len - 1] == '\t')) --len;
        if (len == want && strncmp(item, name, len) == 0) return true;
        item = comma ? comma + 1 : nullptr;
    }
    return false;
}

namespace {

// Where the workers connect and what send() and the relay's outbox accept and keep.
void define_connection_and_outbox() {
    DefineCustomStringVariable(
        "eventbox.database",
        "Databases whose outbox and inbox the eventbox workers serve (a comma-separated list).",
        nullptr, &database, "postgres", PGC_POSTMASTER, 0, check_database, nullptr, nullptr);
    DefineCustomStringVariable("eventbox.brokers",
                               "Kafka bootstrap servers (host:port, comma-separated).",
                               "Empty leaves the workers idle until a reload sets it.", &brokers,
                               "", PGC_SIGHUP, 0, check_brokers, nullptr, nullptr);
    // No check hook: PostgreSQL echoes a rejected value in its error message, and this value may
    // hold credentials. The relay parses it and reports problems without values. Postmaster-level
    // because PostgreSQL logs the new value of a setting changed by a reload.
    DefineCustomStringVariable(
        "eventbox.kafka_options",
        "Extra librdkafka properties (key=value, comma-separated), e.g. security settings.",
        "Superuser-only; never shown in logs or errors.", &kafka_options, "", PGC_POSTMASTER,
        GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL, nullptr, nullptr, nullptr);
    DefineCustomIntVariable(
        "eventbox.max_message_bytes", "Largest record (key + value + headers) send() accepts.",
        "Keep it at or below the broker's message.max.bytes.", &max_message_bytes, 1000000, 1024,
        100 * 1024 * 1024, PGC_SIGHUP, GUC_UNIT_BYTE, nullptr, nullptr, nullptr);
    DefineCustomIntVariable(
        "eventbox.outbox_retention", "How long acknowledged outbox rows are kept as sent.",
        "0 deletes a row as soon as the broker acknowledges it.", &outbox_retention_s, 0, 0,
        INT_MAX / 1000, PGC_SIGHUP, GUC_UNIT_S, nullptr, nullptr, nullptr);
    DefineCustomIntVariable(
        "eventbox.outbox_rotation_interval",
        "How long the open outbox table takes rows before the relay opens the next one.",
        "eventbox.outbox_retention is used instead when it is longer.", &outbox_rotation_interval_s,
        60, 1, 24 * 3600, PGC_SIGHUP, GUC_UNIT_S, nullptr, nullptr, nullptr);
    DefineCustomIntVariable(
        "eventbox.outbox_rotation_size",
        "How large the open outbox table grows before the relay opens the next one.",
        "0 rotates by age only. A truncate's commit takes time that grows with the table, and "
        "the relay waits for it.",
        &outbox_rotation_size_kb, 64 * 1024, 0, INT_MAX, PGC_SIGHUP, GUC_UNIT_KB, nullptr, nullptr,
        nullptr);
}

// The relay's batches, limits, timing and retries.
void define_relay() {
    DefineCustomIntVariable(
        "eventbox.relay_batch_size", "Outbox rows the relay reads per claim query.", nullptr,
        &relay_batch_size, 1000, 1, 100000, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
    DefineCustomIntVariable("eventbox.relay_max_in_flight",
                            "Messages the relay has handed to Kafka and not yet seen acknowledged.",
                            nullptr, &relay_max_in_flight, 20000, 1, 1000000, PGC_SIGHUP, 0,
                            nullptr, nullptr, nullptr);
    DefineCustomIntVariable(
        "eventbox.relay_poll_interval", "Longest the relay sleeps when nothing wakes it.",
        "Commits wake the relay at once; this only bounds the wait for work no commit announced.",
        &relay_poll_interval_ms, 1000, 10, 3600 * 1000, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr,
        nullptr);
    DefineCustomIntVariable(
        "eventbox.relay_message_timeout",
        "How long librdkafka tries to deliver a message before reporting a failure; 0 = forever.",
        "0 keeps per-key order through any outage. A timed-out row is retried with backoff and "
        "nothing is dropped, but later rows of its key already in flight may overtake it.",
        &relay_message_timeout_ms, 0, 0, 3600 * 1000, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr,
        nullptr);
    DefineCustomIntVariable(
        "eventbox.relay_linger",
        "Shortest time between the starts of two relay passes while wakes keep coming.",
        "Rows committed meanwhile wait for the next pass; the relay's producer lingers at most "
        "1 ms more (librdkafka linger.ms).",
        &relay_linger_ms, 10, 0, 10000, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr, nullptr);
    DefineCustomIntVariable("eventbox.relay_retry_backoff",
                            "First delay before a failed delivery is retried.", nullptr,
                            &relay_retry_backoff_ms, 1000, 10, 3600 * 1000, PGC_SIGHUP, GUC_UNIT_MS,
                            nullptr, nullptr, nullptr);
    DefineCustomIntVariable("eventbox.relay_retry_backoff_max",
                            "Longest delay between delivery retries (exponential, with jitter).",
                            nullptr, &relay_retry_backoff_max_ms, 60000, 10, 24 * 3600 * 1000,
                            PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr, nullptr);
    DefineCustomIntVariable(
        "eventbox.relay_max_attempts",
        "Attempts before a row whose delivery failed permanently is marked failed.",
        "Transient failures (broker down, timeouts) are retried without limit.",
        &relay_max_attempts, 5, 1, 1000000, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
    DefineCustomIntVariable(
        "eventbox.relay_sweep_interval",
        "How long a row may stay unsettled in the relay before it is copied into outbox_held.",
        nullptr, &relay_sweep_interval_s, 60, 1, 24 * 3600, PGC_SIGHUP, GUC_UNIT_S, nullptr,
        nullptr, nullptr);
}

// The ingest and handler workers, retention and the metrics endpoint.
void define_workers() {
    DefineCustomIntVariable(
        "eventbox.ingest_workers", "Background workers that consume Kafka into the inbox.",
        "Each takes its share of every subscription's partitions; a reload that changes the "
        "number hands the partitions over at their stored offsets.",
        &ingest_workers, 1, 1, shmem::kMaxIngestWorkers, PGC_SIGHUP, 0, nullptr, nullptr, nullptr);
    DefineCustomIntVariable("eventbox.handler_workers",
                            "Background workers that run handlers (lanes run in parallel).",
                            nullptr, &handler_workers, 2, 0, shmem::kMaxHandlerWorkers,
                            PGC_POSTMASTER, 0, nullptr, nullptr, nullptr);
    DefineCustomIntVariable(
        "eventbox.handler_timeout", "Longest a handler may run on one message; 0 = no limit.",
        "A handler still running then is cancelled and the attempt counts as failed.",
        &handler_timeout_ms, 30000, 0, INT_MAX, PGC_SIGHUP, GUC_UNIT_MS, nullptr, nullptr, nullptr);
    DefineCustomBoolVariable(
        "eventbox.allow_superuser_handlers", "Whether handlers may run as a superuser.",
        "Off: registering or running a handler whose run_as role is a superuser is refused.",
        &allow_superuser_handlers, false, PGC_POSTMASTER, 0, nullptr, nullptr, nullptr);
    DefineCustomIntVariable(
        "eventbox.inbox_retention",
        "How long processed and ignored inbox rows are kept (the deduplication horizon).",
        "Rows older than this (by processed_at) are deleted in small batches; a copy of such a "
        "message arriving later is stored and handled again. 0 keeps them forever.",
        &inbox_retention_s, 7 * 24 * 3600, 0, INT_MAX / 1000, PGC_SIGHUP, GUC_UNIT_S, nullptr,
        nullptr, nullptr);
    DefineCustomIntVariable(
        "eventbox.dead_retention",
        "How long dead and unparsable inbox rows and failed outbox rows are kept.",
        "Rows older than this (inbox: by received_at, outbox: by created_at) are deleted; 0 keeps "
        "them until an operator acts.",
        &dead_retention_s, 0, 0, INT_MAX / 1000, PGC_SIGHUP, GUC_UNIT_S, nullptr, nullptr, nullptr);
    // Read-only, set by each worker at its start (set_worker_role()): the inbox's triggers
    // leave out what the ingest and handler workers write themselves (docs/design/handlers.md,
    // "Lane positions"), reading it with current_setting(), which every role may call.
    DefineCustomStringVariable(
        "eventbox.worker_role", "The pg_eventbox worker this process is; empty in other sessions.",
        "Read-only: supervisor, relay, ingest or handler.", &worker_role, "", PGC_INTERNAL,
        GUC_NOT_IN_SAMPLE | GUC_DISALLOW_IN_FILE, nullptr, nullptr, nullptr);
    DefineCustomStringVariable(
        "eventbox.metrics_address",
        "Address (host:port) on which the supervisor serves GET /metrics; empty = off.",
        "Prometheus text format; serve it on a loopback or otherwise protected address.",
        &metrics_address, "", PGC_POSTMASTER, 0, check_metrics_address, nullptr, nullptr);
}

}  // namespace

namespace {

// eventbox.schema_registry_url: empty, or an http:// or https:// URL.
bool check_schema_registry_url(char** newval, void**, GucSource) {
    const char* s = *newval ? *newval : "";
    if (s[0] == '\0' || strncmp(s, "http://", 7) == 0 || strncmp(s, "https://", 8) == 0)
        return true;
    GUC_check_errdetail("eventbox.schema_registry_url must start with http:// or https://.");
    GUC_check_errhint(
        "Example: 'http://127.0.0.1:8081'; credentials go in "
        "eventbox.schema_registry_options.");
    return false;
}

// The Schema Registry of the registry formats (docs/guide/formats.md).
void define_schema_registry() {
    DefineCustomStringVariable(
        "eventbox.schema_registry_url",
        "Schema Registry (Confluent REST API) of subscriptions with value_format 'registry'.",
        "Empty: their records wait, and the subscriptions show the error.", &schema_registry_url,
        "", PGC_SIGHUP, 0, check_schema_registry_url, nullptr, nullptr);
    // Like eventbox.kafka_options: no check hook (it would echo the value), postmaster-level
    // (a reload logs the new value of a changed setting); the ingest worker reports problems
    // without values.
    DefineCustomStringVariable(
        "eventbox.schema_registry_options",
        "Schema Registry client options (key=value, comma-separated), e.g. basic auth.",
        "Superuser-only; never shown in logs or errors.", &schema_registry_options, "",
        PGC_POSTMASTER, GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL, nullptr, nullptr, nullptr);
}

}  // namespace

void set_worker_role(const char* role) {
    SetConfigOption("eventbox.worker_role", role, PGC_INTERNAL, PGC_S_OVERRIDE);
}

void define() {
    define_schema_registry();
    define_connection_and_outbox();
    define_relay();
    define_workers();
    define_amqp();
    MarkGUCPrefixReserved("eventbox");
}

}  // namespace eventbox::guc
