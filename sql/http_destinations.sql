-- HTTP destinations: who may manage them, what they accept, and that the request headers
-- (credentials) are readable only by superusers and never echoed in errors.
\set SHOW_CONTEXT never
\set VERBOSITY default
SET client_min_messages = warning;

CREATE ROLE regress_http_admin_member;
CREATE ROLE regress_http_other;
GRANT USAGE ON SCHEMA eventbox TO regress_http_admin_member, regress_http_other;
GRANT EXECUTE ON FUNCTION
    eventbox.create_http_destination(text, text, jsonb, text, interval, integer, integer,
        interval, text, text, double precision, integer, double precision, integer, interval),
    eventbox.alter_http_destination(text, text, jsonb, text, interval, integer, integer,
        interval, text, text, double precision, integer, double precision, integer, interval),
    eventbox.drop_http_destination(text)
  TO regress_http_admin_member, regress_http_other;
GRANT SELECT ON eventbox.http_destinations TO regress_http_admin_member, regress_http_other;

-- A superuser creates one; the view masks the header values.
SELECT eventbox.create_http_destination('crm.invoices', 'https://crm.example.com/api/invoices',
    '{"Authorization": "Bearer TOPSECRET-1", "X-Tenant": "acme"}', max_in_flight => 8);
SELECT topic, url, method, headers, timeout, max_in_flight, created_by
  FROM eventbox.http_destinations;
SELECT eventbox.create_http_destination('crm.invoices', 'https://crm.example.com/other');

-- Without superuser or membership in eventbox_http_admin: refused, even with EXECUTE.
SET ROLE regress_http_other;
SELECT eventbox.create_http_destination('crm.x', 'https://crm.example.com/');
SELECT eventbox.alter_http_destination('crm.invoices', url => 'https://evil.example.com/');
SELECT eventbox.drop_http_destination('crm.invoices');
SELECT topic, headers FROM eventbox.http_destinations;
SELECT * FROM eventbox.http_destination_config;
RESET ROLE;

-- The role the README names: a superuser creates it and grants it.
CREATE ROLE eventbox_http_admin;
GRANT eventbox_http_admin TO regress_http_admin_member;
SET ROLE regress_http_admin_member;
SELECT eventbox.create_http_destination('crm.customers', 'http://127.0.0.1:9/customers',
    method => 'put', timeout => '2 seconds');
SELECT eventbox.alter_http_destination('crm.customers', headers => '{"Api-Key": "TOPSECRET-2"}');
SELECT topic, url, method, headers, timeout FROM eventbox.http_destinations ORDER BY topic;
-- Still no access to the values themselves.
SELECT headers FROM eventbox.http_destination_config;

