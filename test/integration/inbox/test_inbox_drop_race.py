"""drop_subscription() while the ingest worker stores a batch of the same subscription leaves
nothing behind. Before, the batch's INSERT checked that the subscription exists with its own
snapshot: a batch stored while a drop was in progress (not yet committed) committed rows after
the drop had deleted the subscription's rows. Those orphans stayed, and a subscription created
again under the same name took its own messages for duplicates of them and never ran them.

Now each batch takes a KEY SHARE lock on its subscription row, which drop_subscription (FOR
UPDATE) waits for and which waits for an uncommitted drop."""
import time

import pytest

from inbox_kafka import json_value, produce
from inbox_support import connect, unique_name


def records(tag, n):
    return [{"value": json_value({"tag": tag, "i": i}),
             "headers": [("message_id", ("%s-%d" % (tag, i)).encode())]} for i in range(n)]


def count(db, table, sub):
    return db.value("SELECT count(*) FROM eventbox.%s WHERE subscription = %%s" % table, (sub,))


# A backfill subscription's batches go through their own statement (each row with its mode).
@pytest.mark.parametrize("backfill", [False, True], ids=["live", "backfill"])
def test_batch_stored_during_an_uncommitted_drop_leaves_no_rows(ib_db, ib_topic, ib_producer,
                                                               ib_subscriptions, backfill):
    topic = ib_topic("droprace", 2)
    sub = unique_name("droprace")
    produce(ib_producer, topic, records("before", 20))
    ib_subscriptions(sub, [topic], backfill=backfill)
    ib_db.wait_rows(sub, 20, timeout=60)

    dropper = connect()
    dropper.autocommit = False
    with dropper.cursor() as cur:
        cur.execute("SELECT eventbox.drop_subscription(%s)", (sub,))
    try:
        # The worker still consumes the subscription (it learns of the drop at its commit):
        # these records reach it while the drop is in progress.
        produce(ib_producer, topic, records("during", 50))
        time.sleep(3.0)
        dropper.commit()
    finally:
        dropper.close()
    # Give the worker time to finish whatever batch it had and to drop the subscription.
    time.sleep(3.0)
    left = {t: count(ib_db, t, sub) for t in ("inbox", "offsets")}
    assert left == {"inbox": 0, "offsets": 0}, "rows left behind by a dropped subscription: %r" % left
    assert ib_db.value("SELECT count(*) FROM eventbox.subscriptions WHERE name = %s", (sub,)) == 0

    # The same name again reads the topic from its start and stores every record once.
    ib_subscriptions(sub, [topic], backfill=backfill)
    ib_db.wait_rows(sub, 70, timeout=90)
    assert count(ib_db, "inbox", sub) == 70
