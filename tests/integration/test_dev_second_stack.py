"""A second dev stack beside the default one, on real processes: failed `up`s, recorded ports, its own broker.

One extra stack serves the whole module (starting a Kafka takes a while). Its fixture
walks it through what a person meets: an `up` refused because a port is taken, an
`up` that gives up (`--timeout`) after formatting Kafka's storage with a cluster id
whose first draw began with "-", then a plain `up` that must start cleanly from what
those left. The tests then look at what each step did; the last stops the stack with
its own `delayq dev down --state-dir`.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource
from support.process_testing import run_delayq, wait_until

from delayq.dev import DevStack, StackError
from delayq.testing import free_stack_ports

pytestmark = pytest.mark.integration

# 0xF8 as the first byte encodes to "-" in base64url: StorageTool would take such an id for an option.
DASH_DRAW = uuid.UUID(bytes=b"\xf8" + os.urandom(15))
GOOD_DRAW = uuid.UUID(bytes=b"\x01" + os.urandom(15))
GOOD_ID = base64.urlsafe_b64encode(GOOD_DRAW.bytes).decode().rstrip("=")
LEFT_BY_AN_INTERRUPTED_FORMAT = "left-by-an-interrupted-format"


def processes_of(state_dir: Path) -> list[int]:
    """Live processes whose command line names ``state_dir`` (a zombie's is empty)."""
    needle = os.fsencode(str(state_dir))
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def pid_files(state_dir: Path) -> list[Path]:
    return sorted(state_dir.glob("*/*.pid"))


def meta_properties(state_dir: Path) -> dict[str, str]:
    text = (state_dir / "kafka" / "data" / "meta.properties").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


@dataclass
class SecondStack:
    state_dir: Path
    kafka_port: int
    zk_port: int
    taken_port_up: subprocess.CompletedProcess | None = None
    after_taken_port: dict = field(default_factory=dict)
    timed_out: StackError | None = None
    after_timeout: dict = field(default_factory=dict)
    draws: list[uuid.UUID] = field(default_factory=list)
    up: subprocess.CompletedProcess | None = None

    @property
    def stack(self) -> DevStack:
        return DevStack(self.state_dir)  # the ports `up` recorded


@pytest.fixture(scope="module")
def second(tmp_path_factory) -> SecondStack:
    state_dir = tmp_path_factory.mktemp("second-stack").resolve()
    kafka_port, zk_port = free_stack_ports()
    second = SecondStack(state_dir, kafka_port, zk_port)
    try:
        # 1. Kafka's port is taken by a stranger: `up` refuses, in one line, before starting anything.
        with socket.socket() as stranger:
            stranger.bind(("127.0.0.1", kafka_port))
            stranger.listen()
            second.taken_port_up = run_delayq("dev", "up", "--state-dir", str(state_dir), "--kafka-port",
                                              str(kafka_port), "--zk-port", str(zk_port))
        second.after_taken_port = {"processes": processes_of(state_dir), "pid files": pid_files(state_dir)}

        # 2. What an interrupted StorageTool leaves: a log folder without meta.properties.
        data = state_dir / "kafka" / "data"
        (data / "__cluster_metadata-0").mkdir(parents=True)
        (data / "__cluster_metadata-0" / LEFT_BY_AN_INTERRUPTED_FORMAT).write_bytes(b"\0" * 64)
        (data / "bootstrap.checkpoint").write_bytes(b"half written")

        # 3. An `up` that gives up while Kafka starts, after formatting its storage. Its first
        #    cluster id draw begins with "-"; the real code path must draw again.
        draws = iter([DASH_DRAW, GOOD_DRAW])

        def draw() -> uuid.UUID:
            second.draws.append(next(draws))
            return second.draws[-1]

        impatient = DevStack(state_dir, kafka_port=kafka_port, zk_port=zk_port, start_timeout_s=1.5, draw_uuid=draw)
        try:
            impatient.up(say=lambda _text: None)
        except StackError as err:
            second.timed_out = err
        second.after_timeout = {
            "processes": processes_of(state_dir), "pid files": pid_files(state_dir),
            "leftover": (data / "__cluster_metadata-0" / LEFT_BY_AN_INTERRUPTED_FORMAT).exists(),
        }

        # 4. The next plain `up` of the folder, at the ports recorded there.
        second.up = run_delayq("dev", "up", "--state-dir", str(state_dir), timeout_s=240)
        yield second
    finally:
        run_delayq("dev", "down", "--state-dir", str(state_dir))


# -- a failed up leaves nothing that breaks the next ------------------------------------


def test_an_up_on_a_taken_port_fails_in_one_line_and_starts_nothing(second):
    result = second.taken_port_up
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("delayq dev: ") and "Traceback" not in result.stderr
    assert f"port {second.kafka_port}" in line and "taken" in line and "--kafka-port" in line
    assert second.after_taken_port == {"processes": [], "pid files": []}


def test_an_up_that_times_out_stops_what_it_started(second):
    assert second.timed_out is not None, "the 1.5 s up did not fail"
    message = str(second.timed_out)
    assert "\n" not in message and "did not answer" in message and "--timeout" in message
    assert second.after_timeout["processes"] == [], "the failed up left processes running"
    assert second.after_timeout["pid files"] == []


def test_an_interrupted_format_is_cleared_before_formatting_again(second):
    assert second.after_timeout["leftover"] is False


def test_the_next_up_starts_both_at_the_recorded_ports(second):
    result = second.up
    assert result.returncode == 0, result.stdout + result.stderr
    assert (f"started zookeeper, kafka; Kafka at 127.0.0.1:{second.kafka_port}, "
            f"ZooKeeper at 127.0.0.1:{second.zk_port}") in result.stdout
    assert all(s.healthy for s in second.stack.status())


# -- the KRaft cluster id ------------------------------------------------------------


def test_a_cluster_id_whose_draw_begins_with_a_dash_is_drawn_again_and_the_storage_works(second):
    assert base64.urlsafe_b64encode(DASH_DRAW.bytes).decode().startswith("-")
    assert second.draws == [DASH_DRAW, GOOD_DRAW]
    assert meta_properties(second.state_dir)["cluster.id"] == GOOD_ID
    admin = AdminClient({"bootstrap.servers": second.stack.bootstrap_servers})
    assert admin.describe_cluster(request_timeout=15).result(20).cluster_id == GOOD_ID


# -- status, env and down of a state folder use its recorded ports -----------------------


def test_status_of_a_state_dir_shows_its_ports_not_the_defaults(second):
    result = run_delayq("dev", "status", "--state-dir", str(second.state_dir))

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("healthy") == 2
    assert f"127.0.0.1:{second.kafka_port}" in result.stdout and f"127.0.0.1:{second.zk_port}" in result.stdout
    assert "127.0.0.1:9092" not in result.stdout and "127.0.0.1:2181" not in result.stdout


def test_eval_of_env_points_every_command_at_that_stack(second):
    show = "from delayq import Settings; s = Settings(); print(s.bootstrap_servers, s.zk_connect)"
    python = sys.executable
    shell = f'eval "$({python} -m delayq dev env --state-dir {second.state_dir})" && {python} -c "{show}"'
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYQ_")}
    result = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, env=env, timeout=60)

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [f"127.0.0.1:{second.kafka_port}", f"127.0.0.1:{second.zk_port}"]


