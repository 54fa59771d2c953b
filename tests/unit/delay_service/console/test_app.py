"""The console's pages through Flask's test client, over spec_set stand-ins of the index, the cluster view and the
actions: every route renders the ids the page contract names (common to the browser tests); logins; actions refused
without a login (401), with actions off (403) or without the session's CSRF token (403), nothing done; each action
one audit line; errors one line, never a traceback."""

from __future__ import annotations

import logging
import re
from html.parser import HTMLParser
from unittest import mock

import pytest

from delayq.delay_service.console import auth
from delayq.delay_service.console.actions import ActionFailed, ActionRefused, Actions
from delayq.delay_service.console.app import create_app
from delayq.delay_service.console.cluster import (
    ClusterView,
    MergedUpcoming,
    NodeLookup,
    Overview,
    PendingChart,
    ShardRow,
    UpcomingRow,
)
from delayq.delay_service.console.index import ConsoleIndex
from delayq.delay_service.console.records import (
    Bucket,
    DeadLetter,
    HistoryEvent,
    Page,
    SeriesInfo,
    ShardNow,
    UpcomingItem,
)
from delayq.election import NodeRecord, Role
from delayq.errors import ConfigurationError
from delayq.settings import Settings

ID = "0190a3e4-5b6c-7d8e-9f00-112233445566"
OTHER = "0190a3e4-5b6c-7d8e-9f00-000000000002"
T0 = 1_800_000_000_000
BUFFER = "delayq-c-buffer"


class Element:
    def __init__(self, tag: str, attrs: dict[str, str], parent: Element | None):
        self.tag, self.attrs, self.parent, self.children, self.text = tag, attrs, parent, [], ""

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def all(self, selector: str) -> list[Element]:
        """The descendants matching ``tag#id.class[attr="value"]`` (one simple selector, any part optional)."""
        found = re.fullmatch(r"([a-z0-9]*)(?:#([\w-]+))?((?:\.[\w-]+)*)((?:\[[\w-]+(?:=\"[^\"]*\")?\])*)", selector)
        assert found is not None, selector
        tag, id_, classes, attrs = found.groups()
        wanted = dict(re.findall(r"\[([\w-]+)(?:=\"([^\"]*)\")?\]", attrs))
        matches = []
        for element in self.walk():
            if (tag and element.tag != tag) or (id_ and element.attrs.get("id") != id_):
                continue
            if not set(filter(None, classes.split("."))) <= element.classes:
                continue
            if all(name in element.attrs and (not value or element.attrs[name] == value)
                   for name, value in wanted.items()):
                matches.append(element)
        return matches

    def one(self, selector: str) -> Element:
        found = self.all(selector)
        assert len(found) == 1, f"{selector}: {len(found)} found"
        return found[0]

    def walk(self):
        for child in self.children:
            yield child
            yield from child.walk()

    def words(self) -> str:
        return " ".join((self.text + " " + " ".join(c.words() for c in self.children)).split())


VOID_TAGS = frozenset({"input", "meta", "link", "br", "img", "hr"})  # HTML elements without an end tag


class Parsed(HTMLParser):
    """A page's element tree, enough to find what the page contract names."""

    def __init__(self, html: str):
        super().__init__()
        self.root = self.at = Element("document", {}, None)
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        element = Element(tag, {k: v or "" for k, v in attrs}, self.at)
        self.at.children.append(element)
        if tag not in VOID_TAGS:
            self.at = element

    def handle_endtag(self, tag):
        at = self.at
        while at is not None and at.tag != tag:
            at = at.parent
        if at is not None and at.parent is not None:
            self.at = at.parent

    def handle_data(self, data):
        self.at.text += data


def page(response) -> Element:
    return Parsed(response.get_data(as_text=True)).root


def settings(**console) -> Settings:
    return Settings(cluster="c", console_secret_key="k", **console)


ACTING = {"console_actions": True, "console_user": "alice", "console_password": "pw", "console_token": "tok"}


