"""The console on an ``http.server`` port: one WSGI request run inside a ``BaseHTTPRequestHandler``.

A node serves /console on its own HTTP port (delay_service/http.py hands those requests to
:func:`serve`), and ``delayq console`` serves the same app through :class:`ConsoleServer`, so
both speak HTTP/1.1 the same way: a response whose length is known keeps the connection open
(``Content-Length``), one whose length is not closes it (``Connection: close``), and a request
body is read exactly by its ``Content-Length``, never past it into the next request.
"""

from __future__ import annotations

import io
import logging
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import IO, cast
from wsgiref.handlers import SimpleHandler
from wsgiref.headers import Headers
from wsgiref.types import WSGIApplication

log = logging.getLogger("delayq.console")

# The largest request body read (the console's forms are far smaller); a larger one is answered 413 and closed.
MAX_BODY = 1 << 20
# How often the server looks whether it is asked to stop (what stop() waits at most).
STOP_POLL_S = 0.1


class _Handler(SimpleHandler):
    """wsgiref's handler, speaking HTTP/1.1 for the ``http.server`` handler it writes to."""

    http_version = "1.1"
    # wsgiref copies the process's environment into every request's environ by default: not the console's
    # secrets (DELAYQ_CONSOLE_PASSWORD, ...).
    os_environ: dict[str, str] = {}  # noqa: RUF012 - wsgiref's class attribute, never changed
    # Set by wsgiref as it runs the request (typeshed does not list them).
    headers: Headers
    environ: dict[str, str]

    def __init__(self, request: BaseHTTPRequestHandler, body: io.BytesIO, environ: dict[str, str]):
        super().__init__(body, cast(IO[bytes], request.wfile), sys.stderr, environ, multithread=True,
                         multiprocess=False)
        self.request = request

    def cleanup_headers(self) -> None:
        super().cleanup_headers()  # sets Content-Length when the app's answer is one block
        if "Content-Length" not in self.headers or self.request.close_connection:
            # The end of the body is the end of the connection: the client must not wait for another answer.
            self.headers["Connection"] = "close"
            self.request.close_connection = True

    def handle_error(self) -> None:
        # Whatever was written of this answer, the connection cannot carry another one reliably.
        self.request.close_connection = True
        super().handle_error()

    def log_exception(self, exc_info) -> None:  # wsgiref's signature
        log.error("console: %s %s failed", self.environ.get("REQUEST_METHOD"), self.environ.get("PATH_INFO"),
                  exc_info=exc_info)


def serve(handler: BaseHTTPRequestHandler, app: WSGIApplication) -> None:
    """Answer the request ``handler`` has parsed (its method, path and headers) with ``app``.

    Reads the body by ``Content-Length`` first (a body without one, chunked, is refused with 411
    and the connection closed), then runs ``app`` and writes its answer to ``handler.wfile``.
    """
    length_text = handler.headers.get("Content-Length")
    if handler.headers.get("Transfer-Encoding") is not None and length_text is None:
        _refuse(handler, 411, "a request body needs a Content-Length")
        return
    try:
        length = int(length_text or 0)
    except ValueError:
        length = -1
    if length < 0:
        _refuse(handler, 400, f"Content-Length {length_text!r:.30} is not a length")
        return
    if length > MAX_BODY:
        _refuse(handler, 413, f"a request body of {length} bytes is over the console's {MAX_BODY}")
        return
    body = io.BytesIO(handler.rfile.read(length) if length else b"")
    _Handler(handler, body, _environ(handler, length)).run(app)


def _environ(handler: BaseHTTPRequestHandler, length: int) -> dict[str, str]:
    """The CGI part of a WSGI environ for ``handler``'s request (wsgiref adds the wsgi.* keys)."""
    target = urllib.parse.urlsplit(handler.path)
    address = handler.server.server_address
    host, port = (address[0], address[1]) if isinstance(address, tuple) else (address, "")
    environ = {
        "REQUEST_METHOD": handler.command,
        "SCRIPT_NAME": "",
        # WSGI: the path decoded from %-escapes, its bytes as latin-1 characters.
        "PATH_INFO": urllib.parse.unquote_to_bytes(target.path or "/").decode("latin-1"),
        "QUERY_STRING": target.query,
        "SERVER_NAME": str(host),
        "SERVER_PORT": str(port),
        "SERVER_PROTOCOL": handler.request_version,
        "REMOTE_ADDR": handler.client_address[0],
        "CONTENT_LENGTH": str(length) if length else "",
        "CONTENT_TYPE": handler.headers.get("Content-Type", ""),
    }
    for name in handler.headers:
        if "_" in name:
            continue  # X_Forwarded... would pass for X-Forwarded...: such headers are dropped, as wsgiref's server does
        key = "HTTP_" + name.upper().replace("-", "_")
        if key in ("HTTP_CONTENT_TYPE", "HTTP_CONTENT_LENGTH") or key in environ:
            continue
        environ[key] = ",".join(handler.headers.get_all(name) or ())
    return environ


def _refuse(handler: BaseHTTPRequestHandler, status: int, line: str) -> None:
    body = (line + "\n").encode()
    handler.close_connection = True
    handler.send_response(status)
    handler.send_header("Content-Type", "text/plain; charset=utf-8")
    handler.send_header("Content-Length", str(len(body)))
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.wfile.write(body)


class ConsoleServer:
    """A WSGI ``app`` on ``host:port`` of its own (``delayq console``), each request in a thread, through :func:`serve`.

    Raises:
        OSError: the address cannot be bound (taken, or not this machine's).
    """

    def __init__(self, app: WSGIApplication, host: str, port: int):
        handler = type("ConsoleHandler", (_ConsoleRequest,), {"app": staticmethod(app)})
        self.server = ThreadingHTTPServer((host, port), handler)
        self.server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def start(self) -> None:
        """Serve in a thread of its own."""
        self._thread = threading.Thread(target=self.server.serve_forever, args=(STOP_POLL_S,), name="console-http",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _ConsoleRequest(BaseHTTPRequestHandler):
    """Every method of every path goes to the app."""

    app: WSGIApplication
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # http.server's signature
        pass  # the audit log says what changed; page views are not logged

    def do_GET(self) -> None:  # http.server's naming
        serve(self, self.app)

    do_HEAD = do_POST = do_GET  # noqa: N815 - http.server's naming; other methods answer 501
