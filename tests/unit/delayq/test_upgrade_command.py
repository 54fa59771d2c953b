"""`delayq upgrade status` and `delayq upgrade finalize`, the real commands over a stand-in ZooKeeper (no server).

The cluster t-upgrade has a node of this version and one of 0.1.0 registered, or only the new one;
what finalize writes is read back from the stand-in's znodes.
"""

from __future__ import annotations

import json

import pytest
from kazoo.exceptions import BadVersionError, NodeExistsError
from support.stand_ins import zookeeper

import delayq
import delayq.election
from delayq.cli import main
from delayq.election import FeatureRecord, NodeRecord, Role
from delayq.features import SUPPORTED_LEVEL

ROOT = "/delayq/t-upgrade"
PATH = f"{ROOT}/features"
NEW = NodeRecord("node-new", Role.MASTER, store_format=4)
# As a node of 0.1.0 writes its registration: without version and feature_level.
OLD = json.dumps({"node_id": "node-old", "role": "standby", "epoch": 0, "shards": [], "ready": [],
                  "masters": []}).encode()


@pytest.fixture
def znodes() -> dict[str, bytes]:
    """The znodes of cluster t-upgrade: node-new registered (tests add more)."""
    return {f"{ROOT}/nodes/node-new": NEW.to_json()}


@pytest.fixture(autouse=True)
def client(znodes, monkeypatch):
    """The stand-in ZooKeeper every command of a test connects to."""
    stand_in = zookeeper(znodes)
    monkeypatch.setenv("DELAYQ_CLUSTER", "t-upgrade")
    monkeypatch.setattr(delayq.election, "connect_for", lambda settings, *, timeout_s: stand_in)
    return stand_in


def test_upgrade_status_json_lists_the_level_each_node_and_what_finalize_would_do(znodes, capsys):
    znodes[f"{ROOT}/nodes/node-old"] = OLD
    assert main(["upgrade", "status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status == {
        "cluster": "t-upgrade",
        "features": {"level": 1, "record": None, "problem": None,
                                  "text": "feature level 1 (none recorded: a cluster that ran delayq 0.1.0)"},
        "supported_level": SUPPORTED_LEVEL,
        "nodes": [{"node_id": "node-new", "version": delayq.__version__, "highest_level": SUPPORTED_LEVEL,
                   "store_format": 4},
                  {"node_id": "node-old", "version": None, "highest_level": 1, "store_format": None}],
        "finalize": {"action": "refused", "level": 2, "text": status["finalize"]["text"], "adds": []},
    }
    assert "node-old (delayq 0.1.0 or older, up to level 1)" in status["finalize"]["text"]


def test_upgrade_status_says_what_the_raise_would_add_and_each_nodes_store_format(znodes, capsys):
    znodes[f"{ROOT}/nodes/node-old"] = OLD
    assert main(["upgrade", "status"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "│ node-new │ " in out and "│ 2 │ 4 │" in out and "│ 1 │ - │" in out, out
    del znodes[f"{ROOT}/nodes/node-old"]
    assert main(["upgrade", "status"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "cluster t-upgrade: feature level 1 (none recorded: a cluster that ran delayq 0.1.0)" in out
    assert "finalize raises cluster t-upgrade from feature level 1 to 2: every registered node speaks it (node-new)" in out
    assert "level 2 (delayq 0.2.0): frame option level=N" in out


def test_finalize_records_the_level_with_this_version_when_every_node_speaks_it(znodes, client, capsys):
    assert main(["upgrade", "finalize"]) == 0
    record = FeatureRecord.from_json(znodes[PATH])
    assert record is not None and (record.level, record.finalized_by) == (SUPPORTED_LEVEL, delayq.__version__)
    assert "cluster t-upgrade: feature level raised from 1 to 2" in capsys.readouterr().out
    assert main(["upgrade", "finalize"]) == 0, "nothing to do is no error"
    assert "nothing to do" in capsys.readouterr().out


def test_finalize_over_a_record_writes_with_the_version_it_read(znodes, client):
    znodes[PATH] = FeatureRecord(1, "0.1.0", 1_767_225_600_000, "0.2.0").to_json()
    assert main(["upgrade", "finalize", "--level", "2"]) == 0
    client.set.assert_called_once_with(PATH, znodes[PATH], version=0)


def test_a_refused_finalize_is_one_line_exit_2_and_writes_nothing(znodes, client, capsys):
    znodes[f"{ROOT}/nodes/node-old"] = OLD
    assert main(["upgrade", "finalize"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("delayq upgrade: cannot finalize cluster t-upgrade at feature level 2: ") and err.count("\n") == 1
    assert "node-old (delayq 0.1.0 or older, up to level 1)" in err
    assert PATH not in znodes


@pytest.mark.parametrize("raced", [NodeExistsError, BadVersionError])
def test_a_finalize_that_loses_the_compare_and_set_to_another_is_one_line(znodes, client, capsys, raced):
    if raced is BadVersionError:
        znodes[PATH] = FeatureRecord(1, "0.1.0", 1_767_225_600_000, "0.2.0").to_json()
        client.set.side_effect = raced(PATH)
    else:
        client.create.side_effect = raced(PATH)
    assert main(["upgrade", "finalize"]) == 2
    err = capsys.readouterr().err
    assert err == (f"delayq upgrade: the feature level at {PATH} changed while this finalize ran (another `delayq "
                   "upgrade finalize`?): run `delayq upgrade status`, then finalize again if it is still needed\n")


def test_a_level_below_1_is_refused_by_the_argument_parser(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["upgrade", "finalize", "--level", "0"])
    assert exited.value.code == 2
    assert "--level: a feature level is a whole number from 1, not '0'" in capsys.readouterr().err
