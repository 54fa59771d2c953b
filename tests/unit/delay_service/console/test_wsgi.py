"""A WSGI app run inside http.server's handler (the console on a node's port, and `delayq console`): the request as
WSGI sees it, the body read by its length, and HTTP/1.1 keep-alive kept right. A real server on port 0."""

from __future__ import annotations

import http.client
import json
import os
import urllib.request

import pytest

from delayq.delay_service.console.wsgi import MAX_BODY, ConsoleServer


def echo(environ, start_response):
    """Answers with what it saw, as JSON; /stream answers without a length, /boom fails."""
    path = environ["PATH_INFO"]
    if path == "/boom":
        raise RuntimeError("boom")
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    seen = {name: value for name, value in environ.items() if isinstance(value, str)}
    seen["body"] = body.decode()
    answer = json.dumps(seen).encode()
    if path == "/stream":
        start_response("200 OK", [("Content-Type", "application/json")])
        return iter([answer[:10], answer[10:]])  # two blocks: no length known before
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(answer)))])
    return [answer]


@pytest.fixture
def server():
    served = ConsoleServer(echo, "127.0.0.1", 0)
    served.start()
    yield served
    served.stop()


def test_the_app_sees_method_path_query_headers_and_body(server):
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/console/a%20b?x=1&y=%2F",
                                     data=b"id=1&csrf=2", method="POST",
                                     headers={"Content-Type": "application/x-www-form-urlencoded", "X-Thing": "v"})
    with urllib.request.urlopen(request, timeout=5) as response:
        seen = json.loads(response.read())
    assert seen["REQUEST_METHOD"] == "POST" and seen["SCRIPT_NAME"] == ""
    assert seen["PATH_INFO"] == "/console/a b" and seen["QUERY_STRING"] == "x=1&y=%2F"
    assert seen["CONTENT_TYPE"] == "application/x-www-form-urlencoded" and seen["CONTENT_LENGTH"] == "11"
    assert seen["HTTP_X_THING"] == "v" and seen["body"] == "id=1&csrf=2"
    assert seen["SERVER_PORT"] == str(server.port) and seen["REMOTE_ADDR"] == "127.0.0.1"
    assert seen["wsgi.url_scheme"] == "http"


def test_the_process_environment_stays_out_of_the_requests(server, monkeypatch):
    monkeypatch.setenv("DELAYQ_CONSOLE_PASSWORD", "not-for-apps")
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/", timeout=5) as response:
        seen = json.loads(response.read())
    assert "DELAYQ_CONSOLE_PASSWORD" not in seen and "PATH" not in seen
    assert os.environ["DELAYQ_CONSOLE_PASSWORD"]


def test_answers_of_known_length_keep_the_connection_for_the_next_request(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    for body in (b"first", b"second", b""):
        connection.request("POST" if body else "GET", "/x", body=body or None)
        response = connection.getresponse()
        assert response.version == 11 and response.getheader("Connection") is None
        assert json.loads(response.read())["body"] == body.decode()
    connection.close()


def test_an_answer_without_a_length_ends_with_the_connection_which_says_so(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    connection.request("GET", "/stream")
    response = connection.getresponse()
    assert response.getheader("Connection") == "close" and response.getheader("Content-Length") is None
    assert json.loads(response.read())["PATH_INFO"] == "/stream"  # read to the end: the close
    connection.close()


def test_a_failing_app_answers_500_and_the_server_goes_on(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    connection.request("GET", "/boom")
    response = connection.getresponse()
    response.read()
    assert response.status == 500
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/after", timeout=5) as after:
        assert after.status == 200


def test_a_body_over_the_limit_is_refused_unread_and_the_connection_closed(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    connection.putrequest("POST", "/x")
    connection.putheader("Content-Length", str(MAX_BODY + 1))
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 413 and response.getheader("Connection") == "close"
    assert b"over the console's" in response.read()
    connection.close()


def test_a_chunked_body_is_refused_with_411(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    connection.putrequest("POST", "/x")
    connection.putheader("Transfer-Encoding", "chunked")
    connection.endheaders()  # the answer comes before any chunk is sent: the server reads none
    response = connection.getresponse()
    assert response.status == 411 and response.getheader("Connection") == "close"
    connection.close()


def test_a_flask_app_answers_through_the_bridge_with_its_redirects_and_cookies():
    from flask import Flask, redirect, session

    app = Flask(__name__)
    app.secret_key = b"k"
    app.add_url_rule("/set", "set", lambda: (session.update(who="alice"), redirect("/get"))[1])
    app.add_url_rule("/get", "get", lambda: session.get("who", "nobody"))
    served = ConsoleServer(app, "127.0.0.1", 0)
    served.start()
    try:
        connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=5)
        connection.request("GET", "/set")
        response = connection.getresponse()
        response.read()
        assert response.status == 302 and response.getheader("Location") == "/get"
        cookie = response.getheader("Set-Cookie").split(";")[0]
        connection.request("GET", "/get", headers={"Cookie": cookie})
        response = connection.getresponse()
        assert response.read() == b"alice"
        connection.close()
    finally:
        served.stop()
