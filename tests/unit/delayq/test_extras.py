"""Which command needs which pip extra (delayq/extras.py), against pyproject.toml and the CLI. Pure: no servers."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest

from delayq import extras
from delayq.cli import build_parser

ROOT = Path(__file__).resolve().parents[3]
# The distribution that brings each module delayq imports (pyproject.toml names distributions).
DISTRIBUTIONS = {"kazoo": "kazoo", "rocksdict": "rocksdict", "prometheus_client": "prometheus-client",
                 "pyspark": "pyspark", "pyarrow": "pyarrow", "pandas": "pandas", "matplotlib": "matplotlib",
                 "redis": "redis", "quixstreams": "quixstreams", "flask": "flask"}


def declared(extra: str, optional: dict[str, list[str]]) -> set[str]:
    """The distributions an extra brings, its own ``delayq[...]`` ones included."""
    found = set()
    for requirement in optional[extra]:
        name = requirement.split(">")[0].split("=")[0].split("[")[0].strip()
        if name == "delayq":
            for inner in requirement.split("[")[1].rstrip("]").split(","):
                found |= declared(inner.strip(), optional)
        else:
            found.add(name)
    return found


def test_each_extra_checks_the_modules_of_the_distributions_pyproject_gives_it():
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra, modules in extras.EXTRA_MODULES.items():
        assert {DISTRIBUTIONS[m] for m in modules} == declared(extra, optional), extra


def test_every_command_named_is_a_command_and_the_producer_commands_need_no_extra():
    commands = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    assert set(extras.COMMAND_EXTRAS) <= commands
    assert {"produce", "cancel", "get"} <= commands - set(extras.COMMAND_EXTRAS)


def test_a_missing_extra_is_one_line_naming_the_modules_and_the_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *rest: None if name in ("rocksdict", "kazoo") else real(name, *rest))
    with pytest.raises(extras.MissingExtra) as caught:
        extras.require_for_command("node")
    assert str(caught.value) == ("this command needs delayq's 'node' extra (kazoo and rocksdict are not installed): "
                                 "pip install 'delayq[node]'")
    assert isinstance(caught.value, ImportError)
    with pytest.raises(extras.MissingExtra, match=r"\(kazoo is not installed\): pip install 'delayq\[zookeeper\]', "
                                                  "or set X$"):
        extras.require("zookeeper", "it", instead="or set X")
    extras.require_for_command("produce")  # needs none
