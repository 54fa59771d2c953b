"""The node's HTTP endpoints: /livez, /readyz, /metrics, GET /v1/messages/{id}, the console's /v1/shards/, /console.

The server sees the node only through :class:`NodeView`: health, metrics, which shard
an id is in and whether the node holds it, the store's entry for an id, the console's answers
about a shard it holds (shard_answers.py), and the console's WSGI app; nothing else.

For the console (console/records.py), per shard this node holds:

- ``GET /v1/shards/<shard>/pending[?days=7]``: :class:`PendingHistogram`; 503 with ``"status":
  "counting"`` (and ``Retry-After``) while the store's first count runs.
- ``GET /v1/shards/<shard>/upcoming[?after=<due_ms>:<id>][&limit=100][&topic=<topic>]``:
  :class:`UpcomingPage`, the next messages due after the cursor (a page's ``next``).
- ``GET /v1/shards/<shard>/now``: :class:`ShardNow`.

And for a node that builds its store of a shard from this one's: ``GET /v1/shards/<shard>/store``,
the store's files as a tar stream (store_copies.py).

421 ``not_held`` when this node does not hold the shard; 400 with a one-line error for a bad argument.
"""

from __future__ import annotations

import errno
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Protocol
from wsgiref.types import WSGIApplication

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from delayq.clock import now_ms
from delayq.errors import ConfigurationError
from delayq.store import MAX_DAYS, StoredEntry, StoreError
from delayq.wire import check_delay_id, check_topic

from . import stored
from .console.records import MAX_PAGE, NOW, PENDING, SHARDS_PATH, UPCOMING, to_json
from .shard_answers import Counting, ShardAnswers, schedule_of
from .store_copies import BYTES_HEADER, FILES_HEADER, STORE, TAR_TYPE, copy_facts, send_copy

log = logging.getLogger("delayq.http")

MESSAGES = "/v1/messages/"
CONSOLE = "/console"
# What /pending and /upcoming give unless asked otherwise.
DEFAULT_DAYS = 7
DEFAULT_LIMIT = 100


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

    def shard_count(self) -> int:
        """How many shards the cluster has."""
        ...

    def console_shard(self, shard: int) -> ShardAnswers | None:
        """The console's answers about ``shard``, or None when this node does not hold it."""
        ...

    def store_copy_allowed(self, shard: int, authorization: str | None) -> bool:
        """Whether a request with this ``Authorization`` header may have a copy of ``shard``'s store
        (store_copies.authorized)."""
        ...

    def store_copy(self, shard: int) -> Path | None:
        """A consistent copy of ``shard``'s store in a folder of its own (the caller sends it, then removes it), or
        None when this node does not hold the shard (store_copies.py).

        Raises:
            StoreError: the copy could not be made.
        """
        ...

    @property
    def console_app(self) -> WSGIApplication | None:
        """The console this node serves under /console, or None when it is off (DELAYQ_CONSOLE)."""
        ...


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
    """The endpoints; a node of member processes answers /v1/messages/, /v1/shards/ and /console through its members
    (members.py's GroupHandler overrides :meth:`message`, :meth:`shard_page` and :meth:`console`)."""

    node: NodeView
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # http.server's signature
        pass  # probes every few seconds would drown the node's log

    def do_GET(self) -> None:  # http.server's naming
        self._answer(self._get)

    def do_POST(self) -> None:  # http.server's naming
        self._answer(self._post)

    def _answer(self, handle: Callable[[], None]) -> None:
        try:
            handle()
        except Exception as err:  # one bad request answers 500 in JSON; the server goes on
            log.exception("%s %s failed", self.command, self.path[:200])
            self._json(500, {"error": f"internal error: {type(err).__name__}: {err}"[:500]})

    def _post(self) -> None:
        if _is_console(self.path.split("?", 1)[0]):
            self.console()
            return
        # The body is not read: the connection cannot carry another request after it.
        self.close_connection = True
        self._json(405, {"error": f"POST is not answered on {self.path.split('?', 1)[0][:200]}: only the "
                                  f"console's pages ({CONSOLE}/...) take a POST"})

    def _get(self) -> None:
        path, _, query = self.path.partition("?")
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
        elif path.startswith(SHARDS_PATH):
            self.shard_page(path[len(SHARDS_PATH):], query)
        elif _is_console(path):
            self.console()
        else:
            self._json(404, {"error": f"no such endpoint {path[:200]}"})

    def console(self) -> None:
        """A request of the console's pages (GET or POST), to its WSGI app."""
        app = self.node.console_app
        if app is None:
            self._json(404, {"error": "the console is off on this node: set DELAYQ_CONSOLE=true"})
            return
        from .console.wsgi import serve  # with the app only: the console's side of the node

        serve(self, app)

    def shard_page(self, rest: str, query: str) -> None:
        """``/v1/shards/<shard>/<page>?<query>``: one of the console's questions about a shard this node holds."""
        shard_text, _, page = rest.partition("/")
        if page not in (PENDING, UPCOMING, NOW, STORE):
            self._json(404, {"error": f"no such endpoint {SHARDS_PATH}{rest[:200]}: a shard answers "
                                      f"{SHARDS_PATH}<shard>/{PENDING}, /{UPCOMING}, /{NOW} and /{STORE}"})
            return
        if page == STORE:
            self._store(shard_text)
            return
        try:  # every argument checked before the store is asked anything
            shard = _shard_number(shard_text, self.node.shard_count())
            asked = _query(query, {PENDING: ("days",), UPCOMING: ("after", "limit", "topic"), NOW: ()}[page])
            days = _number(asked.get("days"), "days", DEFAULT_DAYS, MAX_DAYS)
            after = _cursor(asked.get("after"))
            limit = _number(asked.get("limit"), "limit", DEFAULT_LIMIT, MAX_PAGE)
            topic = asked.get("topic")
            if topic is not None:
                topic = check_topic(topic)
        except ValueError as err:
            self._json(400, {"error": str(err)})
            return
        answers = self.node.console_shard(shard)
        if answers is None:
            self._json(421, {"shard": shard, "status": "not_held",
                             "error": f"this node does not hold shard {shard}: ask a node that does (delayq status "
                                      "lists them)"})
        elif page == PENDING:
            self._histogram(answers, days)
        elif page == UPCOMING:
            self._json(200, to_json(answers.upcoming(after, limit, topic)))
        else:
            self._json(200, to_json(answers.now(now_ms())))

    def _store(self, shard_text: str) -> None:
        """The shard's store as a tar stream (store_copies.py), for a node that builds its own from it."""
        try:
            shard = _shard_number(shard_text, self.node.shard_count())
        except ValueError as err:
            self._json(400, {"error": str(err)})
            return
        if not self.node.store_copy_allowed(shard, self.headers.get("Authorization")):
            self._json(401, {"shard": shard, "error": "a copy of a store is given to the nodes of this cluster only: "
                                                      "ask with the Authorization its ZooKeeper credentials give "
                                                      "(delay_service/store_copies.authorization)"},
                       {"WWW-Authenticate": 'Bearer realm="delayq"'})
            return
        try:
            folder = self.node.store_copy(shard)
        except StoreError as err:
            self._json(503, {"shard": shard, "error": f"no copy of shard {shard}'s store now: {err}"})
            return
        if folder is None:
            self._json(421, {"shard": shard, "status": "not_held",
                             "error": f"this node does not hold shard {shard}: ask a node that does"})
            return
        files, size = copy_facts(folder)
        self.close_connection = True  # the body ends with the connection: its length is known only once sent
        self.send_response(200)
        self.send_header("Content-Type", TAR_TYPE)
        self.send_header(FILES_HEADER, str(files))
        self.send_header(BYTES_HEADER, str(size))
        self.send_header("Connection", "close")
        self.end_headers()
        started = time.monotonic()
        try:
            send_copy(self.wfile, folder)
        except OSError as err:  # the receiver went away: it asks another node or reads the buffer
            log.warning("shard %d: the store's copy was not sent whole: %s", shard, err)
            return
        log.info("shard %d: sent a copy of the store (%d files, %.1f MB) in %.1fs", shard, files, size / 1e6,
                 time.monotonic() - started)

    def _histogram(self, answers: ShardAnswers, days: int) -> None:
        found = answers.histogram(now_ms(), days)
        if isinstance(found, Counting):
            # Not an error: the store's first count (a pass over its keys, in a thread) has not ended yet.
            self._json(503, {"shard": found.shard, "status": "counting", "counted": found.counted,
                             "pending": found.pending,
                             "error": f"shard {found.shard}'s pending messages are being counted by due time "
                                      f"({found.counted} of {found.pending}): ask again in a second"},
                       {"Retry-After": "1"})
            return
        self._json(200, to_json(found))

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
        occurrence, repeat = schedule_of(message)
        if repeat is not None:  # a repeating message: the occurrence pending, and the schedule
            answer["occurrence"] = occurrence
            answer["repeat"] = repeat
        if message.attempt is not None:
            answer["attempt"] = message.attempt
        self._json(200, answer)

    def _json(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
        self.send(status, json.dumps(body).encode() + b"\n", "application/json", headers)

    def send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)


