"""The dev stack's Spark without a Spark: its ports and their choice, its command lines, its readiness, its record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from delayq.cli import build_parser
from delayq.commands.dev import stack_from
from delayq.dev import DevStack, StackError
from delayq.dev import spark as spark_cluster
from delayq.dev.spark import MASTER, SparkPorts, choose_ports, worker_registered
from delayq.dev.stack import recorded_spark_ports

HOME = Path("/opt/pyspark")


def stand_in_for(properties: Path) -> subprocess.Popen:
    """A process whose command line names ``properties`` as a Spark daemon's does, once it does.

    Right after fork the child's /proc cmdline is still the parent's: the stack would not know it
    as its daemon yet (on a busy machine the exec comes measurably later).
    """
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--properties-file",
                                str(properties)])
    deadline = time.monotonic() + 10
    while os.fsencode(properties) not in Path(f"/proc/{process.pid}/cmdline").read_bytes().split(b"\0"):
        assert time.monotonic() < deadline, "the stand-in process did not start within 10 s"
        time.sleep(0.01)
    return process


def draws(*ports: int):
    found = iter(ports)
    return lambda: next(found)


def test_a_first_spark_draws_a_port_for_the_master_its_web_ui_and_each_worker():
    chosen = choose_ports(2, None, keep=lambda name, port: True, draw=draws(40001, 40002, 40003, 40004))

    assert chosen == SparkPorts(40001, 40002, (40003, 40004))
    assert chosen.services == ("spark-master", "spark-worker-1", "spark-worker-2")
    assert chosen.master_url == "spark://127.0.0.1:40001"


def test_recorded_ports_are_kept_while_usable_and_a_taken_one_is_drawn_anew():
    recorded = SparkPorts(7077, 8080, (8081,))
    taken = {8080}

    chosen = choose_ports(2, recorded, keep=lambda name, port: port not in taken, draw=draws(41000, 41001))

    assert chosen == SparkPorts(7077, 41000, (8081, 41001))  # the second worker is new: a port of its own


def test_no_port_is_given_twice_even_when_the_draw_repeats_one():
    chosen = choose_ports(1, None, keep=lambda name, port: True, draw=draws(42000, 42000, 42000, 42001, 42002))

    assert len({chosen.master, chosen.master_ui, *chosen.worker_uis}) == 3


def test_the_record_round_trips_and_garbage_reads_as_no_spark():
    ports = SparkPorts(1, 2, (3, 4))

    assert SparkPorts.from_record(json.loads(json.dumps(ports.as_record()))) == ports
    assert SparkPorts.from_record(None) is None
    assert SparkPorts.from_record({"master_port": "x"}) is None


def test_the_master_and_a_worker_run_on_loopback_known_by_their_properties_file(tmp_path):
    ports = SparkPorts(7077, 8080, (8081, 8082))

    master = spark_cluster.master_argv(HOME, ports, tmp_path / "spark.properties")
    worker = spark_cluster.worker_argv(HOME, ports, 2, tmp_path / "w.properties", tmp_path / "work", cores=1)

    assert master == [str(HOME / "bin" / "spark-class"), "org.apache.spark.deploy.master.Master", "--host",
                      "127.0.0.1", "--port", "7077", "--webui-port", "8080", "--properties-file",
                      str(tmp_path / "spark.properties")]
    assert worker == [str(HOME / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker",
                      "spark://127.0.0.1:7077", "--host", "127.0.0.1", "--webui-port", "8082", "--cores", "1",
                      "--memory", spark_cluster.WORKER_MEMORY, "--work-dir", str(tmp_path / "work"),
                      "--properties-file", str(tmp_path / "w.properties")]


def test_workers_share_the_machines_cores_with_at_least_one_each():
    assert [spark_cluster.worker_cores(n, cpus=2) for n in (1, 2, 3)] == [2, 1, 1]


def test_the_daemons_web_uis_bind_to_loopback_and_log_to_their_file(tmp_path):
    env = spark_cluster.daemon_env({"PATH": "/bin"}, tmp_path, tmp_path / "log4j2.properties")

    assert env["SPARK_LOCAL_IP"] == "127.0.0.1" and env["SPARK_CONF_DIR"] == str(tmp_path)
    assert f'-Dlog4j2.configurationFile="{tmp_path / "log4j2.properties"}"' in env["SPARK_DAEMON_JAVA_OPTS"]
    assert env["PATH"] == "/bin"


def test_a_worker_is_ready_once_the_masters_json_lists_it_alive():
    state = {"status": "ALIVE", "workers": [
        {"webuiaddress": "http://127.0.0.1:8081", "state": "DEAD"},
        {"webuiaddress": "http://127.0.0.1:8082", "state": "ALIVE"}]}

    assert worker_registered(state, 8082)
    assert not worker_registered(state, 8081)  # an earlier run of it, dead
    assert not worker_registered(None, 8082)
    assert spark_cluster.master_alive(state) and not spark_cluster.master_alive({"status": "RECOVERING"})


def test_too_many_workers_are_refused_in_one_line(tmp_path):
    with pytest.raises(StackError, match="choose 1 to 8 with --spark-workers"):
        DevStack(tmp_path, spark_workers=9)


# -- the stack: Spark recorded beside Kafka, stopped first, shown while it was started ---------------


def record_spark(folder: Path, ports: SparkPorts) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "stack.json").write_text(json.dumps({"kafka_port": 19092, "zk_port": 12181,
                                                   "spark": ports.as_record()}))


def test_an_up_without_spark_keeps_sparks_recorded_ports(tmp_path):
    record_spark(tmp_path, SparkPorts(7077, 8080, (8081,)))

    DevStack(tmp_path).record_ports()

    assert recorded_spark_ports(tmp_path) == SparkPorts(7077, 8080, (8081,))
    assert json.loads((tmp_path / "stack.json").read_text())["kafka_port"] == 19092


def test_down_stops_sparks_workers_then_its_master_then_kafka(tmp_path):
    record_spark(tmp_path, SparkPorts(7077, 8080, (8081, 8082)))

    assert DevStack(tmp_path).stopping_order == ("spark-worker-1", "spark-worker-2", "spark-master", "kafka",
                                                 "zookeeper")


def test_spark_shows_in_status_only_while_it_was_started_and_in_env_only_while_its_master_runs(tmp_path):
    record_spark(tmp_path, SparkPorts(7077, 8080, (8081,)))
    stack = DevStack(tmp_path)

    assert [s.name for s in stack.status()] == ["kafka", "zookeeper"]
    sleeper = stand_in_for(tmp_path / MASTER / "spark.properties")
    try:
        (tmp_path / MASTER).mkdir()
        (tmp_path / MASTER / f"{MASTER}.pid").write_text(f"{sleeper.pid}\n")
        shown = {s.name: s for s in stack.status()}
        assert shown[MASTER].running and shown[MASTER].address == "spark://127.0.0.1:7077"
        assert not shown[MASTER].answering  # no web UI answers on 8080 here
        assert stack.env()["DELAYQ_SPARK_MASTER"] == "spark://127.0.0.1:7077"
    finally:
        sleeper.kill()
        sleeper.wait()
    assert "DELAYQ_SPARK_MASTER" not in stack.env()


def test_an_up_asking_fewer_workers_than_run_says_how_to_go_on(tmp_path):
    record_spark(tmp_path, SparkPorts(7077, 8080, (8081, 8082)))
    sleeper = stand_in_for(tmp_path / "spark-worker-2" / "spark.properties")
    try:
        (tmp_path / "spark-worker-2").mkdir()
        (tmp_path / "spark-worker-2" / "spark-worker-2.pid").write_text(f"{sleeper.pid}\n")
        with pytest.raises(StackError, match=r"runs 2 Spark workers, not 1: leave out --spark-workers .*"
                                             r"\(delayq dev down --spark"):
            DevStack(tmp_path, spark_workers=1)._choose_spark_ports()
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize("argv, workers", [
    (["dev", "up"], 0),
    (["dev", "up", "--spark"], 1),
    (["dev", "up", "--spark-workers", "2"], 2),
    (["dev", "status"], 0),
])
def test_dev_up_starts_spark_only_when_asked(tmp_path, argv, workers):
    args = build_parser().parse_args([*argv, "--state-dir", str(tmp_path)])

    assert stack_from(args).spark_workers == workers


def test_the_dev_env_export_is_a_setting_every_command_accepts(monkeypatch):
    from delayq import Settings

    monkeypatch.setenv("DELAYQ_SPARK_MASTER", "spark://127.0.0.1:7077")

    assert Settings().spark_master == "spark://127.0.0.1:7077"
    monkeypatch.delenv("DELAYQ_SPARK_MASTER")
    assert Settings().spark_master == "local[*]"
