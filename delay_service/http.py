"""The node's HTTP endpoints: /livez, /readyz, /metrics, GET /v1/messages/{id}."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from delayq.proxy import check_delay_id

from . import stored

if TYPE_CHECKING:
    from .node import Node

MESSAGES = "/v1/messages/"


def iso_ms(epoch_ms: int) -> str | None:
    """``epoch_ms`` as ISO 8601 UTC; None past the year 9999, which a frame's 18 digits reach and datetime cannot."""
    try:
        moment = datetime.fromtimestamp(epoch_ms / 1000, UTC)
    except (OverflowError, ValueError, OSError):
        return None
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class NodeHTTPServer:
    def __init__(self, node: Node, host: str, port: int):
        handler = type("Handler", (_Handler,), {"node": node})
        self.server = ThreadingHTTPServer((host, port), handler)
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


class _Handler(BaseHTTPRequestHandler):
    node: Node
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 - http.server's signature
        pass  # probes every few seconds would drown the node's log

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0]
        if path == "/livez":
            alive = self.node.alive()
            self._send(200 if alive else 503, b"ok\n" if alive else b"loops stopped\n", "text/plain")
        elif path == "/readyz":
            ready, reason = self.node.ready()
            self._json(200 if ready else 503, {"ready": ready, "reason": reason})
        elif path == "/metrics":
            self._send(200, generate_latest(self.node.metrics.registry), CONTENT_TYPE_LATEST)
        elif path.startswith(MESSAGES):
            self._message(path[len(MESSAGES):])
        else:
            self._json(404, {"error": f"no such endpoint {path}"})

    def _message(self, delay_id: str) -> None:
        try:
            check_delay_id(delay_id, "id")
        except (TypeError, ValueError) as err:
            self._json(400, {"error": str(err)})
            return
        entry = self.node.store.get(delay_id)
        if entry is None:
            self._json(404, {"id": delay_id, "status": "not_found"})
            return
        try:
            message = stored.unpack(entry.payload).message
        except stored.MalformedStoredEntry as err:
            self._json(500, {"id": delay_id, "error": f"the node's store holds an unreadable entry: {err}"})
            return
        self._json(200, {"id": delay_id, "status": "pending", "deliver_at_ms": entry.deliver_at_ms,
                         "deliver_at": iso_ms(entry.deliver_at_ms), "topic": message.topic})

    def _json(self, status: int, body: dict) -> None:
        self._send(status, json.dumps(body).encode() + b"\n", "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
