"""The web console in a real headless Chromium, over a real cluster: one node of two shards on the dev stack.

The same pages are served two ways, and the page tests run on both: under /console on the
node's HTTP port (DELAYQ_CONSOLE=true) and by a ``delayq console`` process. Actions (cancel,
replay) are taken through the ``delayq console`` process after logging in; what they did is checked
where it happens: the node's store, the target topics. The console's index and the node are
asynchronous, so every check reloads the page until it shows what is awaited, within a bound.

``DELAYQ_SCREENSHOTS=<folder>`` saves the pictures of the overview, upcoming, message and dead-letter
pages there (docs/console/*.png come from that).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
from confluent_kafka import Message
from confluent_kafka import Producer as KafkaProducer
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from support.kafka_testing import create_topics, read_topic

import delayq
from delayq import Settings, wire
from delayq.clock import now_ms
from delayq.delay_service.console.history import REPLAYED_FROM
from delayq.testing import LocalCluster, NodeProcess, drop_cluster, free_server_port, settings_env
from delayq.wire import Envelope, new_delay_id

pytestmark = pytest.mark.integration
# The browser fixtures (a session's headless Chromium; per test, screenshots on failure).
pytest_plugins = ["support.browser"]

USER, PASSWORD = "operator", "correct horse battery staple"
# What both consoles run with: actions on, behind this test's login.
CONSOLE_ENV = {"DELAYQ_CONSOLE_ACTIONS": "true", "DELAYQ_CONSOLE_USER": USER, "DELAYQ_CONSOLE_PASSWORD": PASSWORD}
NODE_ID = "console-node"
# The contract's div#state values.
PENDING, CANCELLED = "pending", "cancelled"
T = TypeVar("T")
WRONG_PARTITION, MISSING_TOPIC = wire.Reason.WRONG_PARTITION.value, wire.Reason.MISSING_TOPIC.value


@dataclass
class Stage:
    """The cluster every test of the module shares, and the message they all look at."""

    settings: Settings
    root: Path
    node: NodeProcess
    producer: delayq.Producer
    target: str
    # A message due in about eleven minutes: put due in ten, then rescheduled by the producer.
    waiting: str
    waiting_due_ms: int

    def topic(self, role: str) -> str:
        """A topic of this cluster's (``drop_cluster`` deletes them with it)."""
        return f"{self.settings.cluster}-{role}"


# Other traffic around the message the tests follow: due now (delivered at once: the overview's rate and
# lateness have something to show), over the next hour by minute and over the next two days by hour.
DUE_NOW, NEXT_HOUR, NEXT_DAYS = 12, 24, 24


def put_traffic(producer: delayq.Producer, target: str) -> None:
    start = now_ms()
    dues = ([start + 500] * DUE_NOW + [start + 150_000 * (n + 1) for n in range(NEXT_HOUR)]
            + [start + 3_600_000 * (2 + 2 * n) for n in range(NEXT_DAYS)])
    for number, due in enumerate(dues):
        producer.produce(target, f"invoice {number} is due".encode(), key=f"invoice-{number}".encode(),
                         deliver_at=due)
    assert producer.flush(30) == 0


@pytest.fixture(scope="module")
def stage(dev_stack, tmp_path_factory) -> Iterator[Stage]:
    root = tmp_path_factory.mktemp("console")
    settings = Settings(bootstrap_servers=dev_stack.bootstrap_servers, zk_connect=dev_stack.zk_connect,
                        cluster=f"t-test-console-browser-{uuid.uuid4().hex[:8]}", data_dir=root / "data",
                        buffer_partitions=4, shards=2, zk_session_timeout_ms=3000)
    cluster = LocalCluster(settings, root, console=True)
    target = f"{settings.cluster}-target"
    create_topics(settings.bootstrap_servers, [target])
    with pytest.MonkeyPatch.context() as patch:  # the node process takes the console's settings from it
        for name, value in CONSOLE_ENV.items():
            patch.setenv(name, value)
        node = cluster.start(NODE_ID)
    producer = delayq.Producer({"bootstrap.servers": settings.bootstrap_servers, "delayq.cluster": settings.cluster})
    put_traffic(producer, target)
    waiting = producer.produce(target, b"pay?", key=b"order-17", headers=[("trace", b"abc")], delay=600)
    assert waiting is not None
    producer.flush(30)
    due = now_ms() + 660_000
    producer.reschedule(waiting, target, b"pay?", key=b"order-17", headers=[("trace", b"abc")], deliver_at=due)
    assert producer.flush(30) == 0
    yield Stage(settings, root, node, producer, target, waiting, due)
    producer.flush(10)
    cluster.close()
    drop_cluster(settings)