-- Bad input: a clear error with SQLSTATE and hint; no header value and no URL is echoed.
SELECT eventbox.create_http_destination('crm.bad', 'ftp://crm.example.com/');
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.create_http_destination('crm.bad', 'https://user:TOPSECRET-3@crm.example.com/');
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.create_http_destination('crm.bad', 'https://crm.example.com/a b');
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.create_http_destination('crm.bad', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.create_http_destination('bad topic', 'https://crm.example.com/');
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.create_http_destination('crm.bad', 'https://crm.example.com/', method => 'GET');
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.create_http_destination('crm.bad', 'https://crm.example.com/', timeout => '0');
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.create_http_destination('crm.bad', 'https://crm.example.com/', max_in_flight => 0);
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.create_http_destination('crm.bad', 'https://crm.example.com/', '[]');
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.create_http_destination('crm.bad', 'https://crm.example.com/', '{"Bad Name": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.create_http_destination('crm.bad', 'https://crm.example.com/',
    jsonb_build_object('Authorization', E'Bearer TOPSECRET-4\r\nX-Injected: 1'));
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.create_http_destination('crm.bad', 'https://crm.example.com/', '{"Authorization": 42}');
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.create_http_destination('crm.bad', 'https://crm.example.com/', '{"Idempotency-Key": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.create_http_destination('crm.bad', 'https://crm.example.com/', '{"eventbox-topic": "x"}');
\echo :LAST_ERROR_SQLSTATE
-- Bulk requests and signing secrets (0.4.0): the secrets are never echoed, the view shows
-- their number.
SELECT eventbox.create_http_destination('crm.bad', 'https://crm.example.com/', batch_size => 0);
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.create_http_destination('crm.bad', 'https://crm.example.com/', batch_size => 1001);
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.create_http_destination('crm.bad', 'https://crm.example.com/', batch_wait => '-1 second');
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.create_http_destination('crm.bad', 'https://crm.example.com/', batch_wait => '2 minutes');
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.create_http_destination('crm.bad', 'https://crm.example.com/', batch_format => 'xml');
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.create_http_destination('crm.bad', 'https://crm.example.com/', signing_secret => 'TOPSECRET-5');
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.create_http_destination('crm.bad', 'https://crm.example.com/', signing_secret => 'whsec_dG9vc2hvcnQ=');
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.create_http_destination('crm.bad', 'https://crm.example.com/',
    signing_secret => 'whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3 whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3 whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3');
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.create_http_destination('crm.bad', 'https://crm.example.com/', '{"webhook-signature": "x"}');
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.create_http_destination('crm.bulk', 'https://crm.example.com/composite/sobjects',
    batch_size => 200, batch_wait => '250ms', batch_format => 'SObject_Collections',
    signing_secret => 'whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3');
SELECT eventbox.alter_http_destination('crm.bulk', batch_size => 50,
    signing_secret => 'whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3 whsec_YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4');
SELECT topic, batch_size, batch_wait, batch_format, signing_secrets
  FROM eventbox.http_destinations WHERE topic = 'crm.bulk';
SELECT eventbox.alter_http_destination('crm.bulk', signing_secret => '');
-- Rate limits and the circuit breaker.
SELECT eventbox.alter_http_destination('crm.bulk', rate_limit => -1);
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.alter_http_destination('crm.bulk', rate_burst => 0);
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.alter_http_destination('crm.bulk', max_messages_per_second => 'NaN');
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.alter_http_destination('crm.bulk', breaker_failures => 1001);
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.alter_http_destination('crm.bulk', breaker_cooldown => '10ms');
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.alter_http_destination('crm.bulk', rate_limit => 25, rate_burst => 5,
    max_messages_per_second => 2000, breaker_failures => 5, breaker_cooldown => '1 minute');
SELECT rate_limit, rate_burst, max_messages_per_second, breaker_failures, breaker_cooldown
  FROM eventbox.http_destinations WHERE topic = 'crm.bulk';
SELECT eventbox.alter_http_destination('crm.bulk', batch_format => 'csv');
\echo :LAST_ERROR_SQLSTATE
SELECT topic, batch_size, batch_format, signing_secrets
  FROM eventbox.http_destinations WHERE topic = 'crm.bulk';
SELECT eventbox.drop_http_destination('crm.bulk');

SELECT eventbox.alter_http_destination('crm.nothing', url => 'https://crm.example.com/');
\echo :LAST_ERROR_SQLSTATE
SELECT eventbox.drop_http_destination('crm.nothing');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS destinations FROM eventbox.http_destinations;

SELECT eventbox.drop_http_destination('crm.customers');
RESET ROLE;
SELECT eventbox.drop_http_destination('crm.invoices');
SELECT count(*) AS destinations FROM eventbox.http_destination_config;

REVOKE ALL ON FUNCTION
    eventbox.create_http_destination(text, text, jsonb, text, interval, integer, integer,
        interval, text, text, double precision, integer, double precision, integer, interval),
    eventbox.alter_http_destination(text, text, jsonb, text, interval, integer, integer,
        interval, text, text, double precision, integer, double precision, integer, interval),
    eventbox.drop_http_destination(text)
  FROM regress_http_admin_member, regress_http_other;
REVOKE ALL ON eventbox.http_destinations FROM regress_http_admin_member, regress_http_other;
REVOKE ALL ON SCHEMA eventbox FROM regress_http_admin_member, regress_http_other;
DROP ROLE regress_http_admin_member, regress_http_other, eventbox_http_admin;
