"""The product as users install it: a wheel built from the tree, in a virtualenv without the editable install.

Every other test runs the editable install, which reads the source folders directly;
a package left out of pyproject.toml would only show here (it once did: no
delayq.commands in the wheel, and `delayq --help` ended in ModuleNotFoundError).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
from support.kafka_testing import read_topic

from delayq import wire
from delayq.delay_service import ensure_topics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ["dev", "init", "node", "status", "produce", "cancel", "get", "reconcile", "demo", "bench", "soak"]


def tracked_tree(dest: Path) -> Path:
    """A copy of the files git tracks (the committed tree, plus what is staged): what a clone would build."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    tree = tracked_tree(tmp_path_factory.mktemp("tree"))
    # No build isolation: the build backend (setuptools) is already in this venv, and isolation would fetch it.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(tree)], check=True, capture_output=True, text=True, timeout=300)
    [built] = out.glob("delayq-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh virtualenv holding the wheel; the dependencies come from this venv's site-packages, read-only.

    A .pth line adds this venv's site-packages after the fresh one's, and Python runs no
    .pth file found on a path added that way, so the editable install's finder stays out.
    """
    env_dir = tmp_path_factory.mktemp("venv") / "fresh"
    venv.create(env_dir, with_pip=False)
    fresh_site = Path(subprocess.run([str(env_dir / "bin" / "python"), "-c",
                                      "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     check=True, capture_output=True, text=True).stdout.strip())
    (fresh_site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"), "install", "--no-deps",
                    "-q", str(wheel)], check=True, capture_output=True, text=True, timeout=300)
    return env_dir


def run(env_dir: Path, *args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(env_dir / "bin" / "delayq"), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=env_dir, env={**os.environ, **(env or {})})


def test_the_wheel_holds_every_package_and_the_type_marker(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in ("delayq/cli.py", "delayq/wire.py", "delayq/py.typed", "delayq/commands/produce.py",
                   "delayq/proxy/producer.py", "delayq/delay_service/node.py", "delayq/store/time_index.py",
                   "delayq/election/recipes.py", "delayq/spark/job.py", "delayq/dev/stack.py",
                   # --follow's stateful step, compiled: the images have a Java runtime, not a compiler.
                   "delayq/spark/jvm/delayq-spark.jar"):
        assert module in names, f"{module} is not in {wheel.name}"
    assert not any(name.startswith("tests/") for name in names)
    assert "delayq/spark/jvm/build.py" not in names  # the jar's build is the tree's, not the product's


def test_the_installed_wheel_is_what_runs_not_the_source_tree(installed):
    where = subprocess.run([str(installed / "bin" / "python"), "-c", "import delayq; print(delayq.__file__)"],
                           capture_output=True, text=True, check=True, cwd=installed).stdout.strip()
    assert where.startswith(str(installed)), where


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_every_command_of_the_installed_wheel_prints_its_help(installed, command):
    done = run(installed, *([command] if command else []), "--help")
    assert done.returncode == 0, done.stderr
    assert "usage: delayq" in done.stdout
    assert "Traceback" not in done.stderr


def test_the_installed_wheel_creates_a_clusters_topics_and_reports_its_status(installed, settings):
    env = {"DELAYQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "DELAYQ_ZK_CONNECT": settings.zk_connect,
           "DELAYQ_CLUSTER": settings.cluster}
    init = run(installed, "init", "--partitions", "2", env=env)
    assert init.returncode == 0, init.stderr
    assert f"created {settings.buffer_topic}" in init.stdout
    status = run(installed, "status", "--json", env=env)
    assert status.returncode == 0, status.stderr
    assert settings.cluster in status.stdout


# What `pip install delayq` must not bring: the node's, the reconciliation's and the local stack's parts.
NOT_IN_THE_BARE_INSTALL = ("pyspark", "pandas", "matplotlib", "pyarrow", "rocksdict", "kazoo", "prometheus_client",
                           "redis")


@pytest.fixture(scope="module")
def bare(wheel, tmp_path_factory) -> Path:
    """A fresh virtualenv with ``pip install delayq`` (the wheel, its dependencies from PyPI at the locked versions)."""
    env_dir = tmp_path_factory.mktemp("venv-bare") / "bare"
    venv.create(env_dir, with_pip=True)
    done = subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           "-c", str(ROOT / "constraints.txt"), str(wheel)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        pytest.fail(f"pip install of the bare wheel failed (exit {done.returncode}): {done.stderr.strip()[-1500:]}",
                    pytrace=False)
    return env_dir


def test_the_bare_install_is_the_producer_side_only(bare):
    check = "import importlib.util, json, sys; print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m)]))"
    found = subprocess.run([str(bare / "bin" / "python"), "-c", check, *NOT_IN_THE_BARE_INSTALL], capture_output=True,
                           text=True, check=True, cwd=bare)
    assert json.loads(found.stdout) == [], f"pip install delayq brought {found.stdout.strip()}"


@pytest.mark.parametrize(("command", "extra"), [("node", "node"), ("status", "node"), ("init", "node"),
                                                ("reconcile", "reconcile"), ("dev", "dev"), ("bench", "dev")])
def test_a_command_of_a_missing_extra_says_in_one_line_which_to_install(bare, command, extra):
    done = run(bare, command, *(["up"] if command == "dev" else []))
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert f"needs delayq's {extra!r} extra" in line and f"pip install 'delayq[{extra}]'" in line, line


def test_the_bare_install_produces_delays_and_cancels_on_the_real_stack(bare, settings, names):
    """The library and the CLI of `pip install delayq` write what a node reads; lookup needs nodes' URLs or kazoo."""
    ensure_topics(settings)
    target = names.topic("target")
    env = {"DELAYQ_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "DELAYQ_ZK_CONNECT": settings.zk_connect,
           "DELAYQ_CLUSTER": settings.cluster}
    script = ("import delayq, sys\n"
              "p = delayq.Producer({'bootstrap.servers': sys.argv[1], 'delayq.cluster': sys.argv[2]})\n"
              "i = p.produce(sys.argv[3], b'from the library', key=b'k', delay=3600)\n"
              "p.flush(30)\n"
              "print(i)\n")
    produced = subprocess.run([str(bare / "bin" / "python"), "-c", script, settings.bootstrap_servers,
                               settings.cluster, target], capture_output=True, text=True, timeout=120, cwd=bare,
                              env={**os.environ, **env})
    assert produced.returncode == 0, produced.stderr
    library_id = produced.stdout.strip().splitlines()[-1]
    cli = run(bare, "produce", "--topic", target, "--delay", "1h", "from the cli", env=env)
    assert cli.returncode == 0, cli.stderr
    cli_id = re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}", cli.stdout).group(0)
    cancelled = run(bare, "cancel", cli_id, env=env)
    assert cancelled.returncode == 0, cancelled.stderr

    records = read_topic(settings.bootstrap_servers, settings.buffer_topic, expect=3, timeout_s=30)
    parsed = [wire.parse_buffer_record(r.key(), r.value(), r.headers(), r.timestamp()[1], partition=r.partition(),
                                       partitions=settings.buffer_partitions) for r in records]
    assert sorted((p.delay_id, p.op) for p in parsed) == sorted(
        [(library_id, wire.OP_PUT), (cli_id, wire.OP_PUT), (cli_id, wire.OP_CANCEL)])
    assert {p.envelope.topic for p in parsed if p.envelope is not None} == {target}

    lookup = run(bare, "get", library_id, env=env)
    assert lookup.returncode == 2 and "pip install 'delayq[zookeeper]', or name the nodes with DELAYQ_LOOKUP_URLS" \
        in lookup.stderr, lookup.stderr
