"""A batch the ingest worker cannot store is logged with a CONTEXT line naming the subscription,
the lane and the batch (worker::WorkContext, pushed around the store steps): the error itself is
caught and rolled back for that subscription alone, so the line logging it is where an operator
learns which batch of which lane failed."""
import re

from inbox_kafka import json_value, produce
from inbox_support import LogWatch, poll, unique_name


def test_a_failed_batch_is_logged_with_its_subscription_lane_and_batch(
        ib_db, ib_topic, ib_producer, ib_subscriptions):
    topic = ib_topic("context", 1)
    refused = ib_subscriptions(unique_name("context"), [topic])
    ib_db.wait_ingest_worker()
    log = LogWatch()
    # Storing the batches of `refused` fails (any ERROR will do): a trigger refuses its rows.
    ib_db.rows("""
        CREATE FUNCTION public.eb_context_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'test refuses rows of %%', NEW.subscription;
        END $$;
        CREATE TRIGGER eb_context_refuse BEFORE INSERT ON eventbox.inbox FOR EACH ROW
            WHEN (NEW.subscription = %s) EXECUTE FUNCTION public.eb_context_refuse();
    """, (refused,))
    try:
        produce(ib_producer, topic, [{"value": json_value({"i": i}), "partition": 0,
                                      "headers": [("message_id", b"context-%d" % i)]}
                                     for i in range(5)])

        def failure_with_context():
            lines = log.lines()
            for k, line in enumerate(lines):
                if 'subscription "%s" could not store a batch' % refused in line:
                    return lines[k:k + 6]
            return None

        # Failures are logged at most 5 a minute: one may wait for the next minute.
        lines = poll(failure_with_context, 90, "the failed batch of %s in the log" % refused)
        context = [ln for ln in lines if "CONTEXT:" in ln]
        assert context, "\n".join(lines)
        assert re.search(r'CONTEXT:  eventbox ingest: subscription "%s", lane "%s"\[0\], '
                         r'batch \d+$' % (re.escape(refused), re.escape(topic)),
                         context[0]), "\n".join(lines)
        assert "test refuses rows of %s" % refused in lines[0]
    finally:
        ib_db.rows("DROP TRIGGER IF EXISTS eb_context_refuse ON eventbox.inbox; "
                   "DROP FUNCTION IF EXISTS public.eb_context_refuse()")
