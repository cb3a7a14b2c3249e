-- pg_eventbox 0.3.0 -> 0.4.0. Released scripts never change: every schema change of 0.4.0 is
-- made here and in pg_eventbox--0.4.0.sql, and the upgrade test proves both give the same schema.
\echo Use "ALTER EXTENSION pg_eventbox UPDATE TO '0.4.0'" to load this file. \quit

-- ---- 0.4.0: the grant sets as rows, one a name ---------------------------------------------
-- Which functions and tables a writer or an admin is granted, by name (every overload of a
-- function). A release that adds an API function adds its row here, in its upgrade script and
-- its full install script; the `grants` regression suite lists any function without one.
CREATE TABLE eventbox._grant_names (
    name text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('writer', 'admin')),
    object text NOT NULL CHECK (object IN ('function', 'table')),
    PRIMARY KEY (name, object)
);
INSERT INTO eventbox._grant_names (name, kind, object)
SELECT n, 'writer', 'function' FROM unnest(ARRAY['send', 'current_mode']) n
UNION ALL
SELECT n, 'admin', 'function'
  FROM unnest(ARRAY['create_subscription', 'alter_subscription', 'drop_subscription',
                    'register_handler', 'unregister_handler', 'process', 'retry', 'redrive',
                    'skip', 'replay', 'reprocess', 'dry_run', 'workers', 'metrics',
                    'metric_samples', 'create_http_destination', 'alter_http_destination',
                    'drop_http_destination']) n
UNION ALL
SELECT n, 'admin', 'table'
  FROM unnest(ARRAY['subscriptions', 'handlers', 'inbox', 'offsets', 'inbox_stats', 'lag',
                    'outbox', 'outbox_stats', 'workers', 'subscription_errors', 'key_blocks',
                    'blocked_keys', 'conflicts', 'suppressed_sends', 'metrics',
                    'http_destinations']) n;
REVOKE ALL ON eventbox._grant_names FROM PUBLIC;

-- What a writer or an admin is granted in the installed version: one GRANT target a row.
CREATE OR REPLACE FUNCTION eventbox._grant_set(kind text, OUT privilege text, OUT target text)
RETURNS SETOF record
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT 'USAGE', 'SCHEMA eventbox'
    UNION ALL
    SELECT 'EXECUTE', 'FUNCTION ' || p.oid::regprocedure::text
      FROM pg_proc p JOIN eventbox._grant_names g ON g.name = p.proname
     WHERE p.pronamespace = 'eventbox'::regnamespace AND g.object = 'function'
       AND g.kind = _grant_set.kind
    UNION ALL
    SELECT 'SELECT', 'TABLE ' || c.oid::regclass::text
      FROM pg_class c JOIN eventbox._grant_names g ON g.name = c.relname
     WHERE c.relnamespace = 'eventbox'::regnamespace AND g.object = 'table'
       AND g.kind = _grant_set.kind AND _grant_set.kind = 'admin'
$$;