class Console:
    """The app over stand-ins that say: two shards, a pending message, a dead letter, a series."""

    def __init__(self, **console):
        self.index = mock.create_autospec(ConsoleIndex, instance=True, spec_set=True)
        self.cluster = mock.create_autospec(ClusterView, instance=True, spec_set=True)
        self.actions = mock.create_autospec(Actions, instance=True, spec_set=True)
        rows = (ShardRow(0, "node-a", 3, ("node-a", "node-b"), ("node-a", "node-b"), 5),
                ShardRow(1, None, 1, ("node-b",), (), None))
        self.cluster.overview.return_value = Overview("c", rows, (NodeRecord("node-a", Role.MASTER, http="http://a:1"),),
                                                      4, T0)
        self.cluster.pending.return_value = PendingChart(
            T0, 12, 2, (Bucket(T0, 60_000, 4), Bucket(T0 + 60_000, 60_000, 1), Bucket(T0 + 3_600_000, 3_600_000, 5)),
            0, (1,))
        self.cluster.now.return_value = {0: ShardNow(0, True, 60.0, 30, 0.5, 12.0, 250.0, 12), 1: None}
        self.cluster.upcoming.return_value = MergedUpcoming(
            (UpcomingRow(0, UpcomingItem(ID, T0 + 5000, "orders", "k-1", 17, 0)),
             UpcomingRow(1, UpcomingItem(OTHER, T0 + 6000, "pings", None, 21, 1, occurrence=2, repeat="every=60000"))),
            "CURSOR", ())
        self.cluster.lookup.return_value = NodeLookup(True, True, T0 + 5000, "orders")
        self.index.lag.return_value = 0
        self.index.history.return_value = [HistoryEvent("put", T0, BUFFER, 0, 17, due_ms=T0 + 5000, target="orders")]
        self.index.latest_put.return_value = (0, 17)
        self.index.dead_letters.return_value = Page((
            DeadLetter(0, 5, T0, "missing-topic", "no topic nope", ID, f"{BUFFER}/0/3", 3, "nope", T0,
                       (("trace", "t-1"),), True),
            DeadLetter(0, 4, T0, "bad-frame", "not a frame", OTHER, f"{BUFFER}/1/2", 2, None, None, (), False)),
            "OLDER")
        self.index.dead_letter_codes.return_value = {"bad-frame": 1, "missing-topic": 1}
        self.index.series.return_value = Page((SeriesInfo(OTHER, "pings", "every=60000", 2, T0 + 6000, 1, 21),), None)
        self.app = create_app(settings(**console), index=self.index, cluster=self.cluster, actions=self.actions)
        self.client = self.app.test_client()

    def csrf(self) -> str:
        return page(self.client.get("/console/login")).one("form#login").one('input[name="csrf"]').attrs["value"]

    def log_in(self) -> None:
        response = self.client.post("/console/login", data={"user": "alice", "password": "pw", "csrf": self.csrf()})
        assert response.status_code == 302

    def post(self, path: str, **form) -> object:
        return self.client.post(path, data={"csrf": self.csrf(), **form})


@pytest.fixture
def console() -> Console:
    return Console(**ACTING)


# -- the pages and the contract's ids ----------------------------------------------


def test_the_root_and_the_bare_prefix_lead_to_the_overview(console):
    assert console.client.get("/").headers["Location"] == "/console/"
    assert console.client.get("/console").status_code in (301, 308)


def test_the_overview_has_the_shards_the_figures_the_chart_and_its_table(console):
    html = page(console.client.get("/console/"))
    shards = html.one("table#shards")
    zero = shards.one('tr[data-shard="0"]')
    assert zero.one("td.master").words() == "node-a" and zero.one("td.epoch").words() == "3"
    assert zero.one("td.holders").words() == "node-a, node-b" and zero.one("td.lag").words() == "5"
    assert zero.one("td.ready").words().startswith("2 of 2") and zero.one("td.pending").words() == "12"
    assert shards.one('tr[data-shard="1"]').one("td.pending").words() == "unavailable"
    assert html.one("span#rate").words() == "0.5"
    assert html.one("span#lateness-p50").words() == "12ms" and html.one("span#lateness-p99").words() == "250ms"
    html.one("canvas#pending-chart")
    rows = html.one("table#pending-table").all("tr[data-start-ms]")
    assert [(r.attrs["data-start-ms"], r.one("td.count").words()) for r in rows] == [
        (str(T0), "4"), (str(T0 + 60_000), "1"), (str(T0 + 3_600_000), "5")]
    assert "shard 1 unavailable" in html.words()
    assert html.one("script[src]").attrs["src"] == "/console/static/chart.umd.js"


