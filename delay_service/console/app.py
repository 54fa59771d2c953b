"""The console's pages: a Flask app of server-rendered templates under ``/console`` (docs/DESIGN.md, "The console").

Pages read the cluster (cluster.py: ZooKeeper and the nodes' stores) and the console's index
(index.py: histories, dead letters, series), each a page at a time from a cursor. Actions
(actions.py) are plain form POSTs: refused with 403 when the console's actions are off, 401
without a login (auth.py), 403 without the session's CSRF token; each is logged on
``delayq.console.audit`` as one line (who, what, ids, result), and its result is flashed on
the page it returns to. Any error a user can meet is one line on the page (400 bad input,
503 Kafka or ZooKeeper not answering), never a traceback.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from flask import Blueprint, Flask, Response, flash, g, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException

from delayq.clock import format_span, now_ms
from delayq.errors import UnavailableError
from delayq.settings import Settings
from delayq.wire import check_delay_id

from ..http import iso_ms
from . import auth
from .actions import ActionFailed, ActionRefused, Actions, message_state
from .cluster import ClusterView, PendingChart
from .index import ConsoleIndex
from .records import MAX_PAGE, HistoryEvent, ShardNow
from .wsgi import MAX_BODY

audit = logging.getLogger("delayq.console.audit")
log = logging.getLogger("delayq.console")

PREFIX = "/console"
# Rows of a list page unless the page asks for another number (at most records.MAX_PAGE).
PAGE_ROWS = 50
# How long the message page waits for the delivered record of the message's last done to be found in its target
# topic (a bounded read of Kafka: index.find_delivery); past that the page says it is being looked for, and
# shows it on the next load (the answer is kept).
FIND_WAIT_S = 2.0
# After an action, how long the answer waits for the index to read what it wrote, so the page it returns to
# shows it (the cancel in the history, the dead letter replayed).
SETTLE_S = 3.0
# How many answers of find_delivery are kept (per (target, id, version)).
FIND_KEPT = 512


def create_app(settings: Settings, *, index: ConsoleIndex, cluster: ClusterView | None = None,
               actions: Actions | None = None) -> Flask:
    """The console's Flask app over ``settings``' cluster.

    Args:
        settings: the cluster's, and the console's own (console_actions, the login, console_secret_key).
        index: the console's index, started (the caller stops it).
        cluster: ZooKeeper's and the nodes' view (default: a :class:`ClusterView` of ``settings``).
        actions: what the actions do (default: :class:`Actions` of ``settings`` and ``index``).

    Raises:
        ConfigurationError: actions on without a login, or half a login (auth.check_login_settings).
    """
    auth.check_login_settings(settings)
    app = Flask(__name__, static_folder="static", static_url_path=f"{PREFIX}/static", template_folder="templates")
    app.secret_key = auth.session_key(settings)
    app.config.update(
        SESSION_COOKIE_NAME="delayq_console", SESSION_COOKIE_PATH=PREFIX, SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax", MAX_CONTENT_LENGTH=MAX_BODY, TEMPLATES_AUTO_RELOAD=False)
    pages = Pages(settings, index, cluster or ClusterView(settings), actions or Actions(settings, index))
    app.extensions["delayq.console"] = pages
    app.register_blueprint(pages.blueprint())
    app.before_request(pages.who)
    app.context_processor(pages.layout)
    app.add_url_rule("/", "root", lambda: redirect(f"{PREFIX}/"))
    app.jinja_env.filters.update(when=_when, relative=_relative, count=_count, ms=_ms)
    app.jinja_env.globals.update(csrf_token=auth.csrf_token)

    @app.errorhandler(HTTPException)
    def http_error(err: HTTPException) -> tuple[str, int]:
        return _one_line_page(err.code or 500, err.description or err.name)

    @app.errorhandler(UnavailableError)
    def unavailable(err: UnavailableError) -> tuple[str, int]:
        return _one_line_page(503, str(err))

    @app.errorhandler(Exception)
    def internal(err: Exception) -> tuple[str, int]:
        log.exception("console: %s %s failed", request.method, request.path[:200])
        return _one_line_page(500, f"the console failed on this page ({type(err).__name__}); its log has the details")

    return app


class ConsoleApp:
    """The console as a WSGI app, with what it runs: its index (started), the cluster view, the producer.

    :meth:`close` stops them; a node calls it when it stops, ``delayq console`` on SIGTERM.
    """

    def __init__(self, flask_app: Flask, index: ConsoleIndex):
        self.flask_app = flask_app
        self.index = index

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Any:
        return self.flask_app(environ, start_response)

    def close(self) -> None:
        self.flask_app.extensions["delayq.console"].close()
        self.index.stop()


def open_console(settings: Settings) -> ConsoleApp:
    """The console of ``settings``' cluster: its index (``console_data_dir``, else ``data_dir/console``) started,
    and the app over it.

    Raises:
        ConfigurationError: actions on without a login, or half a login.
        ConsoleIndexError: the index's folder cannot be opened.
    """
    auth.check_login_settings(settings)  # before the index is opened: a refusal leaves nothing behind
    index = ConsoleIndex(settings)
    try:
        app = create_app(settings, index=index)
    except BaseException:
        index.close()
        raise
    index.start()
    return ConsoleApp(app, index)


def _client_address() -> str:
    """The address the request came from: what failed logins are counted by."""
    return request.remote_addr or "unknown"


def _one_line_page(status: int, line: str) -> tuple[str, int]:
    """A page that says one line (an error), with the layout; text for a client that sent credentials itself."""
    if request.headers.get("Authorization"):
        return line + "\n", status
    return render_template("error.html", status=status, line=line), status


@dataclass(frozen=True)
class Figures:
    """The overview's delivery figures over the shards' masters: their rate summed, their lateness the worst."""

    rate_per_s: float | None
    lateness_p50_ms: float | None
    lateness_p99_ms: float | None

    @classmethod
    def of(cls, now: dict[int, ShardNow | None]) -> Figures:
        masters = [n for n in now.values() if n is not None and n.master]
        p50 = [n.lateness_p50_ms for n in masters if n.lateness_p50_ms is not None]
        p99 = [n.lateness_p99_ms for n in masters if n.lateness_p99_ms is not None]
        return cls(sum(n.rate_per_s for n in masters) if masters else None, max(p50, default=None),
                   max(p99, default=None))


class Deliveries:
    """Finds the delivered record of a done (index.find_delivery), in the background, keeping each answer."""

    def __init__(self, index: ConsoleIndex):
        self.index = index
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="console-find")
        self._kept: OrderedDict[tuple[str, str, int], Future] = OrderedDict()
        self._lock = threading.Lock()

    def find(self, target: str, delay_id: str, version: int, around_ms: int, wait_s: float) -> Future:
        """The search for it (started now, or earlier), after waiting up to ``wait_s`` for it to end."""
        key = (target, delay_id, version)
        with self._lock:
            search = self._kept.get(key)
            if search is None or (search.done() and search.exception() is not None):  # failed: try again
                search = self._pool.submit(self.index.find_delivery, target, delay_id, version, around_ms)
                self._kept[key] = search
                while len(self._kept) > FIND_KEPT:
                    self._kept.popitem(last=False)
            self._kept.move_to_end(key)
        try:
            search.result(wait_s)
        except FutureTimeout:
            pass
        except UnavailableError:
            pass  # the page says so
        return search

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class Pages:
    """The routes, over the index, the cluster view and the actions."""

    def __init__(self, settings: Settings, index: ConsoleIndex, cluster: ClusterView, actions: Actions):
        self.settings = settings
        self.index = index
        self.cluster = cluster
        self.actions = actions
        self.logins = auth.Logins(settings)
        self.throttle = auth.LoginThrottle()
        self.deliveries = Deliveries(index)

    def close(self) -> None:
        self.deliveries.close()
        self.actions.close()
        self.cluster.close()

    def blueprint(self) -> Blueprint:
        pages = Blueprint("console", __name__, url_prefix=PREFIX)
        for rule, view, methods in (
                ("/healthz", self.healthz, ["GET"]),
                ("/", self.overview, ["GET"]),
                ("/upcoming", self.upcoming, ["GET"]),
                ("/messages", self.find, ["GET"]),
                ("/messages/<delay_id>", self.message, ["GET"]),
                ("/dead-letters", self.dead_letters, ["GET"]),
                ("/series", self.series, ["GET"]),
                ("/login", self.login, ["GET", "POST"]),
                ("/logout", self.logout, ["POST"]),
                ("/actions/cancel", self.cancel, ["POST"]),
                ("/actions/reschedule", self.reschedule, ["POST"]),
                ("/actions/replay", self.replay, ["POST"])):
            pages.add_url_rule(rule, view.__name__, view, methods=methods)
        return pages

    # -- every page ---------------------------------------------------------------

    def who(self) -> ResponseReturnValue | None:
        """Who is asking: a session's login, or an Authorization header's (then no CSRF token is needed); a
        request whose address failed too many logins lately is answered 429 and its header not checked."""
        header = request.headers.get("Authorization")
        g.by_header = header is not None
        g.who = None
        if header is None:
            g.who = auth.logged_in()
            return None
        throttled = self._throttled()
        if throttled is not None:
            return throttled
        g.who = self.logins.header_login(header)
        self._count_login(g.who, "Authorization header")
        return None

    def _throttled(self) -> ResponseReturnValue | None:
        """429 with Retry-After if the request's address failed too many logins lately; else None."""
        address = _client_address()
        wait_s = self.throttle.wait_s(address)
        if not wait_s:
            return None
        retry_after = str(math.ceil(wait_s))
        audit.warning("login not tried: %d failed logins from %s in %.0fs", auth.LOGIN_FAILURES_ALLOWED, address,
                      auth.LOGIN_WINDOW_S)
        text, status = _one_line_page(429, f"{auth.LOGIN_FAILURES_ALLOWED} failed logins from {address} within "
                                           f"{auth.LOGIN_WINDOW_S / 60:.0f} minutes: try again in {retry_after} s")
        return text, status, {"Retry-After": retry_after}

    def _count_login(self, who: str | None, how: str) -> None:
        address = _client_address()
        if who is None:
            self.throttle.failed(address)
            audit.warning("login refused (%s) from %s", how, address)
        else:
            self.throttle.succeeded(address)

    def layout(self) -> dict[str, Any]:
        return {"who": g.get("who"), "actions_on": self.settings.console_actions, "cluster_name": self.settings.cluster,
                "index_lag": self.index.lag(), "here": request.full_path.rstrip("?")}

    # -- pages ---------------------------------------------------------------------

    def healthz(self) -> Response:
        """200 while the console serves (probes: a pod's readiness and liveness); the body says how far its index is."""
        lag = self.index.lag()
        said = "starting" if lag is None else f"{lag:,} records behind"
        return Response(f"ok (the index is {said})\n", 200, mimetype="text/plain")

    def overview(self) -> str:
        overview = self.cluster.overview()
        chart = self.cluster.pending()
        now = self.cluster.now()
        return render_template("overview.html", overview=overview, chart=chart, chart_data=_chart_data(chart),
                               now=now, figures=Figures.of(now), nodes={n.node_id: n for n in overview.nodes})

    def upcoming(self) -> ResponseReturnValue:
        topic = request.args.get("topic", "").strip() or None
        try:
            shard = _number(request.args.get("shard", ""), "shard", None)
            limit = min(_number(request.args.get("limit", ""), "limit", PAGE_ROWS) or PAGE_ROWS, MAX_PAGE)
            page = self.cluster.upcoming(after=request.args.get("after") or None, limit=limit, topic=topic,
                                         shard=shard)
        except ValueError as err:
            return _one_line_page(400, str(err))
        overview = self.cluster.overview()
        next_url = None if page.next is None else url_for(".upcoming", after=page.next, limit=limit,
                                                          **_given(topic=topic, shard=shard))
        return render_template("upcoming.html", page=page, topic=topic or "", shard=shard, limit=limit,
                               shards=[row.shard for row in overview.shards], next_url=next_url)

    def find(self) -> ResponseReturnValue:
        delay_id = request.args.get("id", "").strip()
        try:
            check_delay_id(delay_id, "id")
        except ValueError as err:
            return _one_line_page(400, str(err))
        return redirect(url_for(".message", delay_id=delay_id))

    def message(self, delay_id: str) -> ResponseReturnValue:
        try:
            check_delay_id(delay_id, "id")
        except ValueError as err:
            return _one_line_page(400, str(err))
        history = self.index.history(delay_id)
        latest = self.index.latest_put(delay_id)
        node = self.cluster.lookup(delay_id)
        state = message_state(history, latest, node, self.settings.buffer_topic)
        history, searching = self._with_delivery(delay_id, history)
        return render_template("message.html", delay_id=delay_id, history=history, state=state, node=node,
                               searching=searching)

    def _with_delivery(self, delay_id: str, history: list[HistoryEvent]) -> tuple[list[HistoryEvent], str | None]:
        """The history with the delivered record of its last done, if found in time; and what is still looked for.

        A done of a version that was dead-lettered had no delivery; the target is the topic of the put
        the done closes.
        """
        done = next((e for e in reversed(history) if e.kind == "done" and e.version is not None), None)
        if done is None or any(e.kind in ("delivered", "dead-letter") and e.version == done.version for e in history):
            return history, None
        put = next((e for e in history if e.topic == self.settings.buffer_topic and e.offset == done.version
                    and e.target is not None and e.kind not in ("done", "cancel")), None)
        if put is None or put.target is None or done.version is None:
            return history, None
        search = self.deliveries.find(put.target, delay_id, done.version, done.ts_ms, FIND_WAIT_S)
        if not search.done():
            return history, f"looking for the delivered record of version {done.version} in {put.target}: reload"
        if search.exception() is not None:
            return history, f"the delivered record could not be looked for: {search.exception()}"
        found: HistoryEvent | None = search.result()
        if found is None:
            return history, None
        place = history.index(done)  # the master writes the delivery, then the done
        return [*history[:place], found, *history[place:]], None

    def dead_letters(self) -> ResponseReturnValue:
        code = request.args.get("code", "").strip() or None
        try:
            page = self.index.dead_letters(request.args.get("after") or None, PAGE_ROWS, code)
        except ValueError as err:
            return _one_line_page(400, str(err))
        next_url = None if page.next is None else url_for(".dead_letters", after=page.next, **_given(code=code))
        return render_template("dead_letters.html", page=page, code=code, codes=self.index.dead_letter_codes(),
                               next_url=next_url)

    def series(self) -> ResponseReturnValue:
        try:
            page = self.index.series(request.args.get("after") or None, PAGE_ROWS)
        except ValueError as err:
            return _one_line_page(400, str(err))
        next_url = None if page.next is None else url_for(".series", after=page.next)
        return render_template("series.html", page=page, next_url=next_url)

    # -- login -------------------------------------------------------------------------

    def login(self) -> ResponseReturnValue:
        if request.method == "GET":
            return render_template("login.html", logins=self.logins, back=_back(None))
        if not auth.csrf_ok(request.form.get(auth.CSRF_FIELD)):
            return _one_line_page(403, _STALE_FORM)
        throttled = self._throttled()
        if throttled is not None:
            return throttled
        token = request.form.get("token", "")
        user = request.form.get("user", "")
        who = (self.logins.token_login(token) if token else
               self.logins.password_login(user, request.form.get("password", "")))
        self._count_login(who, "token" if token else f"user {user[:60]!r}")
        if who is None:
            return render_template("login.html", logins=self.logins, back=_back(None),
                                   refused="wrong token" if token else "wrong user or password"), 401
        auth.log_in(who)
        audit.info("%s logged in", who)
        return redirect(_back(f"{PREFIX}/"))

    def logout(self) -> ResponseReturnValue:
        if not auth.csrf_ok(request.form.get(auth.CSRF_FIELD)):
            return _one_line_page(403, _STALE_FORM)
        if g.who is not None:
            audit.info("%s logged out", g.who)
        auth.log_out()
        return redirect(f"{PREFIX}/")

    # -- actions ------------------------------------------------------------------------

    def cancel(self) -> ResponseReturnValue:
        delay_id = request.form.get("id", "")
        return self._act("cancel", [delay_id], lambda: self.actions.cancel(delay_id),
                         f"{PREFIX}/messages/{delay_id.strip()}")

    def reschedule(self) -> ResponseReturnValue:
        delay_id = request.form.get("id", "")
        deliver_at = request.form.get("deliver_at", "")

        def move() -> str:
            if not deliver_at.strip():
                raise ActionRefused("give deliver_at: a time (2026-12-01T09:00:00Z) or a delay from now (90s, 10m)")
            return self.actions.reschedule(delay_id, deliver_at, self.cluster.lookup(delay_id.strip()))

        return self._act(f"reschedule to {deliver_at.strip()[:60]!r}", [delay_id], move,
                         f"{PREFIX}/messages/{delay_id.strip()}")

    def replay(self) -> ResponseReturnValue:
        coordinates = request.form.getlist("coordinates")
        code = request.form.get("code", "").strip()
        deliver_at = request.form.get("deliver_at", "")
        when = f" at {deliver_at.strip()[:60]!r}" if deliver_at.strip() else ""
        if code and not coordinates:
            return self._act(f"replay code {code[:60]}{when}", [], lambda: self.actions.replay_code(code, deliver_at),
                             url_for(".dead_letters", code=code))
        return self._act(f"replay{when}", coordinates, lambda: self.actions.replay(coordinates, deliver_at),
                         url_for(".dead_letters"))

    def _act(self, what: str, ids: list[str], do: Callable[[], str], back: str) -> ResponseReturnValue:
        """Do an action if it may be done (on, logged in, the session's form); log it; say the result."""
        who = g.who or "anonymous"
        action = " ".join([what, *(i.strip()[:60] for i in ids[:20])]) + (
            f" (+{len(ids) - 20} more)" if len(ids) > 20 else "")
        if not self.settings.console_actions:
            return self._refused(who, action, 403, "actions are off on this console (DELAYQ_CONSOLE_ACTIONS=true "
                                                   "turns them on, with a login): nothing was changed")
        if g.who is None:
            return self._refused(who, action, 401, "log in to act (user and password, or token): nothing was "
                                                   "changed")
        if not g.by_header and not auth.csrf_ok(request.form.get(auth.CSRF_FIELD)):
            return self._refused(who, action, 403, _STALE_FORM)
        try:
            result = do()
        except ActionRefused as err:
            return self._refused(who, action, err.status, str(err))
        except ActionFailed as err:
            return self._refused(who, action, 503, str(err))
        audit.info("%s %s: %s", who, action, result)
        # The page it returns to reads the index: let it read what the action wrote first (bounded).
        self.index.wait_caught_up(SETTLE_S)
        if g.by_header:
            return Response(result + "\n", 200, mimetype="text/plain")
        flash(result, "done")
        return redirect(_back(back))

    @staticmethod
    def _refused(who: str, action: str, status: int, line: str) -> tuple[str, int]:
        audit.warning("%s %s: refused (%d): %s", who, action, status, line)
        return _one_line_page(status, line)


