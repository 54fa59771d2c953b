"""The continuous reconciliation's own logic (follow.py): the per-id step (delayq's jar, in Spark's JVM, driven
through py4j with Spark's own TestGroupState), the subscription, findings, options and the command line. Its
judgement is the batch job's: test_reconcile_rules.py runs every rule through both."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import zipfile
from pathlib import Path

import pytest

from delayq import Settings
from delayq.errors import UsageError
from delayq.spark import spark_session
from delayq.spark.cli import add_arguments, follow_options_from_args, run
from delayq.spark.follow import (
    BUFFER_SIDE,
    DELIVERED_SIDE,
    FINDING_FLAGS,
    FOREVER_MS,
    STEP_INPUT,
    Finding,
    FollowOptions,
    findings_of,
    subscription,
)
from delayq.spark.options import ReconcileOptions
from delayq.spark.records import DONE, PUT
from delayq.spark.session import STEP_JAR

GRACE, RETAIN = 10_000, 60_000
RULES = ReconcileOptions(since_ms=0, until_ms=FOREVER_MS, out=Path("unused"), grace_ms=GRACE)
# STEP_INPUT's columns with the types follow.step_input() gives them.
STEP_INPUT_SCHEMA = "id STRING, record STRING, side INT, kind INT, offset BIGINT, due BIGINT, version BIGINT"
DELIVERY = 3


def record(side: int, kind: int, offset: int | None, due: int | None, ts: int = 1, version: int | None = None
           ) -> tuple:
    """A history record as the job's input gives it to the step (STEP_INPUT): its JSON and the fields it reads."""
    fields = {"side": side, "kind": kind, "offset": offset, "ts": ts, "due": due, "topic": "orders", "written": 0,
              "version": version}
    return ("id-1", json.dumps({k: v for k, v in fields.items() if v is not None}), side, kind, offset, due, version)


def put(offset: int, due: int) -> tuple:
    return record(BUFFER_SIDE, PUT, offset, due)


def delivery(version: int, due: int, ts: int = 1) -> tuple:
    return record(DELIVERED_SIDE, DELIVERY, None, due, ts=ts, version=version)


class Step:
    """delayq.spark.FollowStep called as Spark calls it, with a TestGroupState (Spark's own, for testing steps)."""

    KEPT = ("records", "count", "puts", "putOffset", "putDue", "delivered", "checkAt", "forgetAt")

    def __init__(self):
        self.spark = spark_session("local[2]")
        self.jvm = self.spark._jvm
        assert tuple(c.split()[0] for c in STEP_INPUT_SCHEMA.split(", ")) == STEP_INPUT
        schema = self.jvm.org.apache.spark.sql.types.StructType.fromDDL(STEP_INPUT_SCHEMA)
        self.step = self.jvm.delayq.spark.FollowStep(GRACE, RETAIN, BUFFER_SIDE, DELIVERED_SIDE, PUT, schema)

    def run(self, now: int, *rows: tuple, stored: dict | None = None, timed_out: bool = False) -> list[tuple]:
        """The rows the step emits for id-1; afterwards ``state`` and ``timeout_at`` say what it kept."""
        optional = self.jvm.org.apache.spark.api.java.Optional
        kept = optional.empty() if stored is None else optional.of(self._bean(stored))
        timeout = self.jvm.org.apache.spark.sql.streaming.GroupStateTimeout.ProcessingTimeTimeout()
        self.group_state = self.jvm.org.apache.spark.sql.streaming.TestGroupState.create(
            kept, timeout, now, optional.empty(), timed_out)
        given = self.spark.createDataFrame(list(rows), STEP_INPUT_SCHEMA)._jdf.collectAsList().iterator()
        emitted = self.step.call("id-1", given, self.group_state)
        out = []
        while emitted.hasNext():
            row = emitted.next()
            out.append(tuple(row.get(i) for i in range(row.size())))
        return out

    def _bean(self, stored: dict):
        bean = getattr(self.jvm.delayq.spark, "FollowStep$IdState")()
        long = self.jvm.java.lang.Long
        for name, value in stored.items():
            boxed = name in ("putOffset", "putDue", "delivered", "checkAt")
            getattr(bean, f"set{name[0].upper()}{name[1:]}")(long(str(value)) if boxed and value is not None
                                                              else value)
        return bean

    @property
    def removed(self) -> bool:
        return self.group_state.isRemoved()

    @property
    def state(self) -> dict:
        """What the step kept, by the state's field names."""
        bean = self.group_state.get()
        return {name: getattr(bean, f"get{name[0].upper()}{name[1:]}")() for name in self.KEPT}

    @property
    def timeout_at(self) -> int:
        return self.group_state.getTimeoutTimestampMs().get()