def test_healthz_answers_200_with_the_indexs_lag_for_probes(console):
    console.index.lag.return_value = 1234
    response = console.client.get("/console/healthz")
    assert (response.status_code, response.get_data(as_text=True)) == (200, "ok (the index is 1,234 records behind)\n")
    assert "Set-Cookie" not in response.headers


def test_the_charting_library_is_served_with_its_licence_header(console):
    response = console.client.get("/console/static/chart.umd.js")
    assert response.status_code == 200 and b"Released under the MIT License" in response.data[:300]
    response.close()


def test_every_page_has_the_navigation_and_the_find_form(console):
    for path in ("/console/", "/console/upcoming", f"/console/messages/{ID}", "/console/dead-letters",
                 "/console/series", "/console/login"):
        html = page(console.client.get(path))
        assert html.one("form#find").attrs["action"] == "/console/messages", path
        html.one("form#find").one('input[name="id"]')
        assert [a.words() for a in html.one("nav").all("a")] == ["Overview", "Upcoming", "Dead letters", "Series"]


def test_upcoming_lists_the_merged_page_with_a_next_page_link_keeping_the_filters(console):
    html = page(console.client.get("/console/upcoming?topic=orders&shard=0&limit=2"))
    console.cluster.upcoming.assert_called_once_with(after=None, limit=2, topic="orders", shard=0)
    row = html.one("table#upcoming").one(f'tr[data-id="{ID}"]')
    assert (row.one("td.topic").words(), row.one("td.key").words(), row.one("td.version").words()) == (
        "orders", "k-1", "17")
    assert row.one("td.due").words() == "2027-01-15T08:00:05.000Z" and row.one("td.occurrence").words() == ""
    assert html.one(f'tr[data-id="{OTHER}"]').one("td.occurrence").words() == "2 every=60000"
    assert html.one("a#next-page").attrs["href"] == "/console/upcoming?after=CURSOR&limit=2&topic=orders&shard=0"


def test_the_last_upcoming_page_has_no_next_link_and_bad_arguments_are_one_line(console):
    console.cluster.upcoming.return_value = MergedUpcoming((), None, ())
    assert page(console.client.get("/console/upcoming")).all("a#next-page") == []
    response = console.client.get("/console/upcoming?limit=many")
    assert response.status_code == 400
    assert page(response).one("div#flash").words() == ("limit='many' is not a number: give a whole number >= 0, or "
                                                      "leave limit out")
    console.cluster.upcoming.side_effect = ValueError("after='x' is not a cursor of this console's upcoming list")
    assert console.client.get("/console/upcoming?after=x").status_code == 400


def test_find_by_id_leads_to_the_messages_page_and_a_bad_id_is_one_line(console):
    assert console.client.get(f"/console/messages?id=+{ID}+").headers["Location"] == f"/console/messages/{ID}"
    response = console.client.get("/console/messages?id=nope")
    assert response.status_code == 400 and "Traceback" not in response.get_data(as_text=True)
    assert page(response).one("div#flash").words().startswith("id 'nope' is not a delay id")
    assert console.client.get("/console/messages/nope").status_code == 400


def test_a_pending_messages_page_has_its_history_state_and_forms(console):
    html = page(console.client.get(f"/console/messages/{ID}"))
    assert html.one("div#state").words() == "pending"
    assert [li.attrs["data-kind"] for li in html.one("ol#history").all("li")] == ["put"]
    cancel, reschedule = html.one("form#cancel"), html.one("form#reschedule")
    assert cancel.attrs["action"] == "/console/actions/cancel" and cancel.attrs["method"] == "post"
    assert cancel.one('input[name="id"]').attrs["value"] == ID and cancel.one('input[name="csrf"]').attrs["value"]
    assert reschedule.attrs["action"] == "/console/actions/reschedule"
    reschedule.one('input[name="deliver_at"]')


