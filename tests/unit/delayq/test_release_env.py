"""The release environment's pure parts: where it lives, its key, and when it is built again (no git, no pip)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from delayq.release_env import BUILT_MARK, ReleaseEnvError, env_key, env_path, is_built, move_into_place
from delayq.releases import Release

RELEASE = Release("0.1.0", "8f62a6ccc226f43f8db61eebe2b8316e8415e110", datetime.date(2026, 11, 25))


def finished(root: Path, release: Release = RELEASE) -> Path:
    """An environment as a build leaves it: its python and the mark of ``release``."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").write_text("")
    (root / BUILT_MARK).write_text(json.dumps({"version": release.version, "commit": release.commit}))
    return root


def test_the_key_names_the_version_and_commit_and_the_path_is_under_the_cache(tmp_path, monkeypatch):
    assert env_key(RELEASE) == "0.1.0-8f62a6ccc226"
    monkeypatch.setenv("DELAYQ_CACHE_DIR", str(tmp_path))
    assert env_path(RELEASE) == tmp_path / "releases" / "0.1.0-8f62a6ccc226"
    moved = Release("0.1.0", "0" * 40, RELEASE.date)
    assert env_path(moved) != env_path(RELEASE), "a re-recorded commit must build anew"


def test_a_release_without_a_commit_is_refused_in_one_line():
    with pytest.raises(ReleaseEnvError, match=r"^release 0\.2\.0 has no recorded commit: only a cut release"):
        env_key(Release("0.2.0"))


def test_only_a_finished_environment_of_the_same_commit_counts_as_built(tmp_path):
    assert not is_built(tmp_path / "absent", RELEASE)
    half = tmp_path / "half"
    (half / "bin").mkdir(parents=True)
    (half / "bin" / "python").write_text("")
    assert not is_built(half, RELEASE), "pip stopped before the mark: build again"
    (half / BUILT_MARK).write_text("{not json")
    assert not is_built(half, RELEASE)
    assert is_built(finished(tmp_path / "done"), RELEASE)
    assert not is_built(finished(tmp_path / "other", Release("0.1.0", "1" * 40)), RELEASE)
    no_python = finished(tmp_path / "no-python")
    (no_python / "bin" / "python").unlink()
    assert not is_built(no_python, RELEASE)


def test_a_finished_build_replaces_a_damaged_one_and_leaves_another_builders_finished_one(tmp_path):
    root = tmp_path / "0.1.0-8f62a6ccc226"
    root.mkdir()
    (root / "junk").write_text("")  # a build that stopped half way, renamed by nobody
    move_into_place(finished(tmp_path / "mine"), root, RELEASE)
    assert is_built(root, RELEASE) and not (root / "junk").exists()

    theirs = (root / BUILT_MARK).read_text()
    move_into_place(finished(tmp_path / "second"), root, RELEASE)  # a second builder finishing later
    assert is_built(root, RELEASE) and (root / BUILT_MARK).read_text() == theirs
