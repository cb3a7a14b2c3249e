"""A scriptable local HTTP endpoint for the HTTP destination tests (standard library only).

Every request is recorded (path, headers, body, Idempotency-Key); what it answers is decided by
`behaviour(request_number_for_key, record) -> action`, an action being one of:
  ("status", code[, headers, body])   answer with that status
  ("hang", seconds)                   read the request, answer nothing for that long, then close
  ("close",)                          start a response and close the connection mid-body
"""
import http.server
import json
import os
import socket
import ssl
import socketserver
import threading
import time


class Recorded:
    def __init__(self, method, path, headers, body):
        self.method = method
        self.path = path
        self.headers = headers  # dict, lower-case names
        self.body = body
        self.at = time.monotonic()

    @property
    def key(self):
        v = self.headers.get("idempotency-key", "")
        return v[1:-1] if v.startswith('"') and v.endswith('"') else v

    def json(self):
        return json.loads(self.body)


class Endpoint:
    """A threaded HTTP/1.1 server on 127.0.0.1 (keep-alive) answering per `behaviour`."""

    def __init__(self, behaviour=None, port=0, tls=False):
        self.behaviour = behaviour or (lambda n, rec: ("status", 204))
        self.lock = threading.Lock()
        self.requests = []       # every request, in arrival order
        self.attempts = {}       # Idempotency-Key -> count
        self.connections = 0
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def setup(self):
                super().setup()
                with endpoint.lock:
                    endpoint.connections += 1

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                rec = Recorded(self.command, self.path,
                               {k.lower(): v for k, v in self.headers.items()}, body)
                with endpoint.lock:
                    endpoint.requests.append(rec)
                    n = endpoint.attempts.get(rec.key, 0) + 1
                    endpoint.attempts[rec.key] = n
                action = endpoint.behaviour(n, rec)
                kind = action[0]
                if kind == "hang":
                    time.sleep(action[1])
                    self.close_connection = True
                    return
                if kind == "close":
                    self.send_response(200)
                    self.send_header("Content-Length", "100")
                    self.end_headers()
                    self.wfile.write(b"partial")
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                code = action[1]
                headers = action[2] if len(action) > 2 else {}
                payload = action[3] if len(action) > 3 else b""
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if payload:
                    self.wfile.write(payload)

            do_POST = do_PUT = do_PATCH = _handle

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

            def handle_error(self, request, client_address):
                pass  # a client (the relay) that went away mid-request: nothing to report

        self.server = Server(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.url = "http://127.0.0.1:%d/hook" % self.port
        if tls:
            # A self-signed certificate (for 127.0.0.1) no client trusts by default.
            here = os.path.dirname(os.path.abspath(__file__))
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(os.path.join(here, "selfsigned.crt"),
                                os.path.join(here, "selfsigned.key"))
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
            self.url = "https://127.0.0.1:%d/hook" % self.port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def snapshot(self):
        with self.lock:
            return list(self.requests)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