@pytest.fixture(scope="module")
def step() -> Step:
    return Step()


def test_the_jar_in_the_tree_is_what_its_source_compiles_to(tmp_path):
    """A change to FollowStep.java without `make jar` would ship the old step: the jar must be rebuilt."""
    build = _load_build_script()
    with zipfile.ZipFile(STEP_JAR) as jar:
        manifest = jar.read("META-INF/MANIFEST.MF").decode()
        shipped = {name: jar.read(name) for name in jar.namelist() if name.endswith(".class")}
    assert f"{build.DIGEST_ATTRIBUTE}: {build.source_digest()}" in manifest, "run `make jar`: the source changed"
    assert shipped == build.compile_classes(tmp_path), "run `make jar`: the jar's classes are not the source's"


def _load_build_script():
    path = Path(__file__).resolve().parents[3] / "spark" / "jvm" / "build.py"
    spec = importlib.util.spec_from_file_location("delayq_jar_build", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_new_records_are_kept_and_the_whole_history_emitted_with_a_timeout_at_due_plus_grace(step):
    [first] = step.run(1_000, put(5, due=20_000))
    kept = step.state
    assert kept | {"records": None} == {"records": None, "count": 1, "puts": 1, "putOffset": 5, "putDue": 20_000,
                                        "delivered": None, "checkAt": 30_000, "forgetAt": 30_000 + RETAIN}
    assert step.timeout_at == 30_000
    # A lone put before its check can hold no finding: emitted (its record counts as read), not judged.
    assert first == ("id-1", f"[{kept['records']}]", 0, 1_000, False)

    [second] = step.run(2_000, delivery(5, due=20_000, ts=1_900), stored=kept)
    history = json.loads(second[1])
    assert [r["side"] for r in history] == [BUFFER_SIDE, DELIVERED_SIDE] and "offset" not in history[1]
    assert second[2:] == (1, 2_000, True)
    assert (step.state["count"], step.state["putOffset"], step.state["delivered"]) == (2, 5, 5)


def test_the_latest_put_sets_the_check_a_reschedule_moves_it_a_done_does_not(step):
    [emitted] = step.run(1_000, put(9, due=50_000), put(5, due=20_000), record(BUFFER_SIDE, DONE, 11, due=None))
    assert (step.state["puts"], step.state["putOffset"], step.state["putDue"], step.state["checkAt"]) == (
        2, 9, 50_000, 60_000)
    assert emitted[4] is True  # three records: judged


def test_at_the_check_the_history_is_emitted_again_then_forgotten_after_the_retention(step):
    stored = {"records": '{"side":0,"kind":0,"offset":5,"due":20000}', "count": 1, "puts": 1, "putOffset": 5,
              "putDue": 20_000, "delivered": None, "checkAt": 30_000, "forgetAt": 90_000}
    [emitted] = step.run(30_500, stored=stored, timed_out=True)
    assert emitted[2:] == (1, 30_500, True)  # nothing fresh; judged: its version may be missing
    assert (step.state["checkAt"], step.state["forgetAt"], step.timeout_at) == (None, 90_000, 90_000)

    assert step.run(90_000, stored=step.state, timed_out=True) == []
    assert step.removed


@pytest.mark.parametrize("puts,delivered,judged", [
    (1, 5, False),     # its one version delivered: nothing left to find at the check
    (1, None, True),   # not delivered: missing or undeliverable
    (1, 4, True),      # a delivery of another version than the put's
    (2, 5, True),      # a reschedule or a master's copy: always judged at the check
])
def test_the_check_of_an_id_whose_one_version_was_delivered_is_not_judged(step, puts, delivered, judged):
    stored = {"records": "{}", "count": 3, "puts": puts, "putOffset": 5, "putDue": 20_000, "delivered": delivered,
              "checkAt": 30_000, "forgetAt": 90_000}
    emitted = step.run(30_500, stored=stored, timed_out=True)
    assert [row[4] for row in emitted] == ([True] if judged else [])
    assert (step.state["checkAt"], step.timeout_at) == (None, 90_000)  # forgotten later either way


def test_an_id_with_no_put_or_due_already_past_is_judged_now_and_only_forgotten_later(step):
    [emitted] = step.run(100_000, delivery(5, due=20_000))
    assert (step.state["checkAt"], step.state["forgetAt"]) == (None, 100_000 + RETAIN) and emitted[2:] == (
        0, 100_000, True)
    [late] = step.run(100_000, put(5, due=20_000))  # a lone put already past its check: it may be missing now
    assert (step.state["checkAt"], step.state["forgetAt"], late[4]) == (None, 100_000 + RETAIN, True)


def matches(pattern: str, topic: str) -> bool:
    # Spark's Kafka source looks for the pattern anywhere in the name (find): it must be anchored.
    return re.search(pattern, topic) is not None


def test_the_subscription_reads_the_clusters_topics_and_targets_and_never_delayqs_own_or_kafkas():
    settings = Settings(cluster="shop", target_topics=["orders.*", "pay?"])
    pattern = subscription(settings, FollowOptions(checkpoint=Path("c"), rules=RULES))
    for topic in ("delayq-shop-buffer", "delayq-shop-dead-letter", "orders.eu", "orders.", "pays"):
        assert matches(pattern, topic), topic
    for topic in ("delayq-shop-reconcile-findings", "delayq-other-buffer", "delayq-other-dead-letter",
                  "delayq-other-reconcile-findings", "__consumer_offsets", "orders", "ordersXeu", "payments", "my-orders.eu"):
        assert not matches(pattern, topic), topic
    named = subscription(settings, FollowOptions(checkpoint=Path("c"), rules=RULES, topics=("a.b",)))
    assert matches(named, "a.b") and not matches(named, "axb") and not matches(named, "orders")


def test_each_raised_flag_is_one_finding_keyed_by_kind_id_and_version():
    judged = {"id": "id-1", "version": 12, "topic": "orders", "state": "scheduled", "delivered_count": 2,
              **dict.fromkeys(FINDING_FLAGS.values(), False), "is_duplicate": True, "is_early": True}
    found = findings_of([judged, {**judged, "id": "id-2", "is_duplicate": False, "is_early": False}])
    assert [(f.kind, f.key) for f in found] == [("duplicated", "duplicated:id-1:12"), ("early", "early:id-1:12")]
    record = json.loads(found[0].to_json(batch=3, found_ms=99))
    assert (record["batch"], record["found_ms"], record["delivered_count"], record["topic"]) == (3, 99, 2, "orders")
    assert Finding("missing", "id-3", None, {}).key == "missing:id-3:"
    assert set(FINDING_FLAGS) == {"duplicated", "missing", "unexpected", "early", "cancel_ignored", "reordered",
                                  "undeliverable"}


@pytest.mark.parametrize("change,message", [
    ({"metrics_port": 70_000}, "metrics port 70000 is no TCP port"),
    ({"trigger_s": 0}, "trigger of 0 s"),
    ({"retain_ms": -1}, "retain_ms -1"),
])
def test_follow_options_refuse_values_out_of_range_naming_them(change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        FollowOptions(**{"checkpoint": Path("c"), "rules": RULES, **change})


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, default_master="local[2]")
    return parser.parse_args(list(argv))


def test_follow_flags_become_options_and_the_rules_judge_whatever_the_due_time():
    options = follow_options_from_args(parse("--follow", "--checkpoint", "ck", "--grace", "30s", "--trigger", "3",
                                             "--retain", "2h", "--topics", "a,b", "--metrics-port", "0"))
    assert (options.checkpoint, options.trigger_s, options.retain_ms, options.topics, options.metrics_port) == (
        Path("ck"), 3.0, 7_200_000, ("a", "b"), 0)
    assert (options.rules.grace_ms, options.rules.since_ms, options.rules.until_ms) == (30_000, 0, FOREVER_MS)


@pytest.mark.parametrize("argv,message", [
    (("--follow",), "--follow needs --checkpoint DIR"),
    (("--follow", "--checkpoint", "ck", "--since", "2h", "--out", "r"),
     "--since, --out cannot go with --follow"),
    (("--follow", "--checkpoint", "ck", "--retain", "soon"), "--retain"),
])
def test_follow_flags_that_do_not_fit_are_one_usage_error_naming_them(argv, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        follow_options_from_args(parse(*argv))


def test_follow_only_flags_without_follow_are_refused_before_anything_starts(monkeypatch):
    monkeypatch.setenv("DELAYQ_SPARK_MASTER", "local[2]")
    with pytest.raises(UsageError, match=re.escape("--checkpoint, --trigger only go with --follow")):
        run(parse("--checkpoint", "ck", "--trigger", "3"))