@pytest.fixture(scope="module")
def console_command(stage: Stage) -> Iterator[str]:
    """A ``delayq console`` process over the stage's cluster; its /console URL."""
    port = free_server_port()
    env = {**os.environ, **settings_env(stage.settings), **CONSOLE_ENV, "DELAYQ_CONSOLE_HOST": "127.0.0.1",
           "DELAYQ_CONSOLE_PORT": str(port), "DELAYQ_DATA_DIR": str(stage.root / "console-command")}
    log_path = stage.root / "console-command.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen([sys.executable, "-m", "delayq", "console"], env=env, cwd=stage.root,
                                   stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/console"
    try:
        deadline = time.monotonic() + 60
        while http_status(f"{url}/") != 200:
            if process.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
                pytest.fail(f"`delayq console` did not serve {url}/ within 60s (exit {process.poll()}):\n{tail}",
                            pytrace=False)
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@dataclass(frozen=True)
class Console:
    """Where a console serves its pages: ``kind`` "node" (the node's HTTP port) or "command" (``delayq console``)."""

    kind: str
    url: str  # .../console

    @property
    def pictured(self) -> bool:
        """Whether its pages are the README's pictures (those of ``delayq console``)."""
        return self.kind == "command"


@pytest.fixture(scope="module", params=["node", "command"])
def console(request, stage: Stage) -> Console:
    """One of the two consoles over the stage's cluster."""
    if request.param == "node":
        assert http_status(stage.node.console_url) == 200, "the node (DELAYQ_CONSOLE=true) serves no /console/"
        return Console("node", stage.node.console_url.rstrip("/"))
    return Console("command", request.getfixturevalue("console_command"))


@dataclass(frozen=True)
class DeadLetters:
    """Two dead letters planted for the module: a malformed record and an undeliverable message."""

    misplaced: str  # a put on a buffer partition that is not its id's: wrong-partition, replayable (its frame is valid)
    lost: str  # a put for a topic that does not exist yet: missing-topic, replayable
    lost_topic: str


@pytest.fixture(scope="module")
def dead_letters(stage: Stage) -> DeadLetters:
    settings = stage.settings
    misplaced = new_delay_id()
    right = wire.buffer_partition(misplaced, settings.buffer_partitions)
    put = Envelope(delay_id=misplaced, topic=stage.target, deliver_at_ms=now_ms() + 1_000, value=b"misplaced")
    raw = KafkaProducer({"bootstrap.servers": settings.bootstrap_servers})
    raw.produce(settings.buffer_topic, key=misplaced.encode(), value=put.buffer_value(),
                partition=(right + 1) % settings.buffer_partitions)
    assert raw.flush(30) == 0
    lost_topic = stage.topic("late")
    lost = stage.producer.produce(lost_topic, b"lost and found", key=b"k-1", delay=1)
    assert lost is not None and stage.producer.flush(30) == 0
    return DeadLetters(misplaced, lost, lost_topic)


def http_status(url: str, data: dict[str, str] | None = None) -> int | None:
    """The status a GET (or, with ``data``, a form POST) answers with; None when nothing answers."""
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return None


# -- reading pages ---------------------------------------------------------------------------


def poll(what: str, attempt: Callable[[], T | bool | None], timeout_s: float = 30.0, interval_s: float = 0.5) -> T:
    """``attempt()`` until it returns something other than None or False, for at most ``timeout_s``.

    Pages show what asynchronous parts (the console's index, the node) know by now: a test
    looks again rather than sleeping and hoping.

    Raises:
        AssertionError: it never did; the message says what was awaited and what the last attempt saw.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            found = attempt()
        except WebDriverException as err:  # the page changed under a lookup: look again
            found = err.msg
        else:
            if found is not None and found is not False:
                return found  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f}s (last saw {found!r})")
        time.sleep(interval_s)


def reload_until(driver: WebDriver, url: str, what: str, find, timeout_s: float = 30.0):
    """Open ``url`` again and again until ``find(driver)`` returns something; that."""
    def attempt():
        driver.get(url)
        return find(driver)
    return poll(what, attempt, timeout_s=timeout_s)


def one(driver: WebDriver | WebElement, css: str) -> WebElement | None:
    found = driver.find_elements(By.CSS_SELECTOR, css)
    return found[0] if found else None


def cell(row: WebElement, name: str) -> str:
    return row.find_element(By.CSS_SELECTOR, f"td.{name}").text.strip()


def dead_letter_row(driver: WebDriver, delay_id: str, code: str) -> WebElement | None:
    """The row of table#dead-letters for ``delay_id``, once its td.code says ``code``."""
    for row in driver.find_elements(By.CSS_SELECTOR, "table#dead-letters tr[data-coordinates]"):
        if cell(row, "id") == delay_id and cell(row, "code") == code:
            return row
    return None