def _is_console(path: str) -> bool:
    return path == CONSOLE or path.startswith(CONSOLE + "/")


def _query(query: str, known: tuple[str, ...]) -> dict[str, str]:
    """The arguments of a query string, each at most once and each one of ``known``.

    Raises:
        ValueError: an argument is unknown, given twice, or not %-decodable.
    """
    try:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query),
                                       errors="strict")
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"the query {query[:100]!r} is not one of name=value pairs ({err})") from None
    asked: dict[str, str] = {}
    for name, value in pairs:
        if name not in known:
            takes = f"takes {', '.join(known)}" if known else "takes no arguments"
            raise ValueError(f"unknown argument {name[:40]!r}: this endpoint {takes}")
        if name in asked:
            raise ValueError(f"{name} is given twice: give it once")
        asked[name] = value
    return asked


def _shard_number(text: str, shards: int) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) >= shards:
        raise ValueError(f"shard {text[:40]!r} is not a shard of this cluster: it has shards 0 to {shards - 1}")
    return int(text)


def _number(text: str | None, name: str, default: int, highest: int) -> int:
    if text is None:
        return default
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= highest:
        raise ValueError(f"{name}={text[:40]!r} is not a whole number from 1 to {highest}")
    return int(text)


def _cursor(text: str | None) -> tuple[int, str] | None:
    """An upcoming cursor ``<due_ms>:<id>`` (a page's ``next``) as (due_ms, id); None when not given."""
    if text is None:
        return None
    due, _, delay_id = text.partition(":")
    try:
        if not (due.isascii() and due.isdigit()) or int(due) >= 2**63:
            raise ValueError(due)
        check_delay_id(delay_id, "id")
    except (TypeError, ValueError):
        raise ValueError(f"after={text[:80]!r} is not an upcoming cursor: give <due_ms>:<id>, as a page's next "
                         "says it") from None
    return int(due), delay_id
