"""The table of feature levels (delayq/features.py): each level, the release that introduced it, what it adds."""

from __future__ import annotations

import pytest

from delayq import features, wire
from delayq.releases import Release, releases

# Every frame option a put could carry in 0.1.0 (commit 8f62a6c; docs/DESIGN.md, "Wire format"): level 1.
OPTIONS_OF_0_1_0 = {"partition", "partitioner", "value=null", "restores", "every", "multiplier", "cron", "tz", "times",
                    "until", "occurrence", "follows", "cutoff", "attempt"}


def test_levels_are_numbered_from_1_without_a_gap_and_this_code_speaks_up_to_the_last_one_level_2():
    assert [level.level for level in features.LEVELS] == list(range(1, len(features.LEVELS) + 1))
    assert features.SUPPORTED_LEVEL == features.LEVELS[-1].level == 2


def test_a_cluster_with_no_level_recorded_speaks_level_1_the_wire_and_store_of_0_1_0():
    assert features.UNRECORDED_LEVEL == 1
    first = features.feature_level(1)
    assert first.release == "0.1.0" and features.introduced_by(1) == "0.1.0"
    assert set(first.frame_options) == OPTIONS_OF_0_1_0
    assert "stored form 4" in first.adds and "delayq-time-index-4" in first.adds


def test_level_2_is_0_2_0s_and_adds_the_options_level_and_expires():
    second = features.feature_level(2)
    assert (second.release, second.frame_options) == ("0.2.0", ("level", "expires"))
    assert "level=N" in second.adds and "expires=" in second.adds


def test_each_levels_store_format_is_one_the_store_opens_and_the_newest_level_has_the_newest_format():
    from delayq.store import NEWEST_FORMAT, OLDEST_FORMAT

    formats = [level.store_format for level in features.LEVELS]
    assert formats == [4, 5] and formats == sorted(formats)
    assert formats[0] == OLDEST_FORMAT and formats[-1] == NEWEST_FORMAT, (
        "a node must open the store of every level it speaks, and migrate each to the next in place")
    assert "store format 5" in features.feature_level(2).adds


def test_each_level_was_introduced_by_a_recorded_release_no_earlier_than_the_level_before_it():
    recorded = {release.version for release in releases()}
    assert {level.release for level in features.LEVELS} <= recorded
    numbers = [Release(level.release).number for level in features.LEVELS]
    assert numbers == sorted(numbers)


def test_every_frame_option_the_wire_knows_belongs_to_exactly_one_level():
    known = {getattr(wire, name) for name in dir(wire) if name.endswith("_OPTION")}
    named = [option for level in features.LEVELS for option in level.frame_options]
    assert len(named) == len(set(named)), "an option is introduced once"
    assert known <= set(named), f"options of delayq/wire.py that no level names: {sorted(known - set(named))}"


def test_a_level_this_code_does_not_know_is_refused_in_one_line_naming_the_levels_it_knows():
    with pytest.raises(ValueError, match=r"^feature level 3 is not one delayq .* knows \(levels 1 to 2\)"):
        features.introduced_by(3)
    with pytest.raises(ValueError, match="feature level 0 is not one"):
        features.feature_level(0)
