"""Debian packages unpacked without root (delayq.dev.debian), and the tools fetched so: kcat, Chromium.

apt itself is a stand-in here (no network, no package lists); the packages it "downloads" are
real .deb files built by dpkg-deb, unpacked by the real code path.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from delayq.dev import chromium, debian, kcat
from delayq.dev.debian import Apt, DebianError, Tool, Wanted, ensure_tools, packages_to_fetch, parse_depends

CHROMIUM_DEPENDS = """chromium
  Depends: libasound2
  Depends: libc6
  Depends: libdouble-conversion3
 |Depends: libgtk-3-0
  Depends: <xdg-desktop-portal-backend>
    xdg-desktop-portal-gnome
    xdg-desktop-portal-gtk
  Depends: chromium-common
chromium-driver
  PreDepends: dpkg
  Depends: libc6:any
  Depends: <only-virtual>
  Depends: chromium
"""


def test_apt_cache_depends_of_several_packages_is_read_as_groups_of_alternatives():
    assert parse_depends(CHROMIUM_DEPENDS) == {
        "chromium": [["libasound2"], ["libc6"], ["libdouble-conversion3"], ["libgtk-3-0"], ["chromium-common"]],
        "chromium-driver": [["dpkg"], ["libc6"], ["chromium"]],
    }


class StandInApt(Apt):
    """apt over a made-up archive: ``depends`` per package, what is installed, and .deb files to hand out."""

    def __init__(self, depends: dict[str, list[list[str]]], installed: set[str], debs: dict[str, Path] | None = None,
                 known: set[str] | None = None):
        self.graph, self.present, self.debs = depends, installed, debs or {}
        self.known = known if known is not None else set(depends) | set(self.debs)
        self.depends_calls: list[list[str]] = []
        self.downloads: list[str] = []
        self.updates = 0

    def knows(self, package: str) -> bool:
        return package in self.known

    def depends(self, packages):
        self.depends_calls.append(list(packages))
        return {package: self.graph.get(package, []) for package in packages}

    def installed(self, packages):
        return self.present & set(packages)

    def update(self) -> None:
        self.updates += 1

    def download(self, package: str, into: Path) -> subprocess.CompletedProcess:
        self.downloads.append(package)
        if package not in self.debs:
            return subprocess.CompletedProcess([], 100, "", f"E: Can't select candidate version for {package}\n")
        (into / self.debs[package].name).write_bytes(self.debs[package].read_bytes())
        return subprocess.CompletedProcess([], 0, "", "")


def test_the_closure_fetches_what_is_not_installed_once_asking_apt_a_level_at_a_time():
    apt = StandInApt({"tool": [["libc6"], ["libone"], ["libtwo"]], "helper": [["libone"]],
                      "libone": [["libdeep"], ["libc6"]], "libtwo": [["libdeep"]], "libdeep": []},
                     installed={"libc6"})

    wanted = packages_to_fetch(Wanted("Tool", ("tool", "helper"), fix="install it"), apt)

    assert wanted == ["tool", "helper", "libone", "libtwo", "libdeep"]
    assert apt.depends_calls == [["tool", "helper"], ["libone", "libtwo"], ["libdeep"]]


def test_an_alternative_already_there_is_enough_and_left_out_packages_are_never_fetched():
    apt = StandInApt({"tool": [["libgtk-3-0"], ["libnew", "libold"], ["x-helpers"]], "libnew": [], "libgtk-3-0": [],
                      "x-helpers": []}, installed={"libold"})

    wanted = packages_to_fetch(Wanted("Tool", ("tool",), fix="install it",
                                      leave_out=frozenset({"libgtk-3-0", "x-helpers"})), apt)

    assert wanted == ["tool"]


def test_a_package_apts_lists_lack_names_the_fix(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    apt = StandInApt({}, installed=set())

    with pytest.raises(DebianError) as caught:
        packages_to_fetch(Wanted("Tool", ("tool",), fix="install tool by hand"), apt)

    assert str(caught.value) == ("Tool is not on PATH and apt's package lists hold no tool package "
                                 "(run `sudo apt-get update`, or install tool by hand)")
    assert apt.updates == 0


def test_as_root_apts_lists_are_updated_once_before_giving_up(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    apt = StandInApt({}, installed=set())

    with pytest.raises(DebianError, match=r"hold no tool package \(check the APT sources, or install it\)"):
        packages_to_fetch(Wanted("Tool", ("tool",), fix="install it"), apt)

    assert apt.updates == 1


# -- a whole fetch, from .deb files built here -----------------------------------------------------


def build_deb(folder: Path, package: str, files: dict[str, str]) -> Path:
    """A .deb of ``package`` holding ``files`` (path -> text; under usr/bin they are executable)."""
    tree = folder / f"{package}-tree"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(f"Package: {package}\nVersion: 1.0\nArchitecture: all\n"
                                             f"Maintainer: delayq tests <tests@example.org>\nDescription: test\n")
    for path, text in files.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(text)
        if path.startswith("usr/bin/"):
            (tree / path).chmod(0o755)
    deb = folder / f"{package}_1.0_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(tree), str(deb)], check=True, capture_output=True)
    return deb


@pytest.fixture
def archive(tmp_path) -> StandInApt:
    """``hello`` (a program printing where it finds its libraries) depending on ``libhello`` (a library)."""
    debs = tmp_path / "archive"
    debs.mkdir()
    hello = build_deb(debs, "hello", {"usr/bin/hello": '#!/bin/sh\necho "hello from $LD_LIBRARY_PATH"\n'})
    lib = build_deb(debs, "libhello", {"usr/lib/x86_64-linux-gnu/libhello.so.1": "not really a library\n"})
    return StandInApt({"hello": [["libhello"]], "libhello": []}, installed=set(),
                      debs={"hello": hello, "libhello": lib})


def says_hello(path: Path) -> bool:
    try:
        out = subprocess.run([str(path)], capture_output=True, text=True, timeout=10).stdout
    except OSError:
        return False
    return out.startswith("hello from ") and "root/usr/lib/x86_64-linux-gnu" in out


HELLO = Wanted("hello", ("hello",), fix="install hello")
HELLO_TOOL = Tool("hello", "usr/bin/hello", says_hello)


def test_a_fetch_unpacks_each_package_and_wraps_the_tool_with_its_libraries(tmp_path, archive):
    said: list[str] = []
    target = tmp_path / "cache" / "hello"

    folder = ensure_tools(HELLO, target, [HELLO_TOOL], say=said.append, apt=archive)

    assert folder == target
    out = subprocess.run([str(target / "hello")], capture_output=True, text=True, check=True).stdout
    assert out.startswith(f"hello from {target}/root/usr/lib/x86_64-linux-gnu")
    assert (target / debian.MARKER).read_text().split() == ["hello_1.0_all.deb", "libhello_1.0_all.deb"]
    assert said[0].startswith("hello is not on PATH: fetching 2 Debian packages")
    assert [re.sub(r"\(\d+ kB\)", "(N kB)", line) for line in said[1:3]] == [
        "  [1/2] hello_1.0_all.deb (N kB)", "  [2/2] libhello_1.0_all.deb (N kB)"]
    assert said[3] == f"hello ready: {target / 'hello'}"
    assert sorted(p.name for p in target.parent.iterdir()) == [".hello.lock", "hello"], "scratch folders left behind"


def test_a_finished_fetch_is_used_again_and_an_unfinished_one_is_redone(tmp_path, archive):
    target = tmp_path / "hello"
    ensure_tools(HELLO, target, [HELLO_TOOL], say=lambda _: None, apt=archive)

    ensure_tools(HELLO, target, [HELLO_TOOL], say=lambda _: None, apt=archive)
    assert archive.downloads == ["hello", "libhello"]

    (target / debian.MARKER).unlink()
    ensure_tools(HELLO, target, [HELLO_TOOL], say=lambda _: None, apt=archive)
    assert archive.downloads == ["hello", "libhello"] * 2
    assert (target / debian.MARKER).is_file()


def test_the_wrapper_finds_its_tree_when_called_through_a_link(tmp_path, archive):
    target = ensure_tools(HELLO, tmp_path / "hello", [HELLO_TOOL], say=lambda _: None, apt=archive)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "hello").symlink_to(target / "hello")

    assert says_hello(tmp_path / "bin" / "hello")


def test_a_tool_the_packages_lack_fails_in_one_line_and_leaves_nothing(tmp_path, archive):
    target = tmp_path / "cache" / "hello"

    with pytest.raises(DebianError) as caught:
        ensure_tools(HELLO, target, [Tool("hello", "usr/bin/goodbye", says_hello)], say=lambda _: None, apt=archive)

    assert str(caught.value) == "Debian's hello packages hold no usr/bin/goodbye; install hello"
    assert [p.name for p in target.parent.iterdir()] == [".hello.lock"], "only the lock of the failed fetch is left"


def test_a_package_that_cannot_be_downloaded_says_what_apt_said(tmp_path, archive, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    del archive.debs["libhello"]

    with pytest.raises(DebianError) as caught:
        ensure_tools(HELLO, tmp_path / "hello", [HELLO_TOOL], say=lambda _: None, apt=archive)

    assert str(caught.value) == ("`apt-get download libhello` failed (exit 100): E: Can't select candidate version "
                                 "for libhello; install hello")


# -- Chromium and kcat on top --------------------------------------------------------------------


def test_the_major_version_is_read_from_what_chromium_and_chromedriver_print():
    assert chromium.major_version("Chromium 156.0.8078.108 built on Debian GNU/Linux 12 (bookworm)") == 156
    assert chromium.major_version("ChromeDriver 156.0.8078.108 (730482a9-refs/branch-heads/8078@{#2244})") == 156
    assert chromium.major_version("Google Chrome 131.0.6778.85 ") == 131
    assert chromium.major_version("no version here") is None


def fake_program(folder: Path, name: str, version: str) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\necho '{version}'\n")
    path.chmod(0o755)
    return path


def test_a_chromium_and_chromedriver_on_path_of_one_major_version_are_used(tmp_path, monkeypatch):
    browser = fake_program(tmp_path / "bin", "chromium", "Chromium 156.0.8078.108 built on Debian")
    driver = fake_program(tmp_path / "bin", "chromedriver", "ChromeDriver 156.0.8078.108 (abc)")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setattr(chromium, "ensure_tools", lambda *args, **kwargs: pytest.fail("fetched all the same"))

    assert chromium.ensure_chromium(say=lambda _: None) == (browser, driver)


def test_a_chromedriver_on_path_of_another_version_makes_it_fetch_the_pair(tmp_path, monkeypatch):
    fake_program(tmp_path / "bin", "chromium", "Chromium 156.0.8078.108 built on Debian")
    fake_program(tmp_path / "bin", "chromedriver", "ChromeDriver 150.0.7871.100 (abc)")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("DELAYQ_CACHE_DIR", str(tmp_path / "cache"))
    asked: list[tuple[Wanted, Path, list[str]]] = []

    def fetched(wanted, target, tools, say):
        asked.append((wanted, target, [tool.binary for tool in tools]))
        return target
    monkeypatch.setattr(chromium, "ensure_tools", fetched)

    browser, driver = chromium.ensure_chromium(say=lambda _: None)

    assert (browser, driver) == (tmp_path / "cache" / "chromium" / "chromium",
                                 tmp_path / "cache" / "chromium" / "chromedriver")
    [(wanted, _, binaries)] = asked
    assert wanted.packages == ("chromium", "chromium-driver")
    assert binaries == ["usr/lib/chromium/chromium", "usr/bin/chromedriver"]


def test_a_failed_fetch_is_each_tools_own_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    monkeypatch.delenv(kcat.ENV_OVERRIDE, raising=False)

    def fails(*args, **kwargs):
        raise DebianError("no apt-get here")
    monkeypatch.setattr(chromium, "ensure_tools", fails)
    monkeypatch.setattr(kcat, "ensure_tools", fails)

    with pytest.raises(chromium.ChromiumError, match=r"^no apt-get here$"):
        chromium.ensure_chromium(say=lambda _: None)
    with pytest.raises(kcat.KcatError, match=r"^no apt-get here$"):
        kcat.ensure_kcat(say=lambda _: None)
