// Every eventbox.* setting, defined in one place (pg/guc.cpp).
#pragma once

namespace eventbox::guc {

extern char* database;                 // eventbox.database
extern char* brokers;                  // eventbox.brokers
extern char* kafka_options;            // eventbox.kafka_options (superuser-only, never logged)
extern char* amqp_url;                 // eventbox.amqp_url ('' = no RabbitMQ)
extern char* amqp_options;             // eventbox.amqp_options (superuser-only, never logged)
extern char* schema_registry_url;      // eventbox.schema_registry_url ('' = none)
extern char* schema_registry_options;  // eventbox.schema_registry_options (superuser-only)
extern int max_message_bytes;
extern int outbox_retention_s;
extern int outbox_rotation_interval_s;  // eventbox.outbox_rotation_interval
extern int outbox_rotation_size_kb;     // eventbox.outbox_rotation_size (0: by age only)
extern int relay_batch_size;
extern int relay_max_in_flight;
extern int relay_poll_interval_ms;
extern int relay_message_timeout_ms;
extern int relay_linger_ms;
extern int relay_retry_backoff_ms;
extern int relay_retry_backoff_max_ms;
extern int relay_max_attempts;
extern int relay_sweep_interval_s;
extern int ingest_workers;
extern int handler_workers;
extern int handler_timeout_ms;
extern bool allow_superuser_handlers;
extern int inbox_retention_s;  // eventbox.inbox_retention (0: keep forever)
extern int dead_retention_s;   // eventbox.dead_retention (0: keep until an operator acts)
extern char* metrics_address;  // eventbox.metrics_address ('' = no HTTP endpoint)
extern char* worker_role;      // eventbox.worker_role (read-only; '' outside the workers)

// Whether eventbox.database lists database `name`.
bool database_listed(const char* name);

// Sets eventbox.worker_role for this process (a worker's start).
void set_worker_role(const char* role);

// Defines the settings; called once from _PG_init.
void define();

}  // namespace eventbox::guc
