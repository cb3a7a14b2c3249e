"""The Grafana dashboard (monitoring/grafana/pg_eventbox.json) and the Prometheus alerting rules
(monitoring/prometheus/alerts.yml) against what the metrics endpoint really serves, and the
rules through promtool (Debian's prometheus package).

The live test starts a cluster of its own with eventbox.metrics_address on a loopback port (as
test_prometheus.py does: it is a postmaster setting), makes every family the queries use carry
samples (a subscription whose handler processes some messages and kills one, an outbox row to
Kafka, one to a local HTTP endpoint), scrapes GET /metrics and checks each query: every
eventbox_* name is a family the endpoint serves (a _bucket/_sum/_count suffix only on a
histogram), every label a selector matches on is carried by that family's samples, and every
label a query groups by or a legend / annotation shows is carried by one of its families."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import urllib.request
import uuid

import yaml

from eventbox_fixtures import query, wait_until
from test_prometheus import OwnCluster, free_ports

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "http"))
from http_support import Endpoint  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "monitoring" / "grafana" / "pg_eventbox.json"
RULES = REPO / "monitoring" / "prometheus" / "alerts.yml"
RULES_TEST = REPO / "monitoring" / "prometheus" / "alerts_test.yml"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

NAME = re.compile(r"\beventbox_[a-z0-9_]+\b")
SELECTOR = re.compile(r"\b(eventbox_[a-z0-9_]+)\s*\{([^}]*)\}")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
LEGEND = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")
ANNOTATION = re.compile(r"\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)")
SUFFIXES = ("_bucket", "_sum", "_count")


def dashboard_queries():
    """(where, expr, legend) of every panel target, and the template variables' queries."""
    d = json.loads(DASHBOARD.read_text())
    out = []
    for p in d["panels"]:
        for t in p.get("targets", []):
            out.append(("panel %r %s" % (p["title"], t["refId"]), t["expr"],
                        t.get("legendFormat", "")))
    for v in d.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            out.append(("variable %s" % v["name"], q, ""))
    return out


def rule_queries():
    rules = yaml.safe_load(RULES.read_text())
    out = []
    for g in rules["groups"]:
        for r in g["rules"]:
            shown = " ".join(r.get("annotations", {}).values())
            out.append(("alert %s" % r["alert"], r["expr"], shown))
    return out


