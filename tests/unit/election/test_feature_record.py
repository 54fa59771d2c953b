"""The cluster's finalized feature level in ZooKeeper (``features``, election/records.py): the record and its reading."""

from __future__ import annotations

import json

import pytest

import delayq
from delayq.election import FeatureRecord, FinalizedLevel

PATH = "/delayq/orders/features"
RECORD = FeatureRecord(level=2, introduced_by="0.2.0", finalized_at_ms=1_767_225_600_000, finalized_by="0.2.0")


def test_a_record_goes_through_json_unchanged():
    assert json.loads(RECORD.to_json()) == {"level": 2, "introduced_by": "0.2.0", "finalized_at_ms": 1_767_225_600_000,
                                            "finalized_by": "0.2.0"}
    assert FeatureRecord.from_json(RECORD.to_json()) == RECORD


def test_the_record_this_code_writes_names_the_release_that_introduced_the_level_and_this_version(monkeypatch):
    record = FeatureRecord.of(2)
    assert (record.level, record.introduced_by, record.finalized_by) == (2, "0.2.0", delayq.__version__)
    assert record.finalized_at_ms > 1_700_000_000_000


def test_a_newer_versions_extra_fields_are_ignored():
    data = json.dumps({**json.loads(RECORD.to_json()), "something_new": [1]}).encode()
    assert FeatureRecord.from_json(data) == RECORD


@pytest.mark.parametrize("data", [b"", b"not json", b"[2]", b'{"level": 2}',
                                  json.dumps({**json.loads(RECORD.to_json()), "level": "2"}).encode(),
                                  json.dumps({**json.loads(RECORD.to_json()), "level": True}).encode(),
                                  json.dumps({**json.loads(RECORD.to_json()), "level": 0}).encode(),
                                  json.dumps({**json.loads(RECORD.to_json()), "finalized_by": None}).encode()])
def test_what_is_not_a_feature_record_is_none_never_a_crash(data):
    assert FeatureRecord.from_json(data) is None


def test_nothing_recorded_reads_as_level_1_the_level_of_a_cluster_that_ran_0_1_0():
    finalized = FinalizedLevel.of(PATH, None, None)
    assert (finalized.level, finalized.record, finalized.recorded, finalized.problem) == (1, None, False, None)
    assert finalized.describe() == "feature level 1 (none recorded: a cluster that ran delayq 0.1.0)"
    assert finalized.as_dict() == {"level": 1, "record": None, "problem": None, "text": finalized.describe()}


def test_a_record_reads_as_its_level_with_its_znode_version_for_the_next_compare_and_set():
    finalized = FinalizedLevel.of(PATH, RECORD.to_json(), 4)
    assert (finalized.level, finalized.record, finalized.znode_version, finalized.recorded) == (2, RECORD, 4, True)
    assert finalized.describe() == "feature level 2 (finalized by delayq 0.2.0 at 2026-01-01T00:00:00Z)"
    assert finalized.as_dict() == {"level": 2, "record": RECORD.as_dict(), "problem": None,
                                   "text": finalized.describe()}


def test_a_damaged_record_is_reported_in_one_line_with_its_path_its_bytes_and_the_fix_and_has_no_level():
    finalized = FinalizedLevel.of(PATH, b"garbage", 0)
    assert finalized.level is None and finalized.recorded
    assert finalized.problem is not None and "\n" not in finalized.problem
    assert finalized.problem.startswith(f"ZooKeeper node {PATH} does not hold a delayq feature record (b'garbage')")
    assert "delayq upgrade finalize" in finalized.problem
    assert finalized.describe() == finalized.problem