-- ---- 0.4.0: HTTP bulk requests, signed webhooks, rate limits, circuit breaker -------------
-- Bulk requests (up to batch_size messages a request, in one of the batch formats, each
-- message settled by its per-record result), Standard Webhooks signatures (signing_secrets,
-- write-only like the header values), rate limits (0: none) and a circuit breaker (0: none).
-- See docs/guide/http.md.
ALTER TABLE eventbox.http_destination_config
    ADD COLUMN batch_size integer NOT NULL DEFAULT 1,
    ADD COLUMN batch_wait interval NOT NULL DEFAULT '100 milliseconds',
    ADD COLUMN batch_format text NOT NULL DEFAULT 'json_array',
    ADD COLUMN signing_secrets text[] NOT NULL DEFAULT '{}',
    ADD COLUMN rate_limit double precision NOT NULL DEFAULT 0,
    ADD COLUMN rate_burst integer NOT NULL DEFAULT 1,
    ADD COLUMN max_messages_per_second double precision NOT NULL DEFAULT 0,
    ADD COLUMN breaker_failures integer NOT NULL DEFAULT 0,
    ADD COLUMN breaker_cooldown interval NOT NULL DEFAULT '30 seconds',
    ADD CONSTRAINT http_destination_batch_size_check CHECK (batch_size BETWEEN 1 AND 1000),
    ADD CONSTRAINT http_destination_batch_wait_check
        CHECK (batch_wait >= '0' AND batch_wait <= '1 minute'),
    ADD CONSTRAINT http_destination_batch_format_check
        CHECK (batch_format IN ('json_array', 'ndjson', 'sobject_collections')),
    ADD CONSTRAINT http_destination_signing_secrets_check
        CHECK (cardinality(signing_secrets) <= 2),
    ADD CONSTRAINT http_destination_rate_check
        CHECK (rate_limit BETWEEN 0 AND 100000 AND rate_burst BETWEEN 1 AND 100000
               AND max_messages_per_second BETWEEN 0 AND 1000000),
    ADD CONSTRAINT http_destination_breaker_check
        CHECK (breaker_failures BETWEEN 0 AND 1000
               AND breaker_cooldown >= '100 milliseconds' AND breaker_cooldown <= '1 hour');

-- The secrets are masked as their number.
CREATE OR REPLACE VIEW eventbox.http_destinations AS
SELECT c.topic, c.url, c.method,
       coalesce((SELECT jsonb_object_agg(h.name, '********')
                   FROM jsonb_object_keys(c.headers) AS h(name)), '{}'::jsonb) AS headers,
       c.timeout, c.max_in_flight, c.created_by, c.updated_at,
       c.batch_size, c.batch_wait, c.batch_format,
       cardinality(c.signing_secrets) AS signing_secrets,
       c.rate_limit, c.rate_burst, c.max_messages_per_second, c.breaker_failures,
       c.breaker_cooldown
  FROM eventbox.http_destination_config c;

-- The API functions get new last parameters: created again, with the EXECUTE grants given on
-- the old ones (e.g. to eventbox_http_admin) given on the new ones.
CREATE TABLE eventbox._upgrade_http_grants AS
SELECT p.proname::text AS fn, a.grantee::regrole::text AS grantee, a.is_grantable
  FROM pg_catalog.pg_proc p, LATERAL pg_catalog.aclexplode(p.proacl) a
 WHERE p.oid IN ('eventbox.create_http_destination(text, text, jsonb, text, interval, integer)'::regprocedure,
                 'eventbox.alter_http_destination(text, text, jsonb, text, interval, integer)'::regprocedure)
   AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0;
DROP FUNCTION eventbox.create_http_destination(text, text, jsonb, text, interval, integer);
DROP FUNCTION eventbox.alter_http_destination(text, text, jsonb, text, interval, integer);
DROP FUNCTION eventbox._create_http_destination(oid, text, text, jsonb, text, interval, integer);
DROP FUNCTION eventbox._alter_http_destination(oid, text, text, jsonb, text, interval, integer);
DROP FUNCTION eventbox._check_http_destination(text, text, jsonb, text, interval, integer);

