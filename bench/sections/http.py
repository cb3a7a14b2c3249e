"""Section http: HTTP delivery rate (bench/README.md, "Targets").

N ~1 KiB JSON messages over 64 keys to a local nginx (`return 204`, one worker, keep-alive):
  - pg_eventbox: the rows are sent with eventbox.send() in one transaction, to a topic with an
    HTTP destination (max_in_flight 32); clock from its commit to the outbox being empty (every
    row answered 2xx);
  - baseline: `curl --parallel --parallel-max 32` posting the same bodies (with the same
    Content-Type and Idempotency-Key headers) from a config file, whole command timed;
  - bulk: the same bodies through a destination with batch_size 100 (json_array, batch_wait
    100 ms, max_in_flight 32), over BULK_KEYS keys (a key is at most once per request, so 64
    keys would cap a request at 64 records); same clock as the relay's. Compared with the
    relay one per request and with curl of the same run;
  - information: `wrk` with 32 connections posting one such body for a few seconds (an upper
    bound of what nginx answers on this machine).
nginx's stub_status counts the requests of each side.
"""
import json
import os
import random
import shutil
import subprocess
import tempfile
import time
import uuid

from lib.cluster import q1
from lib.common import BenchError, log
from lib.eventbox import relay_pid, vacuum_outbox
from lib.proc import TICKS, proc_cpu
from lib.table import ROW, best

KEYS = 64
BULK_KEYS = 4096
BULK_SIZE = 100
PARALLEL = 32
BODY_BYTES = 1024
NGINX_PORT = 54336


def nginx_conf(dirname, port):
    return """
worker_processes 1;
daemon off;
pid %(d)s/nginx.pid;
error_log %(d)s/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path %(d)s/body;
    proxy_temp_path %(d)s/proxy;
    fastcgi_temp_path %(d)s/fastcgi;
    uwsgi_temp_path %(d)s/uwsgi;
    scgi_temp_path %(d)s/scgi;
    keepalive_requests 10000000;
    keepalive_timeout 120s;
    client_body_buffer_size 16k;
    server {
        listen 127.0.0.1:%(p)d;
        location = /status { stub_status; }
        location / { return 204; }
    }
}
""" % {"d": dirname, "p": port}