def test_asking_a_running_stack_for_other_ports_is_refused_in_one_line(second):
    result = run_delayq("dev", "up", "--state-dir", str(second.state_dir), "--kafka-port", "9092")

    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert f"runs on port {second.kafka_port}, not 9092" in line and "--kafka-port" in line


# -- the broker's configuration ---------------------------------------------------------


def test_the_broker_creates_topics_on_demand_as_kafka_does_by_default(second):
    bootstrap = second.stack.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.BROKER, "1")
    entry = admin.describe_configs([resource])[resource].result(15)["auto.create.topics.enable"]
    assert (entry.value, entry.is_default) == ("true", True)
    assert "auto.create.topics.enable" not in (second.state_dir / "kafka" / "server.properties").read_text()

    topic = f"created-on-demand-{uuid.uuid4().hex[:8]}"
    errors = []
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b"hello", on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(30) == 0
    assert errors == [None]
    assert topic in admin.list_topics(timeout=10).topics


# -- last: down of a state folder stops that stack only ------------------------------------


def test_down_of_a_state_dir_stops_only_its_own_processes(second, dev_stack):
    default_pids = {s.name: s.pid for s in dev_stack.status()}
    assert all(default_pids.values()), "the default dev stack is not running"
    ours = processes_of(second.state_dir)
    assert len(ours) == 2

    result = run_delayq("dev", "down", "--state-dir", str(second.state_dir))

    assert result.returncode == 0, result.stderr
    assert "stopped kafka, zookeeper" in result.stdout
    assert wait_until(lambda: processes_of(second.state_dir) == [], timeout_s=5)
    assert pid_files(second.state_dir) == []
    after = dev_stack.status()
    assert {s.name: s.pid for s in after} == default_pids and all(s.healthy for s in after)
    # Still recorded: a stopped stack's env points at where it will run again.
    env = run_delayq("dev", "env", "--state-dir", str(second.state_dir))
    assert f"export DELAYQ_BOOTSTRAP_SERVERS=127.0.0.1:{second.kafka_port}" in env.stdout
