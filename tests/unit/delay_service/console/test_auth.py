"""Who may act in the console: logins by user and password, token or Authorization header, compared in constant
time; the settings that allow no login refused; the session's CSRF token."""

from __future__ import annotations

import base64
import hmac

import pytest
from flask import Flask

from delayq.delay_service.console import auth
from delayq.errors import ConfigurationError
from delayq.settings import Settings


def settings(**console) -> Settings:
    return Settings(cluster="c", **console)


BOTH = settings(console_user="alice", console_password="s3cret", console_token="t0ken")


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_a_password_login_needs_both_right_and_names_the_user():
    logins = auth.Logins(BOTH)
    assert logins.password_login("alice", "s3cret") == "alice"
    assert logins.password_login("alice", "wrong") is None
    assert logins.password_login("bob", "s3cret") is None
    assert logins.password_login("", "") is None


def test_a_token_login_is_the_token_user_and_an_empty_token_is_none():
    logins = auth.Logins(BOTH)
    assert logins.token_login("t0ken") == auth.TOKEN_USER == "token"
    assert logins.token_login("t0ke") is None
    assert logins.token_login("") is None
    assert auth.Logins(settings()).token_login("anything") is None


def test_no_login_is_possible_when_none_is_set():
    logins = auth.Logins(settings())
    assert not logins.by_password and not logins.by_token
    assert logins.password_login("", "") is None and logins.header_login("Bearer ") is None


@pytest.mark.parametrize(("header", "who"), [
    ("Bearer t0ken", "token"), ("bearer  t0ken ", "token"), ("Bearer nope", None),
    (basic("alice", "s3cret"), "alice"), (basic("alice", "nope"), None), ("Basic !!!", None),
    ("Digest x", None), ("", None), (None, None)])
def test_an_authorization_header_logs_in_by_bearer_token_or_basic_user_and_password(header, who):
    assert auth.Logins(BOTH).header_login(header) == who


def test_secrets_are_compared_as_digests_of_one_length_whatever_their_lengths(monkeypatch):
    compared = []
    real = hmac.compare_digest

    def recording(a, b):
        compared.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", recording)
    auth.Logins(BOTH).password_login("a-much-longer-user-name", "x")
    assert compared == [(32, 32), (32, 32)]  # the user and the password, both checked


def test_actions_on_without_any_login_refuse_to_start_naming_the_settings():
    with pytest.raises(ConfigurationError, match="DELAYQ_CONSOLE_USER and DELAYQ_CONSOLE_PASSWORD, or "
                                                 "DELAYQ_CONSOLE_TOKEN"):
        auth.check_login_settings(settings(console_actions=True))
    auth.check_login_settings(settings(console_actions=True, console_token="t"))
    auth.check_login_settings(settings(console_actions=False))  # nothing to protect


@pytest.mark.parametrize(("console", "given", "missing"), [
    ({"console_user": "alice"}, "DELAYQ_CONSOLE_USER", "DELAYQ_CONSOLE_PASSWORD"),
    ({"console_password": "pw"}, "DELAYQ_CONSOLE_PASSWORD", "DELAYQ_CONSOLE_USER")])
def test_half_a_login_is_refused_naming_what_is_missing(console, given, missing):
    with pytest.raises(ConfigurationError, match=f"^{given} is set without {missing}"):
        auth.check_login_settings(settings(**console))


def test_the_session_key_is_the_setting_or_random_per_process():
    assert auth.session_key(settings(console_secret_key="k")) == b"k"
    assert auth.session_key(settings()) != auth.session_key(settings())


def test_the_csrf_token_is_the_sessions_and_a_login_makes_a_new_one():
    app = Flask(__name__)
    app.secret_key = b"k"
    with app.test_request_context():
        token = auth.csrf_token()
        assert auth.csrf_token() == token
        assert auth.csrf_ok(token) and not auth.csrf_ok(token + "x") and not auth.csrf_ok(None)
        auth.log_in("alice")
        assert auth.logged_in() == "alice"
        assert not auth.csrf_ok(token) and auth.csrf_ok(auth.csrf_token())
        auth.log_out()
        assert auth.logged_in() is None and not auth.csrf_ok(token)


def test_the_throttle_refuses_an_address_after_its_failures_until_the_oldest_is_out_of_the_window():
    now = [1000.0]
    throttle = auth.LoginThrottle(allowed=3, window_s=60, clock=lambda: now[0])
    for _ in range(2):
        throttle.failed("10.0.0.1")
        now[0] += 10
    assert throttle.wait_s("10.0.0.1") == 0, "two failures of three allowed"
    throttle.failed("10.0.0.1")  # at 1020: the first was at 1000
    assert throttle.wait_s("10.0.0.1") == pytest.approx(40.0) and throttle.wait_s("10.0.0.2") == 0
    now[0] = 1060.0
    assert throttle.wait_s("10.0.0.1") == 0, "the first failure left the window"
    throttle.failed("10.0.0.1")
    assert throttle.wait_s("10.0.0.1") == pytest.approx(10.0)
    throttle.succeeded("10.0.0.1")
    assert throttle.wait_s("10.0.0.1") == 0, "a login that succeeded forgets the failures"


def test_the_throttle_remembers_a_bounded_number_of_addresses_the_least_recent_forgotten_first():
    throttle = auth.LoginThrottle(allowed=1, window_s=60, kept=2, clock=lambda: 5.0)
    for address in ("a", "b", "a", "c"):
        throttle.failed(address)
    assert (throttle.wait_s("a"), throttle.wait_s("b"), throttle.wait_s("c")) == (60.0, 0.0, 60.0)