class Nginx:
    def __init__(self, port):
        self.dir = tempfile.mkdtemp(prefix="eventbox-bench-nginx.")
        os.chmod(self.dir, 0o755)
        self.port = port
        conf = os.path.join(self.dir, "nginx.conf")
        with open(conf, "w") as f:
            f.write(nginx_conf(self.dir, port))
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        self.proc = subprocess.Popen([nginx, "-p", self.dir, "-c", conf, "-e",
                                      os.path.join(self.dir, "error.log")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.requests()
                return
            except Exception:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise BenchError("nginx did not start (see %s/error.log)" % self.dir)
                time.sleep(0.05)

    def requests(self):
        out = subprocess.run(["curl", "-s", "http://127.0.0.1:%d/status" % self.port],
                             capture_output=True, text=True, timeout=5, check=True).stdout
        # "Active connections: 1 \nserver accepts handled requests\n 1 1 1 \n..."
        return int(out.splitlines()[2].split()[2]) - 1  # minus this status request

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def make_bodies(n, seed):
    rnd = random.Random(seed)
    bodies = []
    for i in range(n):
        doc = {"invoice": i, "customer": "c%d" % (i % KEYS), "lines": []}
        while len(json.dumps(doc, separators=(",", ":"))) < BODY_BYTES - 40:
            doc["lines"].append({"sku": "%08d" % rnd.randrange(10**8),
                                 "qty": rnd.randrange(1, 9), "price": rnd.randrange(100, 99999)})
        bodies.append(json.dumps(doc, separators=(",", ":")))
    return bodies


def curl_config(path, url, bodies, ids):
    def q(s):
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
    with open(path, "w") as f:
        for i, (body, mid) in enumerate(zip(bodies, ids)):
            if i:
                f.write("next\n")  # options below apply to the next URL only
            f.write("url = %s\n" % q(url))
            f.write("data-binary = %s\n" % q(body))
            f.write('header = "Content-Type: application/json"\n')
            f.write("header = %s\n" % q('Idempotency-Key: "%s"' % mid))
            f.write('output = "/dev/null"\n')


def run_curl(nginx, cfg, n):
    before = nginx.requests()
    t0 = time.monotonic()
    p = subprocess.run(["curl", "-s", "--parallel", "--parallel-max", str(PARALLEL), "-K", cfg],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=3600)
    if p.returncode != 0:
        raise BenchError("curl failed (%d): %s" % (p.returncode, p.stderr[-2000:]))
    elapsed = time.monotonic() - t0
    done = nginx.requests() - before
    if done < n:
        raise BenchError("curl: nginx counted %d requests, expected %d" % (done, n))
    return {"n": n, "elapsed": elapsed, "rate": n / elapsed, "requests": done}


def run_relay(env, cur, nginx, topic, bodies, ids, keys=KEYS, batch_size=1):
    n = len(bodies)
    if q1(cur, "SELECT count(*) FROM eventbox.outbox") != 0:
        raise BenchError("eventbox.outbox is not empty before the run")
    vacuum_outbox(cur)
    cur.execute("SELECT eventbox.create_http_destination(%s, %s, max_in_flight => %s, "
                "batch_size => %s, batch_wait => '100ms')",
                (topic, "http://127.0.0.1:%d/in" % nginx.port, PARALLEL, batch_size))
    # The backlog is sent in one transaction: the relay sees none of it until it commits (it
    # delivers to HTTP destinations with or without Kafka), and the clock starts at the commit.
    sender = env.connect(autocommit=False)
    scur = sender.cursor()
    t0 = time.monotonic()
    step = 10000
    for i in range(0, n, step):
        scur.execute("SELECT count(eventbox.send(%s, u.b::jsonb, key => u.k, message_id => u.m)) "
                     "FROM unnest(%s::text[], %s::text[], %s::uuid[]) AS u(b, k, m)",
                     (topic, bodies[i:i + step], ["k%d" % (j % keys) for j in range(i, i + step)],
                      ids[i:i + step]))
    insert_s = time.monotonic() - t0
    pid = relay_pid(cur)
    cpu0 = proc_cpu(pid)
    before = nginx.requests()
    t0 = time.monotonic()
    sender.commit()
    sender.close()
    deadline = t0 + 3600
    while q1(cur, "SELECT count(*) FROM eventbox.outbox WHERE topic = %s", (topic,)) > 0:
        if time.monotonic() > deadline:
            raise BenchError("relay: outbox not drained to HTTP within an hour")
        time.sleep(0.02)
    elapsed = time.monotonic() - t0
    cpu = (proc_cpu(pid) - cpu0) / TICKS
    done = nginx.requests() - before
    cur.execute("SELECT eventbox.drop_http_destination(%s)", (topic,))
    expected = -(-n // batch_size)
    if done < expected:
        raise BenchError("relay: nginx counted %d requests, expected at least %d"
                         % (done, expected))
    return {"n": n, "elapsed": elapsed, "rate": n / elapsed, "requests": done,
            "relay_cpu_us": cpu / n * 1e6, "insert_rate": n / insert_s}


def run_wrk(nginx, body, seconds=5):
    script = os.path.join(nginx.dir, "post.lua")
    with open(script, "w") as f:
        f.write('wrk.method = "POST"\nwrk.body = %s\n'
                'wrk.headers["Content-Type"] = "application/json"\n'
                'wrk.headers["Idempotency-Key"] = \'"%s"\'\n' % (json.dumps(body), uuid.uuid4()))
    out = subprocess.run(["wrk", "-t", "1", "-c", str(PARALLEL), "-d", "%ds" % seconds, "-s",
                          script, "http://127.0.0.1:%d/in" % nginx.port],
                         capture_output=True, text=True, check=True, timeout=seconds + 30).stdout
    for line in out.splitlines():
        if line.startswith("Requests/sec:"):
            return float(line.split()[1])
    raise BenchError("wrk: no Requests/sec in its output:\n" + out)


def run(ctx):
    env, cur, args, res, tmpdir = ctx.env, ctx.cur, ctx.args, ctx.res, ctx.tmpdir
    n = args.http_messages
    nginx = Nginx(NGINX_PORT)
    try:
        log("http: generating %d bodies of ~%d B over %d keys" % (n, BODY_BYTES, KEYS))
        bodies = make_bodies(n, seed=16)
        out = {"curl": [], "relay": [], "avg_body": sum(map(len, bodies)) / n}
        for rep in range(args.http_repeat):
            ids = [str(uuid.uuid4()) for _ in range(n)]
            cfg = os.path.join(tmpdir, "curl_http.cfg")
            curl_config(cfg, "http://127.0.0.1:%d/in" % nginx.port, bodies, ids)
            log("http: curl --parallel --parallel-max %d, run %d" % (PARALLEL, rep + 1))
            x = run_curl(nginx, cfg, n)
            os.unlink(cfg)
            out["curl"].append(x)
            log("  %.0f req/s in %.2fs" % (x["rate"], x["elapsed"]))
            log("http: relay, run %d" % (rep + 1))
            x = run_relay(env, cur, nginx, "bench_http_%d" % (rep + 1), bodies,
                          [str(uuid.uuid4()) for _ in range(n)])
            out["relay"].append(x)
            log("  %.0f msg/s in %.2fs (relay %.1f us/msg)"
                % (x["rate"], x["elapsed"], x["relay_cpu_us"]))
            log("http: relay bulk (batch_size %d, %d keys), run %d" % (BULK_SIZE, BULK_KEYS,
                                                                       rep + 1))
            x = run_relay(env, cur, nginx, "bench_http_bulk_%d" % (rep + 1), bodies,
                          [str(uuid.uuid4()) for _ in range(n)], keys=BULK_KEYS,
                          batch_size=BULK_SIZE)
            out.setdefault("bulk", []).append(x)
            log("  %.0f msg/s in %.2fs, %d requests (relay %.1f us/msg)"
                % (x["rate"], x["elapsed"], x["requests"], x["relay_cpu_us"]))
        log("http: wrk -c %d for 5 s" % PARALLEL)
        out["wrk"] = run_wrk(nginx, bodies[0])
        log("  %.0f req/s" % out["wrk"])
        res["http"] = out
    finally:
        nginx.stop()


def table_rows(res):
    if "http" not in res:
        return []
    h = res["http"]
    r = best(h["relay"])
    c = best(h["curl"])
    ratio = r["rate"] / c["rate"]
    return [
        ROW % ("http 1 KiB, 64 keys (msg/s)", "%.0f" % r["rate"], "curl -Z %.0f" % c["rate"],
               "%.2f" % ratio, ">= 0.5 " + ("ok" if ratio >= 0.5 else "BELOW")),
        ROW % ("  wrk -c %d (req/s)" % PARALLEL, "-", "%.0f" % h["wrk"],
               "%.2f" % (r["rate"] / h["wrk"]), "info (server bound)"),
    ] + bulk_rows(h, r, c)


def bulk_rows(h, r, c):
    if "bulk" not in h:
        return []
    b = best(h["bulk"])
    vs_relay = b["rate"] / r["rate"]
    vs_curl = b["rate"] / c["rate"]
    return [
        ROW % ("http bulk %d/request (msg/s)" % BULK_SIZE, "%.0f" % b["rate"],
               "relay 1/req %.0f" % r["rate"], "%.2f" % vs_relay,
               ">= 5 " + ("ok" if vs_relay >= 5 else "BELOW")),
        ROW % ("http bulk %d/request (msg/s)" % BULK_SIZE, "%.0f" % b["rate"],
               "curl -Z %.0f" % c["rate"], "%.2f" % vs_curl,
               ">= 3 " + ("ok" if vs_curl >= 3 else "BELOW")),
    ]


def notes(res, args):
    if "http" not in res:
        return []
    h = res["http"]
    return [
        "http: %d messages of ~%.0f B JSON over %d keys to nginx (1 worker, return 204, "
        "keep-alive) on 127.0.0.1; best of %d runs per side; relay: rows sent with "
        "eventbox.send() in one transaction, destination max_in_flight %d, clock from its "
        "commit to the topic's rows gone; curl: curl --parallel "
        "--parallel-max %d -K (one entry per body, same headers), whole command timed; counts "
        "checked with nginx stub_status"
        % (args.http_messages, h["avg_body"], KEYS, args.http_repeat, PARALLEL, PARALLEL),
        "http bulk: the same bodies over %d keys to a destination with batch_size %d "
        "(json_array, batch_wait 100 ms, max_in_flight %d), same clock; runs %s msg/s in %s "
        "requests (relay CPU %s us/msg)"
        % (BULK_KEYS, BULK_SIZE, PARALLEL,
           " ".join("%.0f" % x["rate"] for x in h.get("bulk", [])),
           " ".join("%d" % x["requests"] for x in h.get("bulk", [])),
           " ".join("%.1f" % x["relay_cpu_us"] for x in h.get("bulk", []))),
        "http runs: relay %s msg/s (relay CPU %s us/msg, send() %s rows/s); curl %s req/s"
        % (" ".join("%.0f" % x["rate"] for x in h["relay"]),
           " ".join("%.1f" % x["relay_cpu_us"] for x in h["relay"]),
           " ".join("%.0f" % x["insert_rate"] for x in h["relay"]),
           " ".join("%.0f" % x["rate"] for x in h["curl"])),
    ]
