-- A subscription never dead-letters into a topic it reads (issue 27, item 2): create and alter
-- refuse a dead_letter_topic among the subscription's topics, whichever of the two changes.
\set SHOW_CONTEXT never
\set VERBOSITY default
SET client_min_messages = warning;

SELECT eventbox.create_subscription('regress-dll', ARRAY['orders', 'payments'],
                                    dead_letter_topic => 'orders');
SELECT count(*) AS created FROM eventbox.subscriptions WHERE name = 'regress-dll';

SELECT eventbox.create_subscription('regress-dll', ARRAY['orders', 'payments'],
                                    dead_letter_topic => 'orders.dead');
-- Altering the dead-letter topic onto a topic it reads ...
SELECT eventbox.alter_subscription('regress-dll', dead_letter_topic => 'payments');
-- ... or the topics onto its dead-letter topic.
SELECT eventbox.alter_subscription('regress-dll', topics => ARRAY['orders', 'orders.dead']);
SELECT topics, dead_letter_topic FROM eventbox.subscriptions WHERE name = 'regress-dll';
-- Topic names are case-sensitive in Kafka: another topic is fine.
SELECT eventbox.alter_subscription('regress-dll', dead_letter_topic => 'Orders');
-- A subscription may dead-letter into a topic another subscription reads (such loops are broken
-- when a record comes back, see the dead-letter tests of the handler workers).
SELECT eventbox.create_subscription('regress-dll-2', ARRAY['Orders'],
                                    dead_letter_topic => 'orders');
SELECT name, topics, dead_letter_topic FROM eventbox.subscriptions
 WHERE name LIKE 'regress-dll%' ORDER BY name;
SELECT eventbox.drop_subscription('regress-dll');
SELECT eventbox.drop_subscription('regress-dll-2');