def test_a_delivered_messages_page_shows_the_delivery_found_in_its_target_and_no_forms(console):
    console.cluster.lookup.return_value = NodeLookup(True, False)
    console.index.history.return_value = [
        HistoryEvent("put", T0, BUFFER, 0, 17, due_ms=T0 + 5000, target="orders"),
        HistoryEvent("done", T0 + 5100, BUFFER, 0, 18, version=17, cutoff=18)]
    console.index.find_delivery.return_value = HistoryEvent("delivered", T0 + 5050, "orders", 2, 40, version=17,
                                                            epoch=4)
    html = page(console.client.get(f"/console/messages/{ID}"))
    assert html.one("div#state").words() == "delivered"
    assert [li.attrs["data-kind"] for li in html.one("ol#history").all("li")] == ["put", "delivered", "done"]
    assert "epoch 4" in html.one('li[data-kind="delivered"]').words()
    console.index.find_delivery.assert_called_once_with("orders", ID, 17, T0 + 5100)
    assert html.all("form#cancel") == [] and html.all("form#reschedule") == []


def test_dead_letters_list_with_codes_replay_forms_and_a_filtered_replay(console):
    html = page(console.client.get("/console/dead-letters?code=missing-topic"))
    console.index.dead_letters.assert_called_once_with(None, 50, "missing-topic")
    table = html.one("table#dead-letters")
    row = table.one('tr[data-coordinates="0/5"]')
    assert (row.one("td.code").words(), row.one("td.id").words(), row.one("td.source").words()) == (
        "missing-topic", ID, f"{BUFFER}/0/3")
    assert row.one("td.time").words().startswith("2027-01-15T08:00:00.000Z")
    assert row.one("td.headers").words() == "trace: t-1"
    replay = row.one("form.replay")
    assert replay.attrs["action"] == "/console/actions/replay"
    assert replay.one('input[name="coordinates"]').attrs["value"] == "0/5"
    assert table.one('tr[data-coordinates="0/4"]').all("form.replay") == []  # nothing to replay in a bad frame
    filtered = html.one("form#replay-filtered")
    assert filtered.one('input[name="code"]').attrs["value"] == "missing-topic"
    codes = html.one("ul#codes")
    assert [(li.attrs["data-code"], li.one("span.count").words()) for li in codes.all("li[data-code]")] == [
        ("bad-frame", "1"), ("missing-topic", "1")]
    assert codes.one('li[data-code="bad-frame"]').one("a").attrs["href"] == "/console/dead-letters?code=bad-frame"
    assert html.one("a#next-page").attrs["href"] == "/console/dead-letters?after=OLDER&code=missing-topic"


def test_series_list_their_schedule_and_a_cancel_form_each(console):
    html = page(console.client.get("/console/series"))
    row = html.one("table#series").one(f'tr[data-id="{OTHER}"]')
    assert (row.one("td.repeat").words(), row.one("td.occurrence").words(), row.one("td.delivered").words()) == (
        "every=60000", "2", "1")
    assert row.one("td.next-due").words().startswith("2027-01-15T08:00:06.000Z")
    form = row.one("form.cancel-series")
    assert form.attrs["action"] == "/console/actions/cancel"
    assert form.one('input[name="id"]').attrs["value"] == OTHER


def test_the_login_form_has_user_password_and_token(console):
    form = page(console.client.get("/console/login")).one("form#login")
    for name in ("user", "password", "token", "csrf"):
        form.one(f'input[name="{name}"]')


def test_a_login_with_actions_off_is_possible_and_the_page_says_it_is_pointless():
    console = Console(console_user="alice", console_password="pw")
    html = page(console.client.get("/console/login"))
    assert "a login changes nothing here" in html.words()
    console.log_in()


# -- logins -------------------------------------------------------------------------


def test_a_login_by_user_and_password_or_token_names_who_is_signed_in(console, caplog):
    caplog.set_level(logging.INFO, "delayq.console.audit")
    console.log_in()
    assert "signed in as alice" in page(console.client.get("/console/")).words()
    console.client.post("/console/logout", data={"csrf": console.csrf()})
    assert "log in" in page(console.client.get("/console/")).one("span.who").words()
    response = console.client.post("/console/login", data={"token": "tok", "csrf": console.csrf()})
    assert response.status_code == 302
    assert "signed in as token" in page(console.client.get("/console/")).words()
    assert [r.getMessage() for r in caplog.records] == ["alice logged in", "alice logged out", "token logged in"]


def test_a_wrong_login_is_refused_with_401_and_logged(console, caplog):
    response = console.client.post("/console/login", data={"user": "alice", "password": "no", "csrf": console.csrf()})
    assert response.status_code == 401
    assert page(response).one("div#flash").words() == "wrong user or password"
    assert "login refused (user 'alice')" in caplog.text


