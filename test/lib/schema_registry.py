"""A Schema Registry speaking the Confluent REST API, on loopback, for the tests of the registry
formats (docs/guide/formats.md).

Implemented: GET /schemas/ids/{id}, GET /subjects/{s}/versions/{v|latest}, GET /subjects,
POST /subjects/{s}/versions (409 when a new Avro record version adds a field without a default,
the BACKWARD rule), with the registry's error bodies ({"error_code": 40401|40402|40403, ...}).
Schema references: `references` ([{name, subject, version}]) registered with a schema are in its
answers by id and by subject version; as the real registry does, a schema's identity includes
its references (the same text with other references is another id). Tests may register
references that do not resolve (a missing subject, a cycle) to see them refused.
Test controls: a delay per request (a slow registry), stop()/start() on the same port (down and
back), `failing` (a path prefix answered 503, e.g. one subject's versions), basic auth, add_id()
to place a schema under a chosen id, and request counts. A client's connection that stop() closed
and that the client then resets (or writes to) ends quietly (counted in `quiet_resets`); any
other error of a connection is printed as the standard library does.

It uses only the standard library; it imports none of its users.
"""

import base64
import json
import re
import socket
import sys
import threading
import weakref
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class SchemaRegistry:
    def __init__(self, host="127.0.0.1", port=0, auth=None):
        self.host = host
        self.port = port
        self.auth = auth  # "user:password" required when set
        self.delay = 0.0
        self.failing = None  # a path prefix answered 503 while set
        self.lock = threading.Lock()
        self.schemas = {}  # id -> {"schema", "schemaType", "references"}
        self.subjects = {}  # subject -> [id, ...] (versions in order)
        self.next_id = 1
        self.requests = []  # paths asked, in order
        self.server = None
        self.thread = None
        self._stop_delay = threading.Event()
        self._connections = set()  # the clients' open (keep-alive) connections
        self._closed_by_stop = weakref.WeakSet()  # ... and those stop() closed
        self.quiet_resets = 0  # errors of connections stop() closed, not printed

    # ---- lifetime

    def start(self):
        registry = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def setup(self):
                super().setup()
                with registry.lock:
                    registry._connections.add(self.connection)

            def finish(self):
                with registry.lock:
                    registry._connections.discard(self.connection)
                super().finish()

            def do_GET(self):
                registry._serve(self, "GET")

            def do_POST(self):
                registry._serve(self, "POST")

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                # A client resetting (or writing to) a connection stop() closed: the registry
                # went down under it, as tests mean it to. Anything else is printed.
                if (isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError,
                                                   ConnectionAbortedError))
                        and request in registry._closed_by_stop):
                    with registry.lock:
                        registry.quiet_resets += 1
                    return
                super().handle_error(request, client_address)

        self.server = Server((self.host, self.port), Handler)
        self.port = self.server.server_address[1]
        self._stop_delay.clear()
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self):
        """Down: the port refuses connections until start() (same port), and the connections
        clients keep open (HTTP/1.1 keep-alive) are closed: a client that reuses one gets no
        answer from a registry that is down."""
        if self.server is not None:
            self._stop_delay.set()
            self.server.shutdown()
            self.server.server_close()
            self.server = None
            with self.lock:
                connections = list(self._connections)
                self._connections.clear()
                self._closed_by_stop.update(connections)
            for c in connections:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    @property
    def url(self):
        return "http://%s:%d" % (self.host, self.port)

    # ---- content

    def add_id(self, schema_id, schema, schema_type="AVRO", references=None):
        with self.lock:
            self.schemas[schema_id] = {"schema": schema, "schemaType": schema_type,
                                       "references": references or []}
            self.next_id = max(self.next_id, schema_id + 1)

    def register(self, subject, schema, schema_type="AVRO", references=None):
        """Registers like POST /subjects/{s}/versions; returns the id (raises on 409)."""
        request = {"schema": schema, "schemaType": schema_type}
        if references:
            request["references"] = references
        status, body = self._register(subject, request)
        if status != 200:
            raise ValueError("registry refused: %r" % (body,))
        return body["id"]

    def count(self, prefix):
        with self.lock:
            return sum(1 for p in self.requests if p.startswith(prefix))

    # ---- the API

    def _register(self, subject, request):
        schema = request.get("schema")
        schema_type = request.get("schemaType", "AVRO")
        references = request.get("references") or []
        if not isinstance(schema, str) or not isinstance(references, list):
            return 422, {"error_code": 42201, "message": "Invalid schema"}

        def same(s):
            return (s["schema"] == schema and s["schemaType"] == schema_type
                    and s["references"] == references)

        with self.lock:
            versions = self.subjects.setdefault(subject, [])
            for sid in versions:
                if same(self.schemas[sid]):
                    return 200, {"id": sid}
            if versions and schema_type == "AVRO" and not references:
                previous = self.schemas[versions[-1]]["schema"]
                if not _backward_compatible(previous, schema):
                    return 409, {"error_code": 409,
                                 "message": "Schema being registered is incompatible with an "
                                            "earlier schema for subject \"%s\"" % subject}
            sid = None
            for known, s in self.schemas.items():
                if same(s):
                    sid = known
            if sid is None:
                sid = self.next_id
                self.next_id += 1
                self.schemas[sid] = {"schema": schema, "schemaType": schema_type,
                                     "references": references}
            versions.append(sid)
            return 200, {"id": sid}

    def _answer_get(self, path):
        m = re.fullmatch(r"/schemas/ids/(\d+)", path)
        if m:
            s = self.schemas.get(int(m.group(1)))
            if s is None:
                return 404, {"error_code": 40403, "message": "Schema not found"}
            body = {"schema": s["schema"]}
            if s["schemaType"] != "AVRO":
                body["schemaType"] = s["schemaType"]
            if s["references"]:
                body["references"] = s["references"]
            return 200, body
        if path == "/subjects":
            return 200, sorted(self.subjects)
        m = re.fullmatch(r"/subjects/([^/]+)/versions/([^/]+)", path)
        if m:
            versions = self.subjects.get(m.group(1))
            if not versions:
                return 404, {"error_code": 40401, "message": "Subject not found."}
            v = m.group(2)
            if v == "latest":
                index = len(versions)
            elif v.isdigit() and 1 <= int(v) <= len(versions):
                index = int(v)
            else:
                return 404, {"error_code": 40402, "message": "Version not found."}
            sid = versions[index - 1]
            s = self.schemas[sid]
            body = {"subject": m.group(1), "version": index, "id": sid,
                    "schemaType": s["schemaType"], "schema": s["schema"]}
            if s["references"]:
                body["references"] = s["references"]
            return 200, body
        return 404, {"error_code": 404, "message": "HTTP 404 Not Found"}

    def _serve(self, handler, method):
        path = handler.path.split("?")[0]
        with self.lock:
            self.requests.append(path)
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        if self.delay:
            self._stop_delay.wait(self.delay)
        if self.auth is not None:
            expected = "Basic " + base64.b64encode(self.auth.encode()).decode()
            if handler.headers.get("Authorization") != expected:
                return _reply(handler, 401, {"error_code": 401, "message": "Unauthorized"})
        if self.failing is not None and path.startswith(self.failing):
            return _reply(handler, 503, {"error_code": 50003, "message": "Unavailable"})
        if method == "GET":
            with self.lock:
                status, body = self._answer_get(path)
            return _reply(handler, status, body)
        m = re.fullmatch(r"/subjects/([^/]+)/versions", path)
        if method == "POST" and m:
            try:
                request = json.loads(raw or b"{}")
            except ValueError:
                return _reply(handler, 422, {"error_code": 42201, "message": "Invalid JSON"})
            status, body = self._register(m.group(1), request)
            return _reply(handler, status, body)
        return _reply(handler, 404, {"error_code": 404, "message": "HTTP 404 Not Found"})


