-- eventbox.* settings: defaults, contexts, and what bad values get.
-- The library is preloaded in the test cluster; LOAD makes this file independent of that.
LOAD 'pg_eventbox';
\set SHOW_CONTEXT never
\set show_sqlstate 'SELECT :''LAST_ERROR_SQLSTATE'' AS sqlstate;'

-- Built-in defaults. eventbox.database and eventbox.brokers are set by the test cluster's
-- postgresql.conf, so their defaults are read from boot_val; kafka_options is hidden (below).
SELECT name, boot_val, unit, context, vartype, min_val, max_val
  FROM pg_settings WHERE name LIKE 'eventbox.%' ORDER BY name;

-- SHOW of each setting the test cluster leaves at its default.
SHOW eventbox.max_message_bytes;
SHOW eventbox.outbox_retention;
SHOW eventbox.outbox_rotation_size;
SHOW eventbox.relay_batch_size;
SHOW eventbox.relay_linger;
SHOW eventbox.relay_max_attempts;
SHOW eventbox.relay_max_in_flight;
SHOW eventbox.relay_message_timeout;
SHOW eventbox.relay_poll_interval;
SHOW eventbox.relay_retry_backoff;
SHOW eventbox.relay_retry_backoff_max;
SHOW eventbox.relay_sweep_interval;
SHOW eventbox.ingest_workers;
SELECT current_setting('eventbox.database') <> '' AS database_is_set;

-- None of them can be changed by a session: server-wide (sighup) or at server start
-- (postmaster).
SET eventbox.brokers = 'nohostport';
:show_sqlstate
SET eventbox.brokers = 'kafka1:9092';
:show_sqlstate
SET eventbox.max_message_bytes = 2048;
:show_sqlstate
SET eventbox.relay_batch_size = 10;
:show_sqlstate
SELECT set_config('eventbox.outbox_retention', '3600', false);
:show_sqlstate
SET eventbox.database = 'other';
:show_sqlstate
SET eventbox.kafka_options = 'acks=1';
:show_sqlstate
BEGIN;
SET LOCAL eventbox.relay_linger = 100;
ROLLBACK;

-- Bad values are rejected by the check hooks and range limits with a clear message; ALTER
-- SYSTEM validates without changing anything when the value is bad.
ALTER SYSTEM SET eventbox.brokers = 'nohostport';
:show_sqlstate
ALTER SYSTEM SET eventbox.brokers = 'kafka1:9092,kafka2';
:show_sqlstate
ALTER SYSTEM SET eventbox.brokers = 'kafka1:0';
:show_sqlstate
ALTER SYSTEM SET eventbox.brokers = 'kafka1:65536';
:show_sqlstate
ALTER SYSTEM SET eventbox.brokers = 'kafka1:99999999999999999999999';
:show_sqlstate
ALTER SYSTEM SET eventbox.brokers = ':9092';
:show_sqlstate
ALTER SYSTEM SET eventbox.brokers = 'kafka1:';
:show_sqlstate
ALTER SYSTEM SET eventbox.brokers = 'kafka1:90a2';
:show_sqlstate
ALTER SYSTEM SET eventbox.brokers = 'kafka1:9092,';
:show_sqlstate
ALTER SYSTEM SET eventbox.database = '';
:show_sqlstate
ALTER SYSTEM SET eventbox.database = 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa';
:show_sqlstate
-- A list of databases (one supervisor each): no empty item, no name twice, at most 8.
ALTER SYSTEM SET eventbox.database = 'app,';
:show_sqlstate
ALTER SYSTEM SET eventbox.database = 'app, app';
:show_sqlstate
ALTER SYSTEM SET eventbox.database = 'a,b,c,d,e,f,g,h,i';
:show_sqlstate
ALTER SYSTEM SET eventbox.database = ' app , billing ';
ALTER SYSTEM RESET eventbox.database;
ALTER SYSTEM SET eventbox.max_message_bytes = 100;
:show_sqlstate
ALTER SYSTEM SET eventbox.max_message_bytes = '200MB';
:show_sqlstate
ALTER SYSTEM SET eventbox.max_message_bytes = 'lots';
:show_sqlstate
ALTER SYSTEM SET eventbox.relay_batch_size = 0;
:show_sqlstate
ALTER SYSTEM SET eventbox.relay_max_in_flight = 0;
:show_sqlstate
ALTER SYSTEM SET eventbox.relay_max_attempts = 0;
:show_sqlstate
ALTER SYSTEM SET eventbox.relay_poll_interval = '5ms';
:show_sqlstate
ALTER SYSTEM SET eventbox.relay_poll_interval = '2h';
:show_sqlstate
ALTER SYSTEM SET eventbox.relay_message_timeout = -1;
:show_sqlstate
ALTER SYSTEM SET eventbox.relay_message_timeout = '3601s';
:show_sqlstate
ALTER SYSTEM SET eventbox.relay_retry_backoff = 5;
:show_sqlstate
ALTER SYSTEM SET eventbox.relay_retry_backoff_max = '25h';
:show_sqlstate
ALTER SYSTEM SET eventbox.relay_linger = -1;
:show_sqlstate
ALTER SYSTEM SET eventbox.relay_sweep_interval = 0;
:show_sqlstate
ALTER SYSTEM SET eventbox.outbox_retention = -1;
:show_sqlstate
ALTER SYSTEM SET eventbox.outbox_retention = '1 fortnight';
:show_sqlstate
ALTER SYSTEM SET eventbox.outbox_rotation_size = -1;
:show_sqlstate
ALTER SYSTEM SET eventbox.outbox_rotation_size = '64 parsecs';
:show_sqlstate
ALTER SYSTEM SET eventbox.ingest_workers = 0;
:show_sqlstate
ALTER SYSTEM SET eventbox.ingest_workers = 9;
:show_sqlstate
SET eventbox.ingest_workers = 2;
:show_sqlstate
-- Nothing was written by the rejected ALTER SYSTEM commands above.
SELECT count(*) AS eventbox_lines_in_auto_conf
  FROM pg_file_settings
 WHERE name LIKE 'eventbox.%' AND sourcefile LIKE '%postgresql.auto.conf';

