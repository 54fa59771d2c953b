"""A virtualenv with a recorded release of delayq installed, built once from this clone's history and cached.

Test and bench scaffolding (a rolling-upgrade test starts nodes of the previous release from it), never
imported by the runtime packages. The environment is built from ``git archive <commit>`` of the release's
recorded commit, so it needs the clone's history of that commit, not a registry's copy of delayq.

Example:
    >>> env = ensure_release_env(previous_release())
    >>> subprocess.Popen([str(env.python), "-m", "delayq", "node"], env=...)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from delayq.errors import DelayqError
from delayq.paths import cache_dir
from delayq.releases import Release

# Written last, once pip has installed the release: its absence marks an environment whose build stopped.
BUILT_MARK = "delayq-release.json"


class ReleaseEnvError(DelayqError):
    """A release's environment could not be built; the message says which step failed and the fix."""


@dataclass(frozen=True, slots=True)
class ReleaseEnv:
    """A built environment of one release: where it is and its python."""

    release: Release
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"


def env_key(release: Release) -> str:
    """The cache key of a release's environment: its version and commit, so a re-recorded commit builds anew."""
    if release.commit is None:
        raise ReleaseEnvError(f"release {release.version} has no recorded commit: only a cut release can be built")
    return f"{release.version}-{release.commit[:12]}"


def env_path(release: Release, cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "releases" / env_key(release)


def is_built(root: Path, release: Release) -> bool:
    """Whether ``root`` holds a finished environment of ``release``: its python, and the mark naming this commit.

    Anything else (no mark, a mark of another commit or unreadable, no python) is a half-built or
    damaged environment, which :func:`ensure_release_env` builds again.
    """
    try:
        mark = json.loads((root / BUILT_MARK).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(mark, dict) and mark.get("commit") == release.commit
            and mark.get("version") == release.version and (root / "bin" / "python").exists())


def ensure_release_env(release: Release, *, repo: Path | None = None, cache: Path | None = None,
                       console: Console | None = None) -> ReleaseEnv:
    """The release's environment, built first if it is missing or unfinished.

    Builders running at once do not meet: each builds in a folder of its own beside the target and
    renames it into place; the first rename wins and the others drop theirs.

    Raises:
        ReleaseEnvError: a step failed (the clone lacks the commit, venv or pip failed), in one line.
    """
    root = env_path(release, cache)
    env = ReleaseEnv(release, root)
    if is_built(root, release):
        return env
    console = console or Console(stderr=True)
    repo = repo or Path(__file__).resolve().parent.parent
    root.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        with console.status(f"building an environment of delayq {release.version} ({env_key(release)})") as status:
            source = building / "source"
            _export(repo, release, source)
            status.update(f"delayq {release.version}: creating the virtualenv")
            venv = building / "env"
            _run([sys.executable, "-m", "venv", str(venv)], f"python -m venv for delayq {release.version}",
                 "check that this python has the venv module")
            status.update(f"delayq {release.version}: pip install of commit {release.commit}")
            _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(source)],
                 f"pip install of delayq {release.version}", "check that PyPI is reachable, then run again")
            (venv / BUILT_MARK).write_text(json.dumps({"version": release.version, "commit": release.commit}),
                                           encoding="utf-8")
        move_into_place(venv, root, release)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    console.print(f"delayq {release.version} environment ready: {root}")
    return env


def _export(repo: Path, release: Release, into: Path) -> None:
    """The release commit's tree in ``into`` (``git archive``, so the working tree is not touched)."""
    assert release.commit is not None, "env_key refused an uncut release"
    try:
        archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", release.commit],
                                 capture_output=True, check=False)
    except FileNotFoundError:
        raise ReleaseEnvError("git is not installed: it is needed to export a release's commit") from None
    if archive.returncode != 0:
        raise ReleaseEnvError(
            f"{repo} has no commit {release.commit} (release {release.version}): "
            "run `git fetch --tags --unshallow` in it, then run again")
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)


def _run(command: list[str], what: str, fix: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ReleaseEnvError(f"{what} failed ({last}): {fix}")


def move_into_place(venv: Path, root: Path, release: Release) -> None:
    """Rename the finished ``venv`` to ``root``; a damaged ``root`` is moved aside first, a finished one kept."""
    if root.exists() and not is_built(root, release):
        shutil.rmtree(root, ignore_errors=True)
    try:
        os.rename(venv, root)
    except OSError:
        if not is_built(root, release):  # not another builder's finished one: a real failure
            raise ReleaseEnvError(f"could not move the environment of delayq {release.version} to {root}: "
                                  "check the cache folder's permissions (DELAYQ_CACHE_DIR)") from None
