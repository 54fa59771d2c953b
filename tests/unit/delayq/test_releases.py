"""The release record (delayq/releases.toml, read by delayq.releases) and `delayq --version`."""

from __future__ import annotations

import datetime
import re
import subprocess
from pathlib import Path

import pytest

import delayq
from delayq.cli import main
from delayq.releases import Release, ReleaseRecordError, parse_releases, previous_release, releases

ROOT = Path(__file__).resolve().parents[3]


def test_the_record_lists_0_1_0_at_the_full_sha_of_8f62a6c_on_the_day_of_that_commit():
    first = next(release for release in releases() if release.version == "0.1.0")
    assert re.fullmatch(r"[0-9a-f]{40}", first.commit or ""), first
    assert first.commit.startswith("8f62a6c")  # issue 30: the main its users run today is 0.1.0
    assert first.date == datetime.date(2026, 11, 25)


def test_the_package_version_is_the_newest_release_listed_a_dev_version_while_it_is_not_cut():
    newest = releases()[0]
    if newest.released:
        assert delayq.__version__ == newest.version
    else:
        assert delayq.__version__ == f"{newest.version}.dev0", "the version being worked on is X.dev0 until X is cut"


def test_the_helm_charts_version_and_app_version_are_the_release_being_worked_on():
    import yaml

    chart = yaml.safe_load((ROOT / "helm" / "delayq" / "Chart.yaml").read_text())
    newest = releases()[0].version
    assert (chart["version"], chart["appVersion"]) == (newest, newest), (
        "helm upgrade --set image.tag is optional: the chart's appVersion must be the image of this release")


def test_the_previous_release_is_the_newest_one_cut():
    assert previous_release() == next(release for release in releases() if release.released)
    assert previous_release().commit is not None


def test_each_released_commit_is_in_this_clones_history_on_its_recorded_day():
    # The tests run from a clone (the rolling-upgrade test builds the previous release from its history).
    assert (ROOT / ".git").exists(), f"{ROOT} is not a git clone: run the tests from a clone of the repository"

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)

    shallow = git("rev-parse", "--is-shallow-repository").stdout.strip() == "true"
    for release in releases():
        if not release.released:
            continue
        found = git("cat-file", "-e", f"{release.commit}^{{commit}}")
        assert found.returncode == 0, (
            f"release {release.version}'s commit {release.commit} is not in this clone's history"
            + (" (a shallow clone: `git fetch --unshallow` brings the history)" if shallow else
               ": delayq/releases.toml names a commit this repository never had"))
        day = git("show", "-s", "--format=%cs", release.commit).stdout.strip()
        assert day == str(release.date), f"release {release.version}: recorded {release.date}, committed {day}"


def test_versions_order_by_number_not_by_text():
    assert Release("0.10.0").number > Release("0.9.1").number


@pytest.mark.parametrize(("record", "problem"), [
    ('[[release]]\nversion = "0.1.0"\ncommit = "8f62a6c"\ndate = 2026-11-25\n', "commit must be the full 40-hex sha"),
    ('[[release]]\nversion = "0.1.0"\ncommit = "' + "a" * 40 + '"\n', "date must be the day of the release commit"),
    ('[[release]]\nversion = "0.1.0"\ncommit = "' + "a" * 40 + '"\ndate = "2026-11-25"\n',
     "date must be the day of the release commit"),
    ('[[release]]\nversion = "0.1"\n', "version must be MAJOR.MINOR.PATCH"),
    ('[[release]]\nversion = "0.2.0"\ncomit = "x"\n', "unknown keys comit"),
    ('[[release]]\nversion = "0.1.0"\ncommit = "' + "a" * 40 + '"\ndate = 2026-11-25\n'
     '[[release]]\nversion = "0.2.0"\n', "newest first"),
    ('[[release]]\nversion = "0.3.0"\n[[release]]\nversion = "0.2.0"\n', "only the newest release may lack a commit"),
    ('[[release]]\nversion = "0.2.0"\n[[release]]\nversion = "0.2.0"\n', "lists a version twice"),
    ("", "no [[release]] entries"),
    ("[[release]\n", "is not TOML"),
])
def test_a_malformed_record_is_refused_in_one_line_naming_the_problem(record, problem):
    with pytest.raises(ReleaseRecordError) as refused:
        parse_releases(record)
    assert problem in str(refused.value)
    assert "\n" not in str(refused.value)


def test_delayq_version_prints_the_package_version_and_exits_0(capsys):
    with pytest.raises(SystemExit) as exited:  # argparse's version action ends parsing, as --help does
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"delayq {delayq.__version__}\n"