def history_kinds(driver: WebDriver) -> list[str]:
    return [item.get_attribute("data-kind") or "" for item in driver.find_elements(By.CSS_SELECTOR,
                                                                                    "ol#history li[data-kind]")]


def state(driver: WebDriver) -> str:
    """div#state's text, lower case ("" without one)."""
    found = one(driver, "div#state")
    return found.text.strip().lower() if found else ""


def submit(form: WebElement) -> None:
    """Press the form's button, as a person would."""
    form.find_element(By.CSS_SELECTOR, "button, input[type=submit]").click()


def log_in(driver: WebDriver, console: str) -> None:
    driver.get(f"{console}/login")
    form = driver.find_element(By.CSS_SELECTOR, "form#login")
    form.find_element(By.NAME, "user").send_keys(USER)
    form.find_element(By.NAME, "password").send_keys(PASSWORD)
    submit(form)
    poll("the login form gone after logging in", lambda: one(driver, "form#login") is None, timeout_s=10)


def flash(driver: WebDriver) -> str:
    """What div#flash says about the action just taken."""
    return poll("div#flash after the action", lambda: one(driver, "div#flash"), timeout_s=10).text.strip()


# -- the pages -------------------------------------------------------------------------------


def test_the_overview_shows_both_shards_mastered_by_the_node(browser, console, stage):
    def shards(driver: WebDriver) -> dict[str, str] | None:
        rows = driver.find_elements(By.CSS_SELECTOR, "table#shards tr[data-shard]")
        masters = {row.get_attribute("data-shard") or "": cell(row, "master") for row in rows}
        return masters if len(masters) == 2 and all(NODE_ID in master for master in masters.values()) else None

    masters = reload_until(browser, f"{console.url}/", "table#shards: shards 0 and 1, both mastered by the node",
                           shards)

    assert sorted(masters) == ["0", "1"]
    for css in ("span#rate", "span#lateness-p50", "span#lateness-p99", "canvas#pending-chart", "table#pending-table"):
        assert one(browser, css) is not None, f"the overview has no {css}"


def pending_bucket(driver: WebDriver, due_ms: int) -> int | None:
    """The count of table#pending-table's bucket holding ``due_ms`` (the row with the latest start at or before
    it), when at least 1."""
    rows = {int(row.get_attribute("data-start-ms") or 0): row
            for row in driver.find_elements(By.CSS_SELECTOR, "table#pending-table tr[data-start-ms]")}
    starts = [start for start in rows if start <= due_ms]
    if not starts:
        return None
    count = int(cell(rows[max(starts)], "count").replace(",", "") or 0)
    return count if count >= 1 else None


def test_a_waiting_message_is_upcoming_and_counted_by_due_time(browser, screenshot, console, stage):
    row = reload_until(browser, f"{console.url}/upcoming", f"tr[data-id={stage.waiting}] in table#upcoming",
                       lambda driver: one(driver, f'table#upcoming tr[data-id="{stage.waiting}"]'))

    assert cell(row, "topic") == stage.target
    assert cell(row, "key") == "order-17"
    dues = [cell(other, "due") for other in browser.find_elements(By.CSS_SELECTOR, "table#upcoming tr[data-id]")]
    assert dues == sorted(dues) and len(dues) > NEXT_HOUR, "the upcoming messages are not all there in due order"
    if console.pictured:
        screenshot("upcoming")
    assert reload_until(browser, f"{console.url}/", "the waiting message's bucket in table#pending-table",
                        lambda driver: pending_bucket(driver, stage.waiting_due_ms)) >= 1
    if console.pictured:
        screenshot("overview")


def test_a_message_page_shows_its_put_then_its_reschedule(browser, screenshot, console, stage):
    page = f"{console.url}/messages/{stage.waiting}"

    kinds = reload_until(browser, page, "ol#history with the put and the producer's reschedule",
                         lambda driver: history_kinds(driver)[:2] == ["put", "reschedule"] and history_kinds(driver))

    assert kinds == ["put", "reschedule"]
    assert PENDING in state(browser)
    assert one(browser, "form#cancel") is not None and one(browser, "form#reschedule") is not None
    if console.pictured:
        screenshot("message")
    browser.get(f"{console.url}/messages?id={stage.waiting}")
    assert browser.current_url.endswith(f"/console/messages/{stage.waiting}")


def test_an_action_without_a_login_is_refused_and_changes_nothing(console, stage):
    assert http_status(f"{console.url}/actions/cancel", {"id": stage.waiting}) == 401
    assert stage.node.get(f"/v1/messages/{stage.waiting}")[0] == 200


# -- actions, through `delayq console` ------------------------------------------------------