def parse_scrape(text):
    """{family: type}, {family: set of label names on its samples} (families with samples only)."""
    types, labels = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? ", line)
        name = m.group(1)
        fam = family(name, types)
        if fam is None:
            continue
        labels.setdefault(fam, set()).update(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', m.group(3) or ""))
    return types, labels


def family(name, types):
    if name in types:
        return name
    for s in SUFFIXES:
        if name.endswith(s) and types.get(name[: -len(s)]) == "histogram":
            return name[: -len(s)]
    return None


def check_query(where, expr, shown, types, labels):
    problems = []
    fams = set()
    for name in NAME.findall(expr):
        fam = family(name, types)
        if fam is None:
            problems.append("%s: %s is no family the endpoint serves" % (where, name))
            continue
        if fam not in labels:
            problems.append("%s: %s has no sample in the scrape to check labels on" % (where, fam))
        fams.add(fam)
    for name, matchers in SELECTOR.findall(expr):
        fam = family(name, types)
        if fam is None or fam not in labels:
            continue
        for label, _ in MATCHER.findall(matchers):
            if label not in labels[fam]:
                problems.append("%s: %s carries no label %r" % (where, fam, label))
    carried = set().union(*(labels.get(f, set()) for f in fams)) if fams else set()
    used = set()
    for group in GROUPING.findall(expr):
        used.update(x.strip() for x in group.split(",") if x.strip())
    used.update(LEGEND.findall(shown))
    used.update(ANNOTATION.findall(shown))
    for label in sorted(used):
        if label not in carried and not (label in ("instance", "job") and not fams):
            problems.append("%s: no family of %s carries label %r" % (where, sorted(fams), label))
    return fams, problems


def test_promtool_checks_and_unit_tests_the_alert_rules():
    r = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=60)
    assert r.returncode == 0, r.stdout.decode()
    assert "SUCCESS: 9 rules found" in r.stdout.decode(), r.stdout.decode()
    r = subprocess.run([PROMTOOL, "test", "rules", str(RULES_TEST)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=120)
    assert r.returncode == 0, r.stdout.decode()
    assert "SUCCESS" in r.stdout.decode()
    # Every alert has its unit test.
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    tested = {t["alertname"] for case in yaml.safe_load(RULES_TEST.read_text())["tests"]
              for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert alerts == tested, "alerts without a firing unit test: %s" % sorted(alerts - tested)


HANDLER = """
CREATE ROLE mon_handler NOLOGIN;
CREATE FUNCTION public.handle(m eventbox.inbox) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  IF (m.payload->>'poison')::boolean THEN RAISE EXCEPTION 'poison'; END IF;
END $$;
"""


def test_dashboard_and_rules_use_only_served_families_and_labels(broker, new_topic):
    from kafka import KafkaProducer

    pg_port, metrics_port = free_ports(2)
    topic, out_topic = new_topic(2), new_topic(1)
    http = Endpoint()
    cluster = OwnCluster(pg_port, metrics_port)
    try:
        c = cluster.connect()
        query(c, "CREATE EXTENSION pg_eventbox")
        query(c, HANDLER)
        query(c, "SELECT eventbox.create_subscription('mon', ARRAY[%s], max_attempts => 1)",
              (topic,))
        query(c, "SELECT eventbox.register_handler('mon', 'public.handle(eventbox.inbox)'"
                 "::regprocedure, run_as => 'mon_handler')")
        hook = "h_%s" % uuid.uuid4().hex[:10]
        query(c, "SELECT eventbox.create_http_destination(%s, %s)", (hook, http.url))
        producer = KafkaProducer(bootstrap_servers=os.environ["EVENTBOX_BOOTSTRAP"], acks="all")
        for i in range(20):
            producer.send(topic, json.dumps({"i": i, "poison": i == 0}).encode(),
                          headers=[("message_id", str(uuid.uuid4()).encode())]).get(timeout=60)
        producer.close()
        query(c, "SELECT eventbox.send(%s, '{\"to\": \"kafka\"}'::jsonb)", (out_topic,))
        query(c, "SELECT eventbox.send(%s, '{\"to\": \"http\"}'::jsonb)", (hook,))

        def scrape():
            url = "http://127.0.0.1:%d/metrics" % metrics_port
            with urllib.request.urlopen(url, timeout=10) as r:
                return r.read().decode()

        def ready():
            try:
                text = scrape()
            except OSError:
                return None
            types, labels = parse_scrape(text)
            done = (re.search(r'^eventbox_handler_dead_total\{subscription="mon"\} 1$', text, re.M)
                    and re.search(r'^eventbox_handler_processed_total\{subscription="mon"\} 19$',
                                  text, re.M)
                    and re.search(r'^eventbox_relay_published_total 2$', text, re.M)
                    and "eventbox_ingest_lag" in labels
                    and "eventbox_http_responses_total" in labels)
            return (types, labels) if done else None
        types, labels = wait_until(ready, 120, interval=0.5,
                                   what="the endpoint to show the traffic (19 processed, 1 dead, "
                                        "2 published, lag and HTTP samples)")

        problems, used = [], set()
        queries = dashboard_queries() + rule_queries()
        for where, expr, shown in queries:
            fams, p = check_query(where, expr, shown, types, labels)
            problems += p
            used |= fams
        assert not problems, "\n".join(problems)
        # The panels the dashboard promises (docs/guide/monitoring.md).
        dash = {f for w, e, s in dashboard_queries() for f in NAME.findall(e)}
        for want in ("eventbox_ingest_lag", "eventbox_inbox_pending",
                     "eventbox_handler_processed_total", "eventbox_handler_duration_seconds_bucket",
                     "eventbox_handler_dead_total", "eventbox_blocked_keys",
                     "eventbox_held_messages", "eventbox_outbox_pending",
                     "eventbox_relay_publish_latency_seconds_bucket",
                     "eventbox_http_responses_total", "eventbox_worker_restarts_total"):
            assert want in dash, "the dashboard shows no %s" % want
        assert len(queries) >= 20 and len(used) >= 15, (len(queries), sorted(used))
        c.close()
    finally:
        cluster.stop()
        http.close()
