-- eventbox.metrics() and the view eventbox.metrics read the gauges from the tables in the
-- caller's session. With many rows (here 5000 lag rows) their arrays are large chunks of their
-- own: they were allocated in SPI's memory, freed at SPI_finish() before the text was built
-- from them (an ERROR "basic_string: construction from null" or garbage labels).
SELECT eventbox.create_subscription('m_sub', ARRAY['m_topic']);
INSERT INTO eventbox.offsets (subscription, topic, "partition", next_offset, high_watermark)
SELECT 'm_sub', 'm_topic_' || (g % 50), g, 10, 10 + g FROM generate_series(0, 4999) g;
INSERT INTO eventbox.inbox (subscription, message_id, topic, "partition", "offset", status)
SELECT 'm_sub', 'm' || g, 'm_topic', 0, g, 'received' FROM generate_series(1, 3) g;

SELECT count(*) AS samples, sum(value) AS lag, count(DISTINCT labels->>'topic') AS topics,
       count(DISTINCT labels->>'partition') AS partitions
  FROM eventbox.metrics
 WHERE name = 'eventbox_ingest_lag' AND labels->>'subscription' = 'm_sub';
SELECT value FROM eventbox.metrics
 WHERE name = 'eventbox_inbox_pending' AND labels->>'subscription' = 'm_sub';

-- The same samples in the text format.
SELECT count(*) AS lag_lines,
       sum(split_part(l, ' ', 2)::numeric) AS lag
  FROM regexp_split_to_table(eventbox.metrics(), E'\n') l
 WHERE l LIKE 'eventbox\_ingest\_lag{subscription="m\_sub",topic="m\_topic\_%",partition="%"} %';
SELECT l FROM regexp_split_to_table(eventbox.metrics(), E'\n') l
 WHERE l LIKE 'eventbox\_inbox\_pending{subscription="m\_sub"}%';

-- eventbox_subscription_errors: the ingest workers that cannot consume a subscription (its rows
-- of eventbox.subscription_errors), 0 once it is consumed again.
SELECT value FROM eventbox.metrics
 WHERE name = 'eventbox_subscription_errors' AND labels->>'subscription' = 'm_sub';
INSERT INTO eventbox.ingest_errors (subscription, worker, error)
VALUES ('m_sub', 0, 'topic m_topic: Broker: Unknown topic or partition');
SELECT l FROM regexp_split_to_table(eventbox.metrics(), E'\n') l
 WHERE l LIKE 'eventbox\_subscription\_errors{subscription="m\_sub"}%';
DELETE FROM eventbox.ingest_errors WHERE subscription = 'm_sub';

SELECT eventbox.drop_subscription('m_sub');