-- The prefix is reserved: unknown eventbox.* names are errors, not placeholders.
SET eventbox.foo = 1;
:show_sqlstate
SET eventbox.relay_batchsize = 10;
:show_sqlstate
SHOW eventbox.foo;
:show_sqlstate
SELECT current_setting('eventbox.foo', true) IS NULL AS missing;
ALTER SYSTEM SET eventbox.foo = 1;
:show_sqlstate

-- eventbox.kafka_options may hold credentials: a superuser can SHOW it, but it is never listed
-- (SHOW ALL, pg_settings), and other roles cannot read it at all.
SHOW eventbox.kafka_options;
SELECT count(*) AS listed_in_pg_settings FROM pg_settings WHERE name = 'eventbox.kafka_options';
SELECT count(*) AS listed_in_show_all
  FROM pg_show_all_settings() WHERE name = 'eventbox.kafka_options';
CREATE ROLE regress_eventbox_guc_reader;
SET ROLE regress_eventbox_guc_reader;
SHOW eventbox.kafka_options;
:show_sqlstate
SELECT current_setting('eventbox.kafka_options');
:show_sqlstate
SELECT current_setting('eventbox.kafka_options', true);
:show_sqlstate
SELECT count(*) AS listed_in_pg_settings FROM pg_settings WHERE name = 'eventbox.kafka_options';
-- The other settings are readable by everyone.
SHOW eventbox.max_message_bytes;
SELECT count(*) AS visible_settings FROM pg_settings WHERE name LIKE 'eventbox.%';
RESET ROLE;
DROP ROLE regress_eventbox_guc_reader;

-- Safety net: should a bad value above ever be accepted, do not leave it for the next reload.
ALTER SYSTEM RESET eventbox.brokers;
ALTER SYSTEM RESET eventbox.database;
ALTER SYSTEM RESET eventbox.max_message_bytes;
ALTER SYSTEM RESET eventbox.outbox_retention;
ALTER SYSTEM RESET eventbox.outbox_rotation_size;
ALTER SYSTEM RESET eventbox.relay_batch_size;
ALTER SYSTEM RESET eventbox.relay_max_in_flight;
ALTER SYSTEM RESET eventbox.relay_max_attempts;
ALTER SYSTEM RESET eventbox.relay_poll_interval;
ALTER SYSTEM RESET eventbox.relay_message_timeout;
ALTER SYSTEM RESET eventbox.relay_retry_backoff;
ALTER SYSTEM RESET eventbox.relay_retry_backoff_max;
ALTER SYSTEM RESET eventbox.relay_linger;
ALTER SYSTEM RESET eventbox.relay_sweep_interval;