def test_a_cancel_from_the_message_page_wins_and_nothing_is_delivered(browser, console_command, stage):
    target = stage.topic("cancelled")
    create_topics(stage.settings.bootstrap_servers, [target])
    due = now_ms() + 20_000
    victim = stage.producer.produce(target, b"never", deliver_at=due)
    assert victim is not None and stage.producer.flush(30) == 0
    log_in(browser, console_command)
    page = f"{console_command}/messages/{victim}"
    form = reload_until(browser, page, "form#cancel on the pending message's page",
                        lambda driver: PENDING in state(driver) and one(driver, "form#cancel"))

    submit(form)

    said = flash(browser)
    assert victim in said and "cancel" in said.lower(), said
    reload_until(browser, page, "div#state cancelled", lambda driver: CANCELLED in state(driver))
    assert poll("the node's store without the cancelled message",
                lambda: stage.node.get(f"/v1/messages/{victim}")[0] == 404, timeout_s=15)
    assert now_ms() < due, "the cancel was not in the store before the due time: the test proves nothing"
    time.sleep((due + 3_000 - now_ms()) / 1000)  # past the due time, when a delivery would have happened
    delivered = read_topic(stage.settings.bootstrap_servers, target, idle_s=2, timeout_s=4)
    assert [dict(r.headers() or []).get(wire.ID) for r in delivered] == []


def test_dead_letters_are_listed_by_code_and_each_offers_a_replay(browser, screenshot, console, stage, dead_letters):
    listing = f"{console.url}/dead-letters"

    wrong = reload_until(browser, listing, "the misplaced put listed as wrong-partition",
                         lambda driver: dead_letter_row(driver, dead_letters.misplaced, WRONG_PARTITION))
    assert wrong.find_elements(By.CSS_SELECTOR, "form.replay"), "a put on the wrong partition offers no replay"
    undeliverable = reload_until(browser, listing, "the put for a missing topic listed as missing-topic",
                                 lambda driver: dead_letter_row(driver, dead_letters.lost, MISSING_TOPIC))
    assert undeliverable.find_elements(By.CSS_SELECTOR, "form.replay"), "an undeliverable message offers no replay"
    assert stage.settings.buffer_topic in cell(undeliverable, "source")
    codes = browser.find_element(By.CSS_SELECTOR, "ul#codes").text
    assert MISSING_TOPIC in codes and WRONG_PARTITION in codes
    if console.pictured:
        screenshot("dead-letters")


def replay_once_from_the_page(browser, console_url: str, stage: Stage, delay_id: str, code: str,
                              target: str) -> Message:
    """Replay the dead letter of ``delay_id`` (reason ``code``) from its page, logged in: the record it puts on
    ``target`` (with the header naming the dead letter, exactly once: a second replay of every dead letter of the
    code sends nothing more)."""
    settings = stage.settings
    listing = f"{console_url}/dead-letters?code={code}"
    row = reload_until(browser, listing, f"{delay_id}'s dead letter listed as {code}",
                       lambda driver: dead_letter_row(driver, delay_id, code))
    replayed_from = f"{settings.dead_letter_topic}/{row.get_attribute('data-coordinates')}".encode()
    log_in(browser, console_url)
    browser.get(listing)

    submit(dead_letter_row(browser, delay_id, code).find_element(By.CSS_SELECTOR, "form.replay"))
    assert "replayed" in flash(browser).lower()

    def replays() -> list:
        return [r for r in read_topic(settings.bootstrap_servers, target, idle_s=1, timeout_s=5)
                if dict(r.headers() or []).get(REPLAYED_FROM) == replayed_from]
    [replay] = poll("the replay delivered to its topic with header dead-letter-replayed-from",
                    lambda: replays() or None, timeout_s=30)

    # Every replayable dead letter of the code, again: this one was replayed already, so nothing goes.
    browser.get(listing)
    submit(browser.find_element(By.CSS_SELECTOR, "form#replay-filtered"))
    said = flash(browser)
    assert not said.lower().startswith("replayed"), f"a second replay was taken: {said}"
    time.sleep(3)  # a second replay, due now, would be delivered within this
    assert len(replays()) == 1, "the dead letter was replayed twice"
    return replay


def test_an_undeliverable_dead_letter_is_replayed_once_its_topic_exists(browser, console_command, stage,
                                                                       dead_letters):
    create_topics(stage.settings.bootstrap_servers, [dead_letters.lost_topic])
    replay = replay_once_from_the_page(browser, console_command, stage, dead_letters.lost, MISSING_TOPIC,
                                       dead_letters.lost_topic)
    assert (replay.key(), replay.value()) == (b"k-1", b"lost and found")


def test_a_planted_wrong_partition_put_is_replayed_once_onto_its_right_partition(browser, console_command, stage,
                                                                                dead_letters):
    replay = replay_once_from_the_page(browser, console_command, stage, dead_letters.misplaced, WRONG_PARTITION,
                                       stage.target)
    assert replay.value() == b"misplaced"