def _reply(handler, status, body):
    data = json.dumps(body).encode()
    try:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
    except OSError:
        pass


def _backward_compatible(previous, new):
    """BACKWARD, as far as the tests need it: a record may add fields only with a default."""
    try:
        old, cur = json.loads(previous), json.loads(new)
    except ValueError:
        return False
    if not (isinstance(old, dict) and isinstance(cur, dict) and cur.get("type") == "record"):
        return True
    old_names = {f["name"] for f in old.get("fields", [])}
    return all(f["name"] in old_names or "default" in f for f in cur.get("fields", []))


def wire(schema_id, body):
    """The Confluent wire format: magic byte 0, the id (4 bytes, big-endian), the data."""
    return b"\x00" + schema_id.to_bytes(4, "big") + body


def avro_encode(schema_json, datum):
    """Avro binary of `datum` with python3-avro (an encoder independent of the extension)."""
    import io

    import avro.io
    import avro.schema

    schema = avro.schema.parse(schema_json)
    out = io.BytesIO()
    avro.io.DatumWriter(schema).write(datum, avro.io.BinaryEncoder(out))
    return out.getvalue()


def avro_decode(schema_json, data):
    import io

    import avro.io
    import avro.schema

    schema = avro.schema.parse(schema_json)
    return avro.io.DatumReader(schema).read(avro.io.BinaryDecoder(io.BytesIO(data)))
