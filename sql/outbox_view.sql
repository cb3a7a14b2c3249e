-- eventbox.outbox is a view over the rotated tables (docs/design/outbox-rotation.md): the rows it
-- shows in each state a message can be in, where each is kept, and what its INSTEAD OF triggers
-- do with INSERT, UPDATE and DELETE. No relay serves this database: nothing moves by itself.
\set SHOW_CONTEXT never
SELECT eventbox.truncate_outbox();

-- Where each message is: its rotated table, its held copy, the ack row that settled it.
CREATE FUNCTION pg_temp.kept() RETURNS TABLE (message text, rows_table int, held text,
                                               acked_in int, ack_partition int, ack_offset bigint)
LANGUAGE sql AS $$
    SELECT right(r.message_id::text, 2), r.n, h.status, a.n, a.partitions[a.i], a.offsets[a.i]
      FROM eventbox._outbox_rows r
      LEFT JOIN eventbox.outbox_held h USING (id)
      LEFT JOIN LATERAL (SELECT k.n, k.partitions, k.offsets, array_position(k.ids, r.id) AS i
                           FROM eventbox._outbox_acks k WHERE r.id = ANY (k.ids)) a ON true
     ORDER BY r.id
$$;
CREATE FUNCTION pg_temp.shown() RETURNS TABLE (message text, status text, attempts int,
                                                has_next boolean, last_error text, headers jsonb)
LANGUAGE sql AS $$
    SELECT right(message_id::text, 2), status, attempts, next_attempt_at IS NOT NULL, last_error,
           headers
      FROM eventbox.outbox ORDER BY id
$$;

-- Inserted as each status: pending; sent (settled at once: an ack row; past a retention of 0,
-- not shown); failed (held); pending after failed attempts (held with them).
INSERT INTO eventbox.outbox (message_id, topic, payload)
VALUES ('00000000-0000-0000-0000-0000000000a1', 'v', '\x01');
INSERT INTO eventbox.outbox (message_id, topic, status, sent_at, kafka_partition, kafka_offset)
VALUES ('00000000-0000-0000-0000-0000000000a2', 'v', 'sent', now(), 2, 7);
INSERT INTO eventbox.outbox (message_id, topic, status, attempts, last_error)
VALUES ('00000000-0000-0000-0000-0000000000a3', 'v', 'failed', 4, 'rejected');
INSERT INTO eventbox.outbox (message_id, topic, attempts, next_attempt_at, last_error)
VALUES ('00000000-0000-0000-0000-0000000000a4', 'v', 1, '2030-01-01 00:00:00+00', 'timeout');
SHOW eventbox.outbox_retention;
SELECT * FROM pg_temp.shown();
SELECT * FROM pg_temp.kept();
SELECT status, messages, max_attempts, with_error FROM eventbox.outbox_stats ORDER BY status;

-- What the old table's constraints refused is refused with their SQLSTATEs, and an id is drawn,
-- never given.
INSERT INTO eventbox.outbox (message_id, topic, status) VALUES (gen_random_uuid(), 'v', 'done');
INSERT INTO eventbox.outbox (message_id, topic, attempts) VALUES (gen_random_uuid(), 'v', -1);
INSERT INTO eventbox.outbox (message_id, topic, headers) VALUES (gen_random_uuid(), 'v', '[]');
INSERT INTO eventbox.outbox (message_id, topic) VALUES (NULL, 'v');
INSERT INTO eventbox.outbox (id, message_id, topic) VALUES (1, gen_random_uuid(), 'v');
INSERT INTO eventbox.outbox (message_id, topic) VALUES ('00000000-0000-0000-0000-0000000000a1', 'v');
UPDATE eventbox.outbox SET message_id = gen_random_uuid()
 WHERE message_id = '00000000-0000-0000-0000-0000000000a1';

-- UPDATE: a pending row is held with its new values; set to sent, it is settled (an ack row,
-- out of outbox_held) and leaves the view.
UPDATE eventbox.outbox SET headers = '{"edited": "yes"}'
 WHERE message_id = '00000000-0000-0000-0000-0000000000a1';
UPDATE eventbox.outbox SET status = 'sent', kafka_partition = 0, kafka_offset = 9
 WHERE message_id = '00000000-0000-0000-0000-0000000000a4';
SELECT * FROM pg_temp.shown();
SELECT * FROM pg_temp.kept();

-- DELETE: pending and failed rows are cancelled (held, never sent, not shown).
DELETE FROM eventbox.outbox WHERE message_id IN ('00000000-0000-0000-0000-0000000000a1',
                                                 '00000000-0000-0000-0000-0000000000a3');
SELECT * FROM pg_temp.shown();
SELECT * FROM pg_temp.kept();

-- The settled position W and the gaps kept with it: below W a row is settled unless it is in a
-- gap; at or above W it is pending unless an ack row holds it.
SELECT eventbox.truncate_outbox();
INSERT INTO eventbox.outbox (message_id, topic)
SELECT format('00000000-0000-0000-0000-0000000000b%s', i)::uuid, 'v' FROM generate_series(1, 4) i;
SELECT min(id) AS b1 FROM eventbox._outbox_rows \gset
INSERT INTO eventbox.outbox_state AS s (n, settled_below, gaps, held_generation)
VALUES (-1, :b1 + 2, int8multirange(int8range(:b1, :b1, '[]')), 0)
ON CONFLICT (n) DO UPDATE SET settled_below = EXCLUDED.settled_below, gaps = EXCLUDED.gaps;
SELECT message, status FROM pg_temp.shown();
INSERT INTO eventbox.outbox_acks_0 VALUES (now(), :b1 + 3, ARRAY[:b1, :b1 + 3]::int8[],
                                           ARRAY[0, 0], ARRAY[1, 2]::int8[]);
SELECT message, status FROM pg_temp.shown();
SELECT count(*) AS pending FROM eventbox.outbox WHERE status = 'pending';

-- truncate_outbox() leaves W where it was: a writer that drew its id before it and writes after
-- it must still be read (test/integration/test_outbox_rotation.py).
SELECT settled_below AS w_before, gaps AS gaps_before FROM eventbox.outbox_state WHERE n = -1 \gset
SELECT eventbox.truncate_outbox();
SELECT n, state, settled_below = :w_before AS w_kept, gaps = :'gaps_before' AS gaps_kept
  FROM eventbox.outbox_state ORDER BY n;
SELECT count(*) AS left_over FROM pg_temp.kept();
