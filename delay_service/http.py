"""The node's HTTP endpoints: /livez, /readyz, /metrics, GET /v1/messages/{id}.

The server sees the node only through :class:`NodeView`: health, metrics, which shard
an id is in and whether the node holds it, and the store's entry for an id; nothing else.
"""

from __future__ import annotations

import errno
import json
import logging
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from delayq.errors import ConfigurationError
from delayq.store import StoredEntry
from delayq.wire import check_delay_id, series_options

from . import stored

log = logging.getLogger("delayq.http")

MESSAGES = "/v1/messages/"


class NodeView(Protocol):
    """What the HTTP endpoints may ask of a node."""

    @property
    def registry(self) -> CollectorRegistry: ...

    def alive(self) -> bool: ...

    def ready(self) -> tuple[bool, str]: ...

    def shard_of(self, delay_id: str) -> tuple[int, bool]:
        """The shard ``delay_id`` is in, and whether this node holds it."""
        ...

    def entry(self, delay_id: str) -> StoredEntry | None: ...


def iso_ms(epoch_ms: int) -> str | None:
    """``epoch_ms`` as ISO 8601 UTC; None past the year 9999, which a frame's 18 digits reach and datetime cannot."""
    try:
        moment = datetime.fromtimestamp(epoch_ms / 1000, UTC)
    except (OverflowError, ValueError, OSError):
        return None
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class NodeHTTPServer:
    """The node's endpoints on ``host:port``.

    Raises:
        ConfigurationError: the port is taken (one line naming DELAYQ_HTTP_PORT).
        OSError: the address cannot be bound for another reason.
    """

    def __init__(self, node: NodeView, host: str, port: int, handler_base: type[NodeHandler] | None = None):
        handler = type("Handler", (handler_base or NodeHandler,), {"node": node})
        try:
            self.server = ThreadingHTTPServer((host, port), handler)
        except OSError as err:
            if err.errno != errno.EADDRINUSE:
                raise
            raise ConfigurationError(f"HTTP port {port} on {host} is taken (DELAYQ_HTTP_PORT={port}): give this node "
                                     "another DELAYQ_HTTP_PORT, or stop what listens there") from None
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class NodeHandler(BaseHTTPRequestHandler):
    """The endpoints; a node of member processes answers /v1/messages/ through its members (members.py)."""

    node: NodeView
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # http.server's signature
        pass  # probes every few seconds would drown the node's log

    def do_GET(self) -> None:  # http.server's naming
        try:
            self._get()
        except Exception as err:  # one bad request answers 500 in JSON; the server goes on
            log.exception("GET %s failed", self.path[:200])
            self._json(500, {"error": f"internal error: {type(err).__name__}: {err}"[:500]})

    def _get(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/livez":
            alive = self.node.alive()
            self.send(200 if alive else 503, b"ok\n" if alive else b"loops stopped\n", "text/plain")
        elif path == "/readyz":
            ready, reason = self.node.ready()
            self._json(200 if ready else 503, {"ready": ready, "reason": reason})
        elif path == "/metrics":
            self.send(200, generate_latest(self.node.registry), CONTENT_TYPE_LATEST)
        elif path.startswith(MESSAGES):
            self.message(path[len(MESSAGES):])
        else:
            self._json(404, {"error": f"no such endpoint {path}"})

    def message(self, delay_id: str) -> None:
        try:
            check_delay_id(delay_id, "id")
        except (TypeError, ValueError) as err:
            self._json(400, {"error": str(err)})
            return
        shard, held = self.node.shard_of(delay_id)
        if not held:
            # 421 Misdirected Request: another node holds the id's shard (delayq.lookup asks the next one).
            self._json(421, {"id": delay_id, "status": "not_held", "shard": shard,
                             "error": f"this node does not hold shard {shard}, where id {delay_id} is: ask a node "
                                      "that does (delayq status lists them)"})
            return
        entry = self.node.entry(delay_id)
        if entry is None:
            self._json(404, {"id": delay_id, "status": "not_found"})
            return
        try:
            message = stored.unpack(entry.payload).message
        except stored.MalformedStoredEntry as err:
            self._json(500, {"id": delay_id, "error": f"the node's store holds an unreadable entry: {err}"})
            return
        answer = {"id": delay_id, "status": "pending", "deliver_at_ms": entry.deliver_at_ms,
                  "deliver_at": iso_ms(entry.deliver_at_ms), "topic": message.topic}
        if message.series is not None:  # a repeating message: the occurrence pending, and the schedule
            answer["occurrence"] = message.occurrence or 1
            answer["repeat"] = series_options(message.series).strip()
        if message.attempt is not None:
            answer["attempt"] = message.attempt
        self._json(200, answer)

    def _json(self, status: int, body: dict) -> None:
        self.send(status, json.dumps(body).encode() + b"\n", "application/json")

    def send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
