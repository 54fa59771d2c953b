"""The reconciliation on a real Spark standalone cluster: the dev stack's master and worker (`delayq dev up --spark`).

One planted history (support.reconcile_testing.plant_troubled: a duplicate, an early delivery, a
missing message, a cancel in time and one ignored, an unknown id, an aborted copy) is judged on
``local[2]`` (in this process, as tests/integration/test_reconcile.py judges its histories) and
then on the cluster, in processes of their own as a user runs them: ``delayq reconcile --master
spark://...`` (the driver in the command, the executors on the worker) and spark-submit of the
module against the same master. The reports must be the same, and the master's and the worker's
own JSON must show the application and its executors there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from support.kafka_testing import read_topic
from support.process_testing import wait_until
from support.reconcile_testing import Staged, plant_troubled

import delayq.spark.__main__ as job_module
from delayq.dev import DevStack, StackError
from delayq.dev import spark as spark_cluster
from delayq.spark import iso, kafka_package, reconcile, spark_session
from delayq.spark.session import BUNDLED_WITH_PYSPARK, spark_home_dir

pytestmark = pytest.mark.integration

# What differs between two runs over the same window: when and how long, and where the files went.
RUN_FIELDS = ("generated_at", "timings_s", "files")


@pytest.fixture(scope="module")
def spark_cluster_stack(dev_stack) -> DevStack:
    """The dev stack with its Spark master and one worker: started here unless they run, and stopped at the end if
    started here."""
    stack = DevStack(dev_stack.folder, spark_workers=1)
    try:
        started = stack.up(say=print)
    except StackError as err:
        pytest.fail(f"the dev stack's Spark could not start: {err}", pytrace=False)
    yield stack
    if not os.environ.get("DELAYQ_TEST_KEEP_STACK"):
        stack.down(tuple(reversed(started)))


@pytest.fixture(scope="module")
def history(dev_stack) -> Staged:
    return plant_troubled(dev_stack)


@pytest.fixture(scope="module")
def local_report(history, tmp_path_factory) -> dict:
    """The history judged on local[2], in this process (the session other reconcile tests share, if one runs)."""
    out = tmp_path_factory.mktemp("local")
    reconcile(history.settings, history.options(out, grace_ms=5 * 60_000), spark=spark_session("local[2]"))
    return comparable(out)


def reconcile_process(history: Staged, out: Path, *master: str) -> subprocess.CompletedProcess:
    """``delayq reconcile`` over the history's window, in a process of its own, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "delayq", "reconcile", *window(history), "--out", str(out), *master],
                          env=job_env(history), capture_output=True, text=True, timeout=300, check=False)


def window(history: Staged) -> list[str]:
    return ["--since", iso(history.since) or "", "--until", iso(history.until) or "", "--grace", "5m"]


def job_env(history: Staged) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name != "DELAYQ_SPARK_MASTER"}
    return {**env, **history.env()}


def comparable(out: Path) -> dict:
    """report.json without what differs from run to run (the time, the timings, the paths of the files)."""
    report = json.loads((out / "report.json").read_text())
    return {key: value for key, value in report.items() if key not in RUN_FIELDS}


def master_json(stack: DevStack) -> dict:
    ports = stack.spark_ports
    assert ports is not None
    state = spark_cluster.master_state(ports.master_ui)
    assert state is not None, "the Spark master's JSON does not answer"
    return state


def apps_finished_since(stack: DevStack, before: set[str], timeout_s: float = 30.0) -> list[dict]:
    """The applications the master lists as completed that ``before`` did not hold, once there are any.

    A driver's process ends before the master has moved its application from the active to the
    completed ones: the master's JSON is asked again for a while.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        state = master_json(stack)
        new = [app for app in state["completedapps"] if app["id"] not in before]
        if new or time.monotonic() > deadline:
            return new
        time.sleep(0.5)


def completed_ids(stack: DevStack) -> set[str]:
    return {app["id"] for app in master_json(stack)["completedapps"]}


def executors_of(stack: DevStack, app_id: str) -> list[dict]:
    """The executors the worker ran (or runs) for ``app_id``, from the worker's own JSON."""
    ports = stack.spark_ports
    assert ports is not None
    state = spark_cluster.worker_state(ports.worker_uis[0])
    assert state is not None, "the Spark worker's JSON does not answer"
    return [e for e in state["finishedexecutors"] + state["executors"] if e["appid"] == app_id]


def test_local_mode_finds_every_planted_anomaly(history, local_report):
    ids = history.ids

    assert local_report["anomalies"] == {"duplicates": [ids["duplicate"]], "missing": [ids["missing"]],
                                         "unexpected": [ids["unknown"]], "early": [ids["early"]],
                                         "cancel_ignored": [ids["cancel_ignored"]], "reordered": []}
    # The cancel in time, and the ignored one (its id's state is cancelled, and it was delivered anyway).
    assert (local_report["totals"]["expected"], local_report["totals"]["cancelled"]) == (24, 2)
    assert local_report["exit_code"] == 1


def test_reconcile_on_the_standalone_cluster_reports_what_local_mode_reports_and_runs_its_executors_on_the_worker(
        spark_cluster_stack, history, local_report, tmp_path):
    before = completed_ids(spark_cluster_stack)

    result = reconcile_process(history, tmp_path, "--master", spark_cluster_stack.spark_master_url or "")

    assert result.returncode == 1, result.stderr[-3000:]
    assert comparable(tmp_path) == local_report
    ran = apps_finished_since(spark_cluster_stack, before)
    assert [(app["name"], app["state"]) for app in ran] == [("delayq-reconcile", "FINISHED")]
    app_id = ran[0]["id"]
    executors = executors_of(spark_cluster_stack, app_id)
    assert executors, f"the worker ran no executor of {app_id}"
    # Each executor fetched delayq's code, shipped with the job, into its folder on the worker.
    work = spark_cluster_stack.folder / spark_cluster.worker_name(1) / "work" / app_id
    for executor in executors:
        assert list((work / str(executor["id"])).glob("delayq-*.zip")), f"no delayq code shipped to {executor}"


