"""delayq's releases as ``delayq/releases.toml`` records them: each version and the commit it was cut from.

The record ships with the package and every clone carries it, so whatever needs a release's code (a
rolling-upgrade test builds the previous release from its commit) finds that commit without git tags,
which a CI clone may not fetch.

Example:
    >>> release = previous_release()  # the newest release cut: what this tree upgrades from
    >>> subprocess.run(["git", "worktree", "add", "--detach", folder, release.commit], check=True)
"""

from __future__ import annotations

import datetime
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from delayq.errors import DelayqError

RECORD = "releases.toml"
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")  # a full sha: an abbreviated one may become ambiguous as history grows
_KEYS = {"version", "commit", "date"}


class ReleaseRecordError(DelayqError):
    """``delayq/releases.toml`` is not a valid release record; the message names the entry and what is wrong."""


class UnknownRelease(DelayqError, ValueError):
    """A release asked for by version is not in the record, or is not cut; the message lists those that are."""


@dataclass(frozen=True, slots=True)
class Release:
    """One release: its version, and the commit (full sha) and date it was cut at, both None until it is cut."""

    version: str
    commit: str | None = None
    date: datetime.date | None = None

    @property
    def released(self) -> bool:
        return self.commit is not None

    @property
    def number(self) -> tuple[int, int, int]:
        """(major, minor, patch), for ordering: "0.10.0" is newer than "0.9.0"."""
        found = _VERSION.match(self.version)
        assert found is not None, "versions are checked when the record is read"
        major, minor, patch = map(int, found.groups())
        return major, minor, patch


def releases() -> tuple[Release, ...]:
    """Every release the record lists, newest first.

    Raises:
        ReleaseRecordError: the record is malformed (a fault of this tree, named entry by entry).
    """
    return parse_releases(resources.files("delayq").joinpath(RECORD).read_text(encoding="utf-8"))


def previous_release() -> Release:
    """The newest release that has been cut: what the version being worked on upgrades from.

    Raises:
        ReleaseRecordError: the record is malformed, or lists no release that has been cut.
    """
    for release in releases():
        if release.released:
            return release
    raise ReleaseRecordError(f"{RECORD} lists no release with a commit")


def find_release(version: str) -> Release:
    """The release ``version`` as the record lists it, cut (it has a commit to build from).

    Raises:
        UnknownRelease: no such release, or it is not cut yet.
        ReleaseRecordError: the record is malformed.
    """
    listed = releases()
    cut = ", ".join(release.version for release in listed if release.released)
    for release in listed:
        if release.version == version:
            if not release.released:
                raise UnknownRelease(f"release {version} is not cut yet (no commit in {RECORD}): give one that is: "
                                     f"{cut}")
            return release
    raise UnknownRelease(f"no release {version!r} in {RECORD}: give one of {cut}")


def parse_releases(text: str) -> tuple[Release, ...]:
    """The releases in the TOML ``text`` (``[[release]]`` tables), newest first; see :func:`releases`."""
    try:
        entries = tomllib.loads(text).get("release", [])
    except tomllib.TOMLDecodeError as err:
        raise ReleaseRecordError(f"{RECORD} is not TOML: {err}") from None
    if not isinstance(entries, list) or not entries:
        raise ReleaseRecordError(f"{RECORD} has no [[release]] entries")
    found = [_release(number, entry) for number, entry in enumerate(entries, start=1)]
    newest_first = sorted(found, key=lambda release: release.number, reverse=True)
    if found != newest_first:
        raise ReleaseRecordError(f"{RECORD} must list releases newest first, not "
                                 f"{', '.join(r.version for r in found)}")
    if len({release.version for release in found}) != len(found):
        raise ReleaseRecordError(f"{RECORD} lists a version twice: {', '.join(r.version for r in found)}")
    # Only the version being worked on may be uncut, and nothing is released after it.
    uncut = [release.version for release in found[1:] if not release.released]
    if uncut:
        raise ReleaseRecordError(f"{RECORD}: only the newest release may lack a commit, not {', '.join(uncut)}")
    return tuple(found)


def _release(number: int, entry: Any) -> Release:
    if not isinstance(entry, dict):
        raise ReleaseRecordError(f"{RECORD}: release {number} is not a table")
    version = entry.get("version")
    where = f"{RECORD}: release {number} ({version!r})"
    if not isinstance(version, str) or not _VERSION.match(version):
        raise ReleaseRecordError(f"{where}: version must be MAJOR.MINOR.PATCH")
    unknown = set(entry) - _KEYS
    if unknown:
        raise ReleaseRecordError(f"{where}: unknown keys {', '.join(sorted(unknown))} (known: version, commit, date)")
    commit, date = entry.get("commit"), entry.get("date")
    if commit is None and date is None:
        return Release(version)
    if not isinstance(commit, str) or not _COMMIT.match(commit):
        raise ReleaseRecordError(f"{where}: commit must be the full 40-hex sha of the release, got {commit!r}")
    # A TOML local date (2026-11-25), not a date-time and not a string.
    if not isinstance(date, datetime.date) or isinstance(date, datetime.datetime):
        raise ReleaseRecordError(f"{where}: date must be the day of the release commit (YYYY-MM-DD), got {date!r}")
    return Release(version, commit, date)