def test_after_ten_failed_logins_an_address_is_refused_429_even_with_the_right_password(console, caplog):
    for _ in range(auth.LOGIN_FAILURES_ALLOWED):
        response = console.client.post("/console/login", data={"user": "alice", "password": "guess",
                                                               "csrf": console.csrf()})
        assert response.status_code == 401
    response = console.client.post("/console/login", data={"user": "alice", "password": "pw", "csrf": console.csrf()})
    assert response.status_code == 429 and 0 < int(response.headers["Retry-After"]) <= auth.LOGIN_WINDOW_S
    assert page(response).one("div#flash").words().startswith("10 failed logins from 127.0.0.1 within 5 minutes")
    assert "signed in" not in page(console.client.get("/console/")).words()
    assert "login not tried: 10 failed logins from 127.0.0.1" in caplog.text
    header = console.client.get("/console/", headers={"Authorization": "Bearer tok"})
    assert header.status_code == 429, "the right token in a header is not tried either"
    elsewhere = console.app.test_client().post("/console/actions/cancel", headers={"Authorization": "Bearer tok"}, data={"id": ID},
                           environ_base={"REMOTE_ADDR": "10.1.2.3"})
    assert elsewhere.status_code != 429, "another address is not throttled"


def test_wrong_authorization_headers_count_as_failed_logins(console):
    for _ in range(auth.LOGIN_FAILURES_ALLOWED):
        assert console.client.post("/console/actions/cancel", headers={"Authorization": "Bearer nope"},
                                   data={"id": ID}).status_code == 401
    response = console.client.post("/console/actions/cancel", headers={"Authorization": "Bearer tok"},
                                   data={"id": ID})
    assert response.status_code == 429 and response.text.startswith("10 failed logins from 127.0.0.1")
    console.actions.cancel.assert_not_called()


def test_a_login_form_without_the_sessions_csrf_token_is_refused(console):
    response = console.client.post("/console/login", data={"user": "alice", "password": "pw", "csrf": "forged"})
    assert response.status_code == 403
    assert "signed in" not in page(console.client.get("/console/")).words()


def test_after_a_login_the_form_returns_to_where_it_was_asked_from_only_within_the_console(console):
    csrf = console.csrf()
    response = console.client.post("/console/login", data={"user": "alice", "password": "pw", "csrf": csrf,
                                                           "back": "/console/series"})
    assert response.headers["Location"] == "/console/series"
    response = console.client.post("/console/login", data={"user": "alice", "password": "pw",
                                                           "csrf": console.csrf(), "back": "https://evil.example/"})
    assert response.headers["Location"] == "/console/"


# -- actions --------------------------------------------------------------------------


def test_an_action_without_a_login_is_401_changes_nothing_and_is_logged(console, caplog):
    response = console.post("/console/actions/cancel", id=ID)
    assert response.status_code == 401
    assert page(response).one("div#flash").words().startswith("log in to act")
    console.actions.cancel.assert_not_called()
    assert f"anonymous cancel {ID}: refused (401)" in caplog.text


def test_an_action_with_actions_off_is_403_even_logged_in_and_changes_nothing(caplog):
    console = Console(console_user="alice", console_password="pw")
    console.log_in()
    response = console.post("/console/actions/replay", coordinates="0/5")
    assert response.status_code == 403
    assert page(response).one("div#flash").words().startswith("actions are off on this console")
    console.actions.replay.assert_not_called()
    assert "alice replay 0/5: refused (403)" in caplog.text


def test_an_action_without_the_sessions_csrf_token_is_403_and_changes_nothing(console):
    console.log_in()
    for token in ({}, {"csrf": "forged"}):
        response = console.client.post("/console/actions/cancel", data={"id": ID, **token})
        assert response.status_code == 403
        assert "CSRF token is missing or stale" in page(response).one("div#flash").words()
    console.actions.cancel.assert_not_called()