def test_spark_submit_of_the_module_on_the_standalone_cluster_gives_the_same_report(
        spark_cluster_stack, history, local_report, tmp_path):
    import pyspark

    before = completed_ids(spark_cluster_stack)
    cache = spark_home_dir()
    submit = [str(Path(pyspark.__file__).parent / "bin" / "spark-submit"),
              "--master", spark_cluster_stack.spark_master_url or "", "--deploy-mode", "client",
              # The Kafka source from delayq's Ivy cache (the local run filled it): nothing is downloaded.
              "--packages", kafka_package(), "--conf", f"spark.jars.ivy={cache / 'ivy'}",
              "--conf", f"spark.jars.ivySettings={cache / 'ivysettings.xml'}",
              "--conf", f"spark.jars.excludes={','.join(BUNDLED_WITH_PYSPARK)}",
              "--conf", f"spark.pyspark.python={sys.executable}", "--conf", "spark.driver.host=127.0.0.1",
              "--conf", "spark.sql.shuffle.partitions=16",
              job_module.__file__, *window(history), "--out", str(tmp_path)]

    result = subprocess.run(submit, env=job_env(history), capture_output=True, text=True, timeout=300, check=False)

    assert result.returncode == 1, result.stderr[-3000:]
    assert comparable(tmp_path) == local_report
    ran = apps_finished_since(spark_cluster_stack, before)
    assert [app["state"] for app in ran] == ["FINISHED"]
    assert executors_of(spark_cluster_stack, ran[0]["id"]), "the worker ran no executor of the submitted job"


def test_follow_on_the_standalone_cluster_reports_the_same_anomalies_with_its_step_on_the_worker(
        spark_cluster_stack, history, local_report, tmp_path):
    """`--follow` with its executors on the worker: its per-id step (delayq's jar) must reach them."""
    before = completed_ids(spark_cluster_stack)
    findings_topic = f"{history.settings.buffer_topic}-findings"
    log = tmp_path / "follow.log"
    # Deliveries are read from the lookback before now: the history's oldest is under 3 hours old.
    args = ["--follow", "--master", spark_cluster_stack.spark_master_url or "", "--checkpoint",
            str(tmp_path / "checkpoint"), "--findings-topic", findings_topic, "--metrics-port", "0", "--trigger", "2",
            "--grace", "5m", "--lookback", "4h", "--topics", ",".join(history.targets)]
    with open(log, "wb") as out:
        follower = subprocess.Popen([sys.executable, "-m", "delayq", "reconcile", *args], env=job_env(history),
                                    stdout=out, stderr=subprocess.STDOUT)
    renamed = {"duplicates": "duplicated"}
    expected = {(renamed.get(kind, kind), delay_id) for kind, ids in local_report["anomalies"].items()
                for delay_id in ids}

    def found() -> set[tuple[str, str]]:
        admin = AdminClient({"bootstrap.servers": history.settings.bootstrap_servers})
        if findings_topic not in admin.list_topics(timeout=10).topics:
            return set()
        keys = (r.key().decode() for r in read_topic(history.settings.bootstrap_servers, findings_topic, idle_s=0.5))
        return {tuple(key.split(":")[:2]) for key in keys}

    try:
        arrived = wait_until(lambda: found() >= expected or follower.poll() is not None, 240, 2.0)
        assert arrived and follower.poll() is None, f"findings {found()}, expected {expected}:\n{log.read_text()[-3000:]}"
        assert found() == expected  # nothing else: not the aborted duplicate, not the cancel in time
    finally:
        follower.send_signal(signal.SIGTERM)
        follower.wait(60)
    ran = apps_finished_since(spark_cluster_stack, before)
    assert [app["name"] for app in ran] == ["delayq-reconcile"]
    assert executors_of(spark_cluster_stack, ran[0]["id"]), "the worker ran no executor of the continuous job"


def test_dev_status_and_env_cover_the_running_spark(spark_cluster_stack):
    folder = ["--state-dir", str(spark_cluster_stack.folder)]

    status = subprocess.run([sys.executable, "-m", "delayq", "dev", "status", *folder], capture_output=True,
                            text=True, timeout=60, check=False, env={**os.environ, "COLUMNS": "250"})
    env = subprocess.run([sys.executable, "-m", "delayq", "dev", "env", *folder], capture_output=True, text=True,
                         timeout=60, check=False)

    assert status.returncode == 0, status.stdout
    rows = {line.split("│")[1].strip(): line for line in status.stdout.splitlines() if line.count("│") > 2}
    assert "healthy" in rows["spark-master"] and "healthy" in rows["spark-worker-1"]
    assert f"export DELAYQ_SPARK_MASTER={spark_cluster_stack.spark_master_url}" in env.stdout.splitlines()


def test_a_standalone_master_that_does_not_answer_is_one_line_with_the_fix(history, tmp_path):
    nobody = f"spark://127.0.0.1:{spark_cluster.free_port()}"

    result = reconcile_process(history, tmp_path, "--master", nobody)

    assert result.returncode == 2
    error = " ".join(result.stderr.split())
    assert f"the Spark master {nobody} does not answer" in error and "delayq dev up --spark" in error
    assert "Traceback" not in result.stderr
