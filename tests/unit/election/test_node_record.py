"""A node's registration (election/records.py, NodeRecord) as JSON: what this version writes and what older nodes wrote."""

from __future__ import annotations

import json

import delayq
from delayq.election import NodeRecord, Role
from delayq.features import SUPPORTED_LEVEL

# A registration exactly as a node of 0.1.0 wrote it (commit 8f62a6c): no version field.
RECORD_OF_0_1_0 = {"node_id": "node-old", "role": "standby", "http": "http://old:8081", "host": "old", "lag": 0,
                   "pending": 4, "epoch": 2, "updated_at_ms": 1_764_048_000_000, "shards": [0, 1], "ready": [0, 1],
                   "masters": []}


def test_a_record_carries_the_version_of_the_code_that_wrote_it_through_json():
    record = NodeRecord("node-a", Role.MASTER, http="http://a:8081", lag=0, pending=3, epoch=5, shards=(0,),
                        ready=(0,), masters=(0,))
    assert record.version == delayq.__version__
    assert json.loads(record.to_json())["version"] == delayq.__version__
    assert NodeRecord.from_json(record.to_json()) == record
    assert record.as_dict()["version"] == delayq.__version__


def test_another_nodes_version_is_read_as_it_wrote_it():
    written = NodeRecord("node-b", Role.STANDBY, version="0.3.1")
    assert NodeRecord.from_json(written.to_json()) == written


def test_a_record_of_0_1_0_without_a_version_parses_with_version_none():
    record = NodeRecord.from_json(json.dumps(RECORD_OF_0_1_0).encode())
    assert record is not None
    assert record.version is None
    assert (record.node_id, record.role, record.pending, record.shards) == ("node-old", Role.STANDBY, 4, (0, 1))
    assert record.as_dict()["version"] is None


def test_a_version_that_is_not_a_string_makes_the_record_unreadable_not_a_crash():
    assert NodeRecord.from_json(json.dumps({**RECORD_OF_0_1_0, "version": 2}).encode()) is None


def test_a_record_says_the_highest_feature_level_of_the_code_that_wrote_it():
    record = NodeRecord("node-a", Role.STANDBY)
    assert record.feature_level == SUPPORTED_LEVEL == record.highest_level
    assert json.loads(record.to_json())["feature_level"] == SUPPORTED_LEVEL
    assert NodeRecord.from_json(record.to_json()) == record
    assert NodeRecord.from_json(NodeRecord("node-b", Role.STANDBY, feature_level=7).to_json()).highest_level == 7


def test_a_record_of_0_1_0_has_no_feature_level_which_means_level_1():
    record = NodeRecord.from_json(json.dumps(RECORD_OF_0_1_0).encode())
    assert record is not None
    assert record.feature_level is None and record.highest_level == 1
    assert record.as_dict()["feature_level"] is None


def test_a_feature_level_that_is_not_a_level_makes_the_record_unreadable_not_a_crash():
    for level in ("2", 2.0, True, 0, -1, [2]):
        assert NodeRecord.from_json(json.dumps({**RECORD_OF_0_1_0, "feature_level": level}).encode()) is None, level


def test_a_record_says_the_oldest_store_format_the_node_holds_and_0_1_0s_says_none():
    record = NodeRecord.from_json(NodeRecord("node-a", Role.STANDBY, store_format=4).to_json())
    assert record is not None and record.store_format == 4 and record.as_dict()["store_format"] == 4
    assert NodeRecord.from_json(json.dumps(RECORD_OF_0_1_0).encode()).store_format is None
    for bad in (0, "5", True, 4.5):
        assert NodeRecord.from_json(json.dumps({**RECORD_OF_0_1_0, "store_format": bad}).encode()) is None, bad


def test_a_member_process_says_its_group_and_a_record_without_one_is_a_node_of_its_own():
    record = NodeRecord.from_json(NodeRecord("box-1", Role.STANDBY, group="box").to_json())
    assert record is not None and record.group == "box" and record.as_dict()["group"] == "box"
    assert NodeRecord.from_json(json.dumps(RECORD_OF_0_1_0).encode()).group is None
    assert NodeRecord.from_json(json.dumps({**RECORD_OF_0_1_0, "group": 7}).encode()) is None
