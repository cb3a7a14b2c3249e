"""The test Schema Registry (test/lib/schema_registry.py) stopped while a client keeps a
keep-alive connection open: the client resetting that connection afterwards (as a worker's curl
does when it drops a connection the registry closed) prints no traceback, while a reset of a
connection the registry did not close is still printed (the standard library's handle_error)."""
import pathlib
import socket
import struct
import sys
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "test" / "lib"))

from schema_registry import SchemaRegistry  # noqa: E402


def kept_alive(registry):
    """A client connection that asked once and stays open (HTTP/1.1 keep-alive)."""
    c = socket.create_connection((registry.host, registry.port), timeout=10)
    c.sendall(b"GET /subjects HTTP/1.1\r\nHost: registry\r\n\r\n")
    answer = b""
    # The whole answer (head and body): the registry is then waiting for the next request.
    while b"\r\n\r\n" not in answer or len(answer) < answer.index(b"\r\n\r\n") + 4 + int(
            answer.split(b"Content-Length: ")[1].split(b"\r\n")[0]):
        chunk = c.recv(4096)
        assert chunk, "the registry closed the connection"
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer
    return c


def reset(c):
    """Closes `c` with a TCP reset (SO_LINGER 0), not a FIN."""
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()


def wait_for(fn, timeout, what):
    deadline = time.monotonic() + timeout
    while not fn():
        assert time.monotonic() < deadline, "no %s within %d s" % (what, timeout)
        time.sleep(0.05)


def handlers_done():
    """No connection of the registry is served any more (its handler threads ended)."""
    return not any("process_request_thread" in t.name and t.is_alive()
                   for t in threading.enumerate())


def test_reset_after_stop_is_quiet_and_other_resets_are_printed(capsys):
    registry = SchemaRegistry().start()
    try:
        stopped = kept_alive(registry)
        running = kept_alive(registry)
        # A reset while the registry runs: printed, as before.
        reset(running)
        printed = []

        def seen():
            printed.append(capsys.readouterr().err)
            return "ConnectionResetError" in "".join(printed)
        wait_for(seen, 10, "traceback of the reset of a running registry's connection")
        # Stopped, then the client resets the connection the registry closed: quiet (whether
        # the reset or the registry's own close reaches its handler first).
        registry.stop()
        reset(stopped)
        wait_for(handlers_done, 10, "end of the connections' handlers")
        err = capsys.readouterr().err
        assert "Traceback" not in err and "ConnectionResetError" not in err, err
    finally:
        registry.stop()


def test_only_connection_errors_of_connections_stop_closed_are_quiet(capsys):
    """handle_error as the server calls it (in the except block of a connection's handler), for
    each case: the order of a reset and of stop()'s close is then not left to chance."""
    registry = SchemaRegistry().start()
    try:
        c = kept_alive(registry)
        other = kept_alive(registry)
        wait_for(lambda: len(registry._connections) == 2, 10, "the two connections")
        server = registry.server
        closed, kept = list(registry._connections)

        def error_of(connection, error):
            try:
                raise error
            except Exception:
                server.handle_error(connection, ("127.0.0.1", 1))
            return capsys.readouterr().err

        # Not closed by stop(): printed.
        assert "ConnectionResetError" in error_of(closed, ConnectionResetError(104, "reset"))
        registry._connections.discard(kept)  # stop() closes only `closed`
        registry.stop()
        for error in (ConnectionResetError(104, "reset"), BrokenPipeError(32, "pipe"),
                      ConnectionAbortedError(103, "aborted")):
            assert error_of(closed, error) == ""
        assert registry.quiet_resets == 3
        # Other errors of a closed connection, and any of one stop() did not close: printed.
        assert "ValueError" in error_of(closed, ValueError("bug"))
        assert "ConnectionResetError" in error_of(kept, ConnectionResetError(104, "reset"))
        assert registry.quiet_resets == 3
        c.close()
        other.close()
    finally:
        registry.stop()