_STALE_FORM = "the form's CSRF token is missing or stale: reload the page and send the form again; nothing was changed"


def _back(default: str | None) -> str:
    """Where a form returns to: its ``back`` field when it is a console page, else ``default`` (or the overview)."""
    back = request.values.get("back", "")
    if back.startswith(f"{PREFIX}/") and not back.startswith("//") and "\\" not in back:
        return back
    return default or f"{PREFIX}/"


def _given(**values: Any) -> dict[str, Any]:
    """The query arguments that are set (a link keeps a page's filters and leaves the others out)."""
    return {name: value for name, value in values.items() if value is not None}


def _number(text: str, name: str, default: int | None) -> int | None:
    """Raises: ValueError: ``text`` is neither empty nor a number >= 0."""
    text = text.strip()
    if not text:
        return default
    if not text.isdigit() or len(text) > 9:
        raise ValueError(f"{name}={text[:30]!r} is not a number: give a whole number >= 0, or leave {name} out")
    return int(text)


def _chart_data(chart: PendingChart) -> dict[str, list]:
    """The pending chart's bars for the page's script: overdue, each minute of the next hour, then each hour."""
    labels, counts, kinds = ["overdue"], [chart.overdue], ["overdue"]
    for bucket in chart.buckets:
        minute = bucket.width_ms < 3_600_000
        start = _when(bucket.start_ms)  # 2026-11-27T20:18:00.000Z
        labels.append(start[11:16] if minute else f"{start[5:10]} {start[11:13]}:00")
        counts.append(bucket.count)
        kinds.append("minute" if minute else "hour")
    return {"labels": labels, "counts": counts, "kinds": kinds}


def _when(epoch_ms: int | None) -> str:
    """An epoch-ms time as the pages show it: ISO 8601 UTC to the millisecond."""
    if epoch_ms is None:
        return "-"
    return iso_ms(epoch_ms) or f"{epoch_ms} ms"


def _relative(epoch_ms: int | None) -> str:
    """``in 5m12s`` or ``3h ago``: how far from now."""
    if epoch_ms is None:
        return ""
    span = epoch_ms - now_ms()
    text = _ms(abs(span))
    return f"in {text}" if span >= 0 else f"{text} ago"


def _ms(span_ms: float | None) -> str:
    """A span for people (:func:`delayq.clock.format_span`): ``350ms``, ``42s``, ``5m7s``, ``3h12m``, ``2d3h``."""
    return "-" if span_ms is None else format_span(timedelta(milliseconds=span_ms))


def _count(number: int | None) -> str:
    return "-" if number is None else f"{number:,}"
