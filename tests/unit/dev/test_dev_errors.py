"""`delayq dev` and the embedded stack explain every failure in one line: what, the value, the fix."""

from __future__ import annotations

import socket

import pytest

from delayq.cli import main
from delayq.dev import StackError
from delayq.dev import runtime as runtime_module
from delayq.dev.runtime import Artifact, Runtime, ensure_runtime, java_executable


def test_missing_java_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no java anywhere

    with pytest.raises(StackError, match=r"Java 17 or newer is needed .* install it"):
        java_executable()


def test_a_java_home_without_java_names_it(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))

    with pytest.raises(StackError, match=f"JAVA_HOME is {tmp_path}, which has no bin/java: point it at"):
        java_executable()


def test_failed_download_names_what_failed(monkeypatch, tmp_path):
    monkeypatch.setenv("DELAYQ_CACHE_DIR", str(tmp_path))
    missing = Runtime("nothing", "0", (Artifact("org.apache.kafka", "kafka_2.13", "0.0.0-does-not-exist"),))

    with pytest.raises(StackError, match=r"downloading nothing 0 from Maven Central failed") as caught:
        ensure_runtime(missing, say=lambda _: None)
    assert "\n" not in str(caught.value) and "Maven said: " in str(caught.value)
    assert not (tmp_path / "nothing-0" / ".complete").exists()


def test_mavens_first_error_line_is_what_it_said():
    output = ("[INFO] Scanning\n[ERROR] Failed to execute goal on project x: Could not resolve dependencies\n"
              "[ERROR] \n[ERROR] Re-run Maven using the -X switch\n[ERROR] -> [Help 1]\n")

    assert runtime_module.maven_says(output) == (
        "[ERROR] Failed to execute goal on project x: Could not resolve dependencies")


# -- the command line: one line on stderr, exit 2, never a traceback --------------------------------


def free_ports() -> list[str]:
    """``--kafka-port P --zk-port Q``: free ports, P + 1 (Kafka's controller) too."""
    while True:
        with socket.socket() as kafka, socket.socket() as controller, socket.socket() as zk:
            kafka.bind(("127.0.0.1", 0))
            try:
                controller.bind(("127.0.0.1", kafka.getsockname()[1] + 1))
            except OSError:
                continue
            zk.bind(("127.0.0.1", 0))
            return ["--kafka-port", str(kafka.getsockname()[1]), "--zk-port", str(zk.getsockname()[1])]


def dev_error(capsys, *args: str) -> str:
    assert main(["dev", *args]) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("delayq dev: "), err
    return lines[0]


def test_a_port_out_of_range(capsys, tmp_path):
    line = dev_error(capsys, "up", "--state-dir", str(tmp_path), "--kafka-port", "70000")
    assert "Kafka port 70000 is out of range" in line and "--kafka-port" in line


def test_ports_that_collide(capsys, tmp_path):
    line = dev_error(capsys, "status", "--state-dir", str(tmp_path), "--kafka-port", "9092", "--zk-port", "9093")
    assert "ZooKeeper port 9093 collides" in line


def test_a_state_dir_that_is_a_file(capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    line = dev_error(capsys, "up", "--state-dir", str(afile), *free_ports())
    assert f"the state folder {afile} is a file" in line and "--state-dir" in line


def test_env_of_a_folder_where_no_stack_ran(capsys, tmp_path):
    line = dev_error(capsys, "env", "--state-dir", str(tmp_path))
    assert f"no dev stack has run in {tmp_path}" in line and f"delayq dev up --state-dir {tmp_path}" in line


def test_damaged_kafka_storage_is_refused_before_anything_starts_and_brackets_stay_text(capsys, tmp_path):
    data = tmp_path / "kafka" / "data"
    data.mkdir(parents=True)
    (data / "meta.properties").write_text("version=1\ncluster.id=abc\nnode.id=[/x]\n")

    line = dev_error(capsys, "up", "--state-dir", str(tmp_path), *free_ports())

    assert "Kafka's storage in" in line and "names node.id '[/x]'" in line
    assert f"delayq dev down --wipe --state-dir {tmp_path}" in line
    assert not list(tmp_path.glob("*/*.pid")) and not (tmp_path / "zookeeper").exists()


def test_down_wipe_deletes_the_folder(capsys, tmp_path):
    (tmp_path / "s" / "kafka" / "data").mkdir(parents=True)

    assert main(["dev", "down", "--wipe", "--state-dir", str(tmp_path / "s")]) == 0
    assert not (tmp_path / "s").exists()
    assert "nothing was running" in capsys.readouterr().out


def test_a_jar_cache_that_cannot_be_written_names_its_variable(capsys, monkeypatch, tmp_path):
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("DELAYQ_CACHE_DIR", str(tmp_path / "afile" / "cache"))

    line = dev_error(capsys, "up", "--state-dir", str(tmp_path / "s"), *free_ports())

    assert "dev up failed (Not a directory" in line and "DELAYQ_CACHE_DIR" in line
    assert not list((tmp_path / "s").glob("*/*.pid"))
