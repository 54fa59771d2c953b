"""Who may act in the console: a login by user and password or by token, kept in Flask's signed session cookie,
and a CSRF token bound to that session on every form.

Secrets are compared in constant time: both sides are hashed to digests of one length first
(``hmac.compare_digest`` leaks the length of what it compares otherwise), and a user-and-password
login checks both whatever the first says. A client that is no browser may send
``Authorization: Bearer <token>`` or ``Basic`` (user and password) with each request instead of a
session; a browser never sends either on its own (the console never asks for Basic), so such a
request needs no CSRF token.

Failed logins are throttled per client address (:class:`LoginThrottle`): a password guessed online
gets ten tries in five minutes, not thousands a second.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from flask import session

from delayq.errors import ConfigurationError
from delayq.settings import Settings

# The session's keys: who logged in, and the CSRF token of the session's forms.
WHO, CSRF = "who", "csrf"
# Who a token login is, in the audit log and on the page.
TOKEN_USER = "token"
# The form field of the CSRF token.
CSRF_FIELD = "csrf"


# Failed logins (a form, or a request's Authorization header) one client address may make within
# LOGIN_WINDOW_S; more are refused (429) without being checked until the oldest of them is that old.
LOGIN_FAILURES_ALLOWED = 10
LOGIN_WINDOW_S = 300.0
# Client addresses remembered at most, the least recent forgotten first: a flood of addresses cannot grow the
# memory without bound (one address behind a proxy stands for all its clients: they share its tries).
LOGIN_ADDRESSES_KEPT = 10_000


class LoginThrottle:
    """Counts failed logins per client address and says how long one must wait before it may try again."""

    def __init__(self, allowed: int = LOGIN_FAILURES_ALLOWED, window_s: float = LOGIN_WINDOW_S,
                 kept: int = LOGIN_ADDRESSES_KEPT, clock: Callable[[], float] = time.monotonic):
        self._allowed, self._window_s, self._kept, self._clock = allowed, window_s, kept, clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()  # the console serves requests from several threads

    def wait_s(self, address: str) -> float:
        """Seconds until ``address`` may try a login again (0: now)."""
        with self._lock:
            failures = self._recent(address)
            if failures is None or len(failures) < self._allowed:
                return 0.0
            return max(0.0, failures[0] + self._window_s - self._clock())

    def failed(self, address: str) -> None:
        """Count a failed login from ``address``."""
        with self._lock:
            failures = self._recent(address)
            if failures is None:
                failures = self._failures[address] = deque(maxlen=self._allowed)
                while len(self._failures) > self._kept:
                    self._failures.popitem(last=False)
            self._failures.move_to_end(address)
            failures.append(self._clock())

    def succeeded(self, address: str) -> None:
        """A login from ``address`` succeeded: its failures are forgotten."""
        with self._lock:
            self._failures.pop(address, None)

    def _recent(self, address: str) -> deque[float] | None:
        """``address``'s failures within the window (older ones dropped), or None."""
        failures = self._failures.get(address)
        if failures is not None:
            horizon = self._clock() - self._window_s
            while failures and failures[0] <= horizon:
                failures.popleft()
            if not failures:
                del self._failures[address]
                return None
        return failures


def check_login_settings(settings: Settings) -> None:
    """Refuse settings with which nobody can act though actions are on, or with half a login.

    Raises:
        ConfigurationError: actions on and no user+password nor token; a user without a password or the reverse.
    """
    if (settings.console_user is None) != (settings.console_password is None):
        given, missing = (("DELAYQ_CONSOLE_USER", "DELAYQ_CONSOLE_PASSWORD") if settings.console_password is None
                          else ("DELAYQ_CONSOLE_PASSWORD", "DELAYQ_CONSOLE_USER"))
        raise ConfigurationError(f"{given} is set without {missing}: set both (a login by user and password), or "
                                 "neither")
    if settings.console_actions and settings.console_user is None and settings.console_token is None:
        raise ConfigurationError("DELAYQ_CONSOLE_ACTIONS=true needs a login: set DELAYQ_CONSOLE_USER and "
                                 "DELAYQ_CONSOLE_PASSWORD, or DELAYQ_CONSOLE_TOKEN (or turn actions off)")


def _same(given: str, expected: str) -> bool:
    """Whether two secrets are equal, in a time that tells nothing of either (digests of equal length)."""
    return hmac.compare_digest(hashlib.sha256(given.encode()).digest(), hashlib.sha256(expected.encode()).digest())


class Logins:
    """Checks logins against ``settings``' console user, password and token."""

    def __init__(self, settings: Settings):
        self._user = settings.console_user
        self._password = settings.console_password.get_secret_value() if settings.console_password else None
        self._token = settings.console_token.get_secret_value() if settings.console_token else None

    @property
    def by_password(self) -> bool:
        """Whether a user and password are set."""
        return self._user is not None and self._password is not None

    @property
    def by_token(self) -> bool:
        return self._token is not None

    def password_login(self, user: str, password: str) -> str | None:
        """The user, if ``user`` and ``password`` are the console's; else None."""
        if self._user is None or self._password is None:
            return None
        user_ok = _same(user, self._user)
        password_ok = _same(password, self._password)  # checked even when the user is wrong: the same time
        return self._user if user_ok and password_ok else None

    def token_login(self, token: str) -> str | None:
        """:data:`TOKEN_USER` if ``token`` is the console's token; else None."""
        return TOKEN_USER if self._token is not None and token and _same(token, self._token) else None

    def header_login(self, authorization: str | None) -> str | None:
        """Who an ``Authorization`` header (Bearer token, or Basic user and password) logs in, or None."""
        scheme, _, credentials = (authorization or "").strip().partition(" ")
        if scheme.lower() == "bearer":
            return self.token_login(credentials.strip())
        if scheme.lower() == "basic":
            try:
                user, _, password = base64.b64decode(credentials.strip(), validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return None
            return self.password_login(user, password)
        return None


def session_key(settings: Settings) -> bytes:
    """What signs the session cookie: ``console_secret_key``, else a random key for this process."""
    if settings.console_secret_key is not None:
        return settings.console_secret_key.get_secret_value().encode()
    return secrets.token_bytes(32)


def logged_in() -> str | None:
    """Who the session says logged in (None: nobody)."""
    who = session.get(WHO)
    return who if isinstance(who, str) else None


def log_in(who: str) -> None:
    """Start a logged-in session for ``who``: a new session and a new CSRF token (none from before the login)."""
    session.clear()
    session[WHO] = who
    session[CSRF] = secrets.token_urlsafe(32)


def log_out() -> None:
    session.clear()


def csrf_token() -> str:
    """The session's CSRF token, made on first use (the forms' hidden ``csrf`` field)."""
    token = session.get(CSRF)
    if not isinstance(token, str):
        token = session[CSRF] = secrets.token_urlsafe(32)
    return token


def csrf_ok(given: str | None) -> bool:
    """Whether ``given`` (a form's ``csrf`` field) is the session's CSRF token."""
    token = session.get(CSRF)
    return isinstance(token, str) and given is not None and _same(given, token)
