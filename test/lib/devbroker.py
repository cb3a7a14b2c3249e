"""Stdlib-only client for eventbox-devbroker's control interface.

The dev broker (tools/devbroker) runs librdkafka's mock Kafka cluster on
127.0.0.1 and accepts line commands on a control port; each command gets one
reply line, ``OK[ text]`` or ``ERR reason``.

    proc, bootstrap, host, port = start("tools/devbroker/eventbox-devbroker")
    broker = DevBroker(host, port)
    broker.create_topic("events", 3)
    broker.broker_down("all"); broker.broker_up("all")
    broker.quit(); proc.wait()
"""

import os
import re
import select
import socket
import subprocess
import time

__all__ = ["DevBroker", "DevBrokerError", "start", "stop"]

READY_RE = re.compile(r"^bootstrap=(\S+) control=([0-9.]+):(\d+)$")


class DevBrokerError(Exception):
    """The broker answered ERR (or the control connection failed)."""


class DevBroker:
    """A connection to the control interface; connects lazily, reconnects
    after errors. Usable as a context manager."""

    def __init__(self, host="127.0.0.1", port=0, timeout=10.0):
        self.host = host
        self.port = int(port)
        self.timeout = timeout
        self._sock = None
        self._file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Closes the control connection (the broker keeps running)."""
        for obj in (self._file, self._sock):
            if obj is not None:
                try:
                    obj.close()
                except OSError:
                    pass
        self._sock = self._file = None

    def command(self, line):
        """Sends one raw command line; returns the text after ``OK``
        ('' if none). Raises DevBrokerError on ``ERR`` or I/O failure."""
        if "\n" in line or "\r" in line:
            raise ValueError("command must be a single line")
        try:
            if self._sock is None:
                self._sock = socket.create_connection(
                    (self.host, self.port), timeout=self.timeout)
                self._file = self._sock.makefile("rwb")
            self._file.write(line.encode() + b"\n")
            self._file.flush()
            reply = self._file.readline().decode().rstrip("\r\n")
        except OSError as e:
            self.close()
            raise DevBrokerError("control connection failed: %s" % e) from e
        if not reply:
            self.close()
            raise DevBrokerError("control connection closed")
        if reply == "OK":
            return ""
        if reply.startswith("OK "):
            return reply[3:]
        raise DevBrokerError(reply[4:] if reply.startswith("ERR ") else reply)

    def ping(self):
        """Returns 'pong'."""
        return self.command("ping")

    def bootstrap(self):
        """Returns the bootstrap servers, e.g. '127.0.0.1:39227'."""
        return self.command("bootstrap")

    def create_topic(self, name, partitions=None, replication=None):
        """Creates a topic (partitions default: the broker's --partitions)."""
        parts = ["create_topic", name]
        if partitions is not None:
            parts.append(str(int(partitions)))
        if replication is not None:
            if partitions is None:
                raise ValueError("replication needs partitions")
            parts.append(str(int(replication)))
        self.command(" ".join(parts))

    def broker_down(self, id_or_all="all"):
        """Closes broker connections and refuses new ones (id 1..N or 'all')."""
        self.command("broker_down %s" % id_or_all)

    def broker_up(self, id_or_all="all"):
        """Lets the broker(s) accept connections again."""
        self.command("broker_up %s" % id_or_all)

    def inject_errors(self, api_key, codes):
        """Makes the next len(codes) requests of api_key (0 Produce, 1 Fetch,
        3 Metadata, ...) fail with these Kafka error codes, in order."""
        codes = [int(c) for c in codes]
        if not codes:
            raise ValueError("need at least one error code")
        self.command("inject_errors %d %s" %
                     (int(api_key), ",".join(str(c) for c in codes)))

    def clear_errors(self, api_key):
        """Drops injected errors not yet consumed for api_key."""
        self.command("clear_errors %d" % int(api_key))

    def broker_rtt(self, id_or_all, ms):
        """Delays broker responses by ms milliseconds."""
        self.command("broker_rtt %s %d" % (id_or_all, int(ms)))

    def quit(self):
        """Asks the broker process to exit (0); closes this connection."""
        try:
            self.command("quit")
        finally:
            self.close()


def start(binary, brokers=1, partitions=4, control_port=0, timeout=15.0,
          extra_args=(), **popen_kwargs):
    """Launches the broker and waits for its ready line.

    Returns (Popen, bootstrap, control_host, control_port). stdout is a pipe
    (only the ready line is ever written to it); stderr is inherited unless
    given in popen_kwargs."""
    args = [os.fspath(binary), "--brokers", str(int(brokers)),
            "--partitions", str(int(partitions)),
            "--control-port", str(int(control_port))] + list(extra_args)
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, **popen_kwargs)
    deadline = time.monotonic() + timeout
    buf = b""
    try:
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DevBrokerError("no ready line within %.0fs" % timeout)
            ready, _, _ = select.select([proc.stdout], [], [], left)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    raise DevBrokerError(
                        "broker exited before ready (rc=%s)" % proc.wait(5))
                buf += chunk
        line = buf.split(b"\n", 1)[0].decode()
        m = READY_RE.match(line)
        if not m:
            raise DevBrokerError("bad ready line: %r" % line)
    except BaseException:
        stop(proc)
        raise
    return proc, m.group(1), m.group(2), int(m.group(3))


def stop(proc, timeout=10.0):
    """Terminates a broker started by start() and returns its exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
    return proc.returncode