def test_a_cancel_logged_in_is_done_flashed_on_the_page_it_returns_to_and_audited(console, caplog):
    caplog.set_level(logging.INFO, "delayq.console.audit")
    console.actions.cancel.return_value = f"cancelled {ID}"
    console.log_in()
    response = console.post("/console/actions/cancel", id=ID, back=f"/console/messages/{ID}")
    assert response.status_code == 302 and response.headers["Location"] == f"/console/messages/{ID}"
    console.actions.cancel.assert_called_once_with(ID)
    console.index.wait_caught_up.assert_called_once()  # the page it returns to shows the cancel
    assert page(console.client.get(response.headers["Location"])).one("div#flash").words() == f"cancelled {ID}"
    assert f"alice cancel {ID}: cancelled {ID}" in [r.getMessage() for r in caplog.records]


def test_a_reschedule_passes_the_time_and_the_nodes_word(console):
    console.actions.reschedule.return_value = f"rescheduled {ID} to ..."
    console.log_in()
    assert console.post("/console/actions/reschedule", id=ID, deliver_at="10m").status_code == 302
    console.actions.reschedule.assert_called_once_with(ID, "10m", console.cluster.lookup.return_value)
    response = console.post("/console/actions/reschedule", id=ID, deliver_at=" ")
    assert response.status_code == 400 and "give deliver_at" in page(response).one("div#flash").words()


def test_a_replay_of_chosen_dead_letters_or_of_a_code(console, caplog):
    caplog.set_level(logging.INFO, "delayq.console.audit")
    console.actions.replay.return_value = "replayed 2 dead letters as ..."
    console.actions.replay_code.return_value = "replayed 7 dead letters as ... of code missing-topic"
    console.log_in()
    csrf = console.csrf()
    response = console.client.post("/console/actions/replay",
                                   data={"csrf": csrf, "coordinates": ["0/5", "0/4"], "deliver_at": "1h"})
    assert response.status_code == 302
    console.actions.replay.assert_called_once_with(["0/5", "0/4"], "1h")
    response = console.client.post("/console/actions/replay", data={"csrf": csrf, "code": "missing-topic"})
    assert response.headers["Location"] == "/console/dead-letters?code=missing-topic"
    console.actions.replay_code.assert_called_once_with("missing-topic", "")
    lines = [r.getMessage() for r in caplog.records]
    assert "alice replay at '1h' 0/5 0/4: replayed 2 dead letters as ..." in lines
    assert "alice replay code missing-topic: replayed 7 dead letters as ... of code missing-topic" in lines


@pytest.mark.parametrize(("error", "status"), [
    (ActionRefused("dead letter 0/5 was replayed already, as x", status=409), 409),
    (ActionRefused("deliver_at 'soon' is neither a time nor a delay"), 400),
    (ActionFailed("the replay of 1 dead letter(s): Kafka confirmed 0 of 1 write(s)"), 503)])
def test_an_action_refused_or_failed_is_its_one_line_with_its_status(console, error, status, caplog):
    console.actions.replay.side_effect = error
    console.log_in()
    response = console.post("/console/actions/replay", coordinates="0/5")
    assert response.status_code == status
    assert page(response).one("div#flash").words() == str(error)
    assert "Traceback" not in response.get_data(as_text=True)
    assert f"alice replay 0/5: refused ({status}): {error}" in caplog.text


def test_a_client_with_a_bearer_token_acts_without_a_session_and_gets_the_line_as_text(console):
    console.actions.cancel.return_value = f"cancelled {ID}"
    response = console.client.post("/console/actions/cancel", data={"id": ID},
                                   headers={"Authorization": "Bearer tok"})
    assert response.status_code == 200 and response.get_data(as_text=True) == f"cancelled {ID}\n"
    response = console.client.post("/console/actions/cancel", data={"id": ID},
                                   headers={"Authorization": "Bearer wrong"})
    assert response.status_code == 401 and response.mimetype == "text/html"
    assert console.actions.cancel.call_count == 1


def test_an_unexpected_error_is_a_one_line_500_and_logged_with_its_traceback(console, caplog):
    console.index.series.side_effect = RuntimeError("boom")
    response = console.client.get("/console/series")
    assert response.status_code == 500
    assert page(response).one("div#flash").words() == ("the console failed on this page (RuntimeError); its log has "
                                                       "the details")
    assert "boom" not in response.get_data(as_text=True) and "boom" in caplog.text


def test_actions_on_without_a_login_refuse_to_make_the_app():
    with pytest.raises(ConfigurationError, match="DELAYQ_CONSOLE_ACTIONS=true needs a login"):
        Console(console_actions=True)