-- signing_secret: one Standard Webhooks secret, or two separated by a space during a rotation;
-- '' removes them. Secrets are never echoed.
CREATE FUNCTION eventbox._http_signing_secrets(signing_secret text) RETURNS text[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    secrets text[] := coalesce(regexp_split_to_array(btrim(signing_secret, ' '), ' +'), '{}');
    s text;
BEGIN
    IF btrim(signing_secret, ' ') = '' THEN
        RETURN '{}';
    END IF;
    IF cardinality(secrets) > 2 THEN
        PERFORM eventbox._http_error('22023', 'signing_secret holds more than two secrets',
            'Pass one secret, or two separated by a space while rotating (the new one and the old one).');
    END IF;
    FOREACH s IN ARRAY secrets LOOP
        IF s !~ '^whsec_[A-Za-z0-9+/]+={0,2}$' OR (length(s) - 6) % 4 <> 0
           OR length(decode(substr(s, 7), 'base64')) NOT BETWEEN 24 AND 64 THEN
            PERFORM eventbox._http_error('22023', 'signing_secret is not a Standard Webhooks secret',
                'A secret is ''whsec_'' followed by the base64 of 24 to 64 random bytes, e.g. ''whsec_'' || encode(gen_random_bytes(32), ''base64'') with pgcrypto.');
        END IF;
    END LOOP;
    RETURN secrets;
END $$;

CREATE FUNCTION eventbox._check_http_destination(topic text, url text, headers jsonb, method text,
                                                 timeout interval, max_in_flight integer,
                                                 batch_size integer, batch_wait interval,
                                                 batch_format text, rate_limit double precision,
                                                 rate_burst integer,
                                                 max_messages_per_second double precision,
                                                 breaker_failures integer,
                                                 breaker_cooldown interval)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    h record;
BEGIN
    IF topic IS NULL THEN
        PERFORM eventbox._http_error('22004', 'topic must not be NULL',
            'Pass the topic whose messages go to this URL.');
    END IF;
    IF topic !~ '^[A-Za-z0-9._-]{1,249}$' OR topic IN ('.', '..') THEN
        PERFORM eventbox._http_error('22023', format('invalid topic name %s', eventbox._quote(topic)),
            'Kafka topic names are 1 to 249 characters of letters, digits, ''.'', ''_'' and ''-''.');
    END IF;
    -- The URL's text is not echoed: it may carry a token in its query string.
    IF url IS NULL OR url !~* '^https?://[^/?#@[:space:]]+([/?#][^[:space:][:cntrl:]]*)?$' THEN
        PERFORM eventbox._http_error('22023', 'url must be an http:// or https:// URL with a host',
            'E.g. ''https://crm.example.com/api/invoices''; no spaces or control characters, no user:password@ (put credentials in headers).');
    END IF;
    IF length(url) > 2048 THEN
        PERFORM eventbox._http_error('22023', 'url is longer than 2048 characters',
            'Use a shorter URL.');
    END IF;
    IF method IS NULL OR method NOT IN ('POST', 'PUT', 'PATCH') THEN
        PERFORM eventbox._http_error('22023', 'method must be POST, PUT or PATCH',
            'The message is the request body.');
    END IF;
    IF timeout IS NULL OR timeout < '100 milliseconds' OR timeout > '1 hour' THEN
        PERFORM eventbox._http_error('22023', 'timeout must be between 100 milliseconds and 1 hour',
            'It bounds one request, connection included; e.g. ''10 seconds''.');
    END IF;
    IF max_in_flight IS NULL OR max_in_flight NOT BETWEEN 1 AND 1000 THEN
        PERFORM eventbox._http_error('22023', 'max_in_flight must be between 1 and 1000',
            'It is the number of requests open at a time, e.g. 32.');
    END IF;
    IF batch_size IS NULL OR batch_size NOT BETWEEN 1 AND 1000 THEN
        PERFORM eventbox._http_error('22023', 'batch_size must be between 1 and 1000',
            'It is the most messages one request carries; 1 sends each message as its own request.');
    END IF;
    IF batch_wait IS NULL OR batch_wait < '0' OR batch_wait > '1 minute' THEN
        PERFORM eventbox._http_error('22023', 'batch_wait must be between 0 and 1 minute',
            'It is how long a bulk request that is not full waits for more messages, e.g. ''100 milliseconds''.');
    END IF;
    IF batch_format IS NULL OR batch_format NOT IN ('json_array', 'ndjson', 'sobject_collections') THEN
        PERFORM eventbox._http_error('22023', format('invalid batch_format %s', coalesce(eventbox._quote(batch_format), 'NULL')),
            'Use ''json_array'', ''ndjson'' or ''sobject_collections''.');
    END IF;
    IF rate_limit IS NULL OR NOT (rate_limit BETWEEN 0 AND 100000) THEN
        PERFORM eventbox._http_error('22023', 'rate_limit must be between 0 and 100000',
            'It is requests per second to this destination, e.g. 20; 0 for no limit.');
    END IF;
    IF rate_burst IS NULL OR rate_burst NOT BETWEEN 1 AND 100000 THEN
        PERFORM eventbox._http_error('22023', 'rate_burst must be between 1 and 100000',
            'It is how many requests may go at once after a quiet time, e.g. 1 (evenly spaced).');
    END IF;
    IF max_messages_per_second IS NULL OR NOT (max_messages_per_second BETWEEN 0 AND 1000000) THEN
        PERFORM eventbox._http_error('22023', 'max_messages_per_second must be between 0 and 1000000',
            'It bounds the messages per second over all requests, e.g. 500; 0 for no limit.');
    END IF;
    IF breaker_failures IS NULL OR breaker_failures NOT BETWEEN 0 AND 1000 THEN
        PERFORM eventbox._http_error('22023', 'breaker_failures must be between 0 and 1000',
            'It is the transient failures in a row that open the circuit breaker, e.g. 5; 0 for no breaker.');
    END IF;
    IF breaker_cooldown IS NULL OR breaker_cooldown < '100 milliseconds' OR breaker_cooldown > '1 hour' THEN
        PERFORM eventbox._http_error('22023', 'breaker_cooldown must be between 100 milliseconds and 1 hour',
            'It is how long an open breaker sends nothing before one probe request, e.g. ''30 seconds''.');
    END IF;
    IF headers IS NULL OR jsonb_typeof(headers) <> 'object' THEN
        PERFORM eventbox._http_error('22023', 'headers must be a JSON object',
            'Pass a flat object of strings, e.g. ''{"Authorization": "Bearer ..."}''.');
    END IF;
    -- Names are echoed, values never (they are credentials).
    FOR h IN SELECT e.key, e.value FROM jsonb_each(headers) e LOOP
        IF h.key !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$' OR length(h.key) > 256 THEN
            PERFORM eventbox._http_error('22023', format('invalid HTTP header name %s', eventbox._quote(h.key)),
            'Header names are HTTP tokens: letters, digits and !#$%&''*+.^_`|~-.');
        END IF;
        IF lower(h.key) IN ('idempotency-key', 'content-length', 'transfer-encoding', 'host',
                            'connection', 'expect', 'te', 'upgrade', 'trailer', 'keep-alive',
                            'webhook-id', 'webhook-timestamp', 'webhook-signature')
           OR lower(h.key) LIKE 'eventbox-%' THEN
            PERFORM eventbox._http_error('22023', format('header %s is set by the relay', eventbox._quote(h.key)),
            'Idempotency-Key, Eventbox-*, webhook-* (signing_secret) and the framing headers cannot be configured.');
        END IF;
        IF jsonb_typeof(h.value) <> 'string' THEN
            PERFORM eventbox._http_error('22023', format('value of header %s is not a string', eventbox._quote(h.key)),
            'Headers must be a flat JSON object of string values.');
        END IF;
        IF (h.value #>> '{}') ~ '[\x01-\x08\x0a-\x1f\x7f]' THEN
            PERFORM eventbox._http_error('22023', format('value of header %s contains a control character', eventbox._quote(h.key)),
            'Header values may not contain CR, LF or other control characters (tab is allowed).');
        END IF;
    END LOOP;
END $$;

CREATE FUNCTION eventbox._create_http_destination(caller oid, topic text, url text, headers jsonb,
                                                  method text, timeout interval,
                                                  max_in_flight integer, batch_size integer,
                                                  batch_wait interval, batch_format text,
                                                  signing_secret text,
                                                  rate_limit double precision,
                                                  rate_burst integer,
                                                  max_messages_per_second double precision,
                                                  breaker_failures integer,
                                                  breaker_cooldown interval)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    secrets text[];
BEGIN
    PERFORM eventbox._check_http_admin(caller);
    PERFORM eventbox._check_http_destination(topic, url, headers, upper(method), timeout,
                                             max_in_flight, batch_size, batch_wait,
                                             lower(batch_format), rate_limit, rate_burst,
                                             max_messages_per_second, breaker_failures,
                                             breaker_cooldown);
    secrets := eventbox._http_signing_secrets(signing_secret);
    BEGIN
        INSERT INTO eventbox.http_destination_config (topic, url, method, headers, timeout,
                                                      max_in_flight, created_by, batch_size,
                                                      batch_wait, batch_format, signing_secrets,
                                                      rate_limit, rate_burst,
                                                      max_messages_per_second, breaker_failures,
                                                      breaker_cooldown)
        VALUES (topic, url, upper(method), headers, timeout, max_in_flight, caller::regrole,
                batch_size, batch_wait, lower(batch_format), secrets, rate_limit, rate_burst,
                max_messages_per_second, breaker_failures, breaker_cooldown);
    EXCEPTION WHEN unique_violation THEN
        PERFORM eventbox._http_error('42710', format('topic %s has an HTTP destination already', eventbox._quote(topic)),
            'Use eventbox.alter_http_destination() to change it.');
    END;
END $$;

CREATE FUNCTION eventbox._alter_http_destination(caller oid, topic text, url text, headers jsonb,
                                                 method text, timeout interval,
                                                 max_in_flight integer, batch_size integer,
                                                 batch_wait interval, batch_format text,
                                                 signing_secret text,
                                                 rate_limit double precision,
                                                 rate_burst integer,
                                                 max_messages_per_second double precision,
                                                 breaker_failures integer,
                                                 breaker_cooldown interval)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    d eventbox.http_destination_config;
BEGIN
    PERFORM eventbox._check_http_admin(caller);
    SELECT * INTO d FROM eventbox.http_destination_config c
     WHERE c.topic = _alter_http_destination.topic FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM eventbox._http_error('42704', format('topic %s has no HTTP destination', coalesce(eventbox._quote(topic), 'NULL')),
            'See eventbox.http_destinations; create one with eventbox.create_http_destination().');
    END IF;
    d.url := coalesce(url, d.url);
    d.headers := coalesce(headers, d.headers);
    d.method := coalesce(upper(method), d.method);
    d.timeout := coalesce(timeout, d.timeout);
    d.max_in_flight := coalesce(max_in_flight, d.max_in_flight);
    d.batch_size := coalesce(batch_size, d.batch_size);
    d.batch_wait := coalesce(batch_wait, d.batch_wait);
    d.batch_format := coalesce(lower(batch_format), d.batch_format);
    d.rate_limit := coalesce(rate_limit, d.rate_limit);
    d.rate_burst := coalesce(rate_burst, d.rate_burst);
    d.max_messages_per_second := coalesce(max_messages_per_second, d.max_messages_per_second);
    d.breaker_failures := coalesce(breaker_failures, d.breaker_failures);
    d.breaker_cooldown := coalesce(breaker_cooldown, d.breaker_cooldown);
    PERFORM eventbox._check_http_destination(d.topic, d.url, d.headers, d.method,
                                             d.timeout, d.max_in_flight, d.batch_size,
                                             d.batch_wait, d.batch_format, d.rate_limit,
                                             d.rate_burst, d.max_messages_per_second,
                                             d.breaker_failures, d.breaker_cooldown);
    IF signing_secret IS NOT NULL THEN
        d.signing_secrets := eventbox._http_signing_secrets(signing_secret);
    END IF;
    UPDATE eventbox.http_destination_config c
       SET url = d.url, headers = d.headers, method = d.method, timeout = d.timeout,
           max_in_flight = d.max_in_flight, batch_size = d.batch_size,
           batch_wait = d.batch_wait, batch_format = d.batch_format,
           signing_secrets = d.signing_secrets, rate_limit = d.rate_limit,
           rate_burst = d.rate_burst, max_messages_per_second = d.max_messages_per_second,
           breaker_failures = d.breaker_failures, breaker_cooldown = d.breaker_cooldown,
           updated_at = now()
     WHERE c.topic = d.topic;
END $$;

CREATE FUNCTION eventbox.create_http_destination(
    topic text, url text, headers jsonb DEFAULT '{}', method text DEFAULT 'POST',
    timeout interval DEFAULT '10 seconds', max_in_flight integer DEFAULT 32,
    batch_size integer DEFAULT 1, batch_wait interval DEFAULT '100 milliseconds',
    batch_format text DEFAULT 'json_array', signing_secret text DEFAULT NULL,
    rate_limit double precision DEFAULT 0, rate_burst integer DEFAULT 1,
    max_messages_per_second double precision DEFAULT 0, breaker_failures integer DEFAULT 0,
    breaker_cooldown interval DEFAULT '30 seconds')
RETURNS void LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';
CREATE FUNCTION eventbox.alter_http_destination(
    topic text, url text DEFAULT NULL, headers jsonb DEFAULT NULL, method text DEFAULT NULL,
    timeout interval DEFAULT NULL, max_in_flight integer DEFAULT NULL,
    batch_size integer DEFAULT NULL, batch_wait interval DEFAULT NULL,
    batch_format text DEFAULT NULL, signing_secret text DEFAULT NULL,
    rate_limit double precision DEFAULT NULL, rate_burst integer DEFAULT NULL,
    max_messages_per_second double precision DEFAULT NULL, breaker_failures integer DEFAULT NULL,
    breaker_cooldown interval DEFAULT NULL)
RETURNS void LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'eventbox_api_call';
COMMENT ON FUNCTION eventbox.create_http_destination(text, text, jsonb, text, interval, integer,
                                                     integer, interval, text, text,
                                                     double precision, integer, double precision, integer, interval) IS
    'Deliver the messages of a topic as HTTP requests to a URL instead of Kafka records';

REVOKE ALL ON FUNCTION eventbox._http_signing_secrets(text),
    eventbox._check_http_destination(text, text, jsonb, text, interval, integer, integer,
                                     interval, text, double precision, integer, double precision, integer, interval),
    eventbox._create_http_destination(oid, text, text, jsonb, text, interval, integer, integer,
                                      interval, text, text, double precision, integer, double precision, integer, interval),
    eventbox._alter_http_destination(oid, text, text, jsonb, text, interval, integer, integer,
                                     interval, text, text, double precision, integer, double precision, integer, interval),
    eventbox.create_http_destination(text, text, jsonb, text, interval, integer, integer,
                                     interval, text, text, double precision, integer, double precision, integer, interval),
    eventbox.alter_http_destination(text, text, jsonb, text, interval, integer, integer,
                                    interval, text, text, double precision, integer, double precision, integer, interval) FROM PUBLIC;
DO LANGUAGE plpgsql $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT * FROM eventbox._upgrade_http_grants LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION eventbox.%I(text, text, jsonb, text, interval, '
                       'integer, integer, interval, text, text, double precision, integer, '
                       'double precision, integer, interval) TO %s%s', g.fn, g.grantee,
                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END $$;
DROP TABLE eventbox._upgrade_http_grants;

-- The circuit breaker of each destination that has one, as the relay last published it.
CREATE FUNCTION eventbox.http_breakers(OUT topic text, OUT state text, OUT since timestamptz,
                                       OUT opened bigint, OUT half_opened bigint,
                                       OUT closed bigint)
RETURNS SETOF record
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'eventbox_http_breakers';
CREATE VIEW eventbox.http_breakers AS SELECT * FROM eventbox.http_breakers();
COMMENT ON VIEW eventbox.http_breakers IS
    'Circuit breakers of HTTP destinations: closed, open or half_open, and their transitions';
REVOKE ALL ON FUNCTION eventbox.http_breakers() FROM PUBLIC;
REVOKE ALL ON eventbox.http_breakers FROM PUBLIC;
INSERT INTO eventbox._grant_names (name, kind, object)
VALUES ('http_breakers', 'admin', 'function'), ('http_breakers', 'admin', 'table');

-- Each change of 0.4.0 goes in its own section above this line, headed
-- "-- ---- 0.4.0: <what> ----", and the same objects in the full install script.

-- Last, as in every upgrade script: the recorded roles get this release's set.
SELECT eventbox._regrant();
