"""The package list in pyproject.toml is the tree: a package folder left out would be missing from the wheel."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def setuptools_config() -> dict:
    return pyproject()["tool"]["setuptools"]


def packages_in_the_tree(config: dict) -> set[str]:
    """Every folder with an __init__.py under a mapped package folder, by its import name."""
    found = set()
    for name, folder in config["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *relative.parts]))
    return found


def test_every_package_folder_in_the_tree_is_listed_and_every_listed_package_exists():
    config = setuptools_config()
    listed = set(config["packages"])
    in_tree = packages_in_the_tree(config)
    assert in_tree - listed == set(), f"package folders pyproject.toml leaves out of the wheel: {in_tree - listed}"
    assert listed - in_tree == set(), f"packages pyproject.toml lists but the tree does not have: {listed - in_tree}"


def test_every_top_level_part_is_mapped_to_its_folder():
    config = setuptools_config()
    for part in ("proxy", "store", "election", "delay_service", "spark", "dev", "demo", "bench"):
        assert config["package-dir"][f"delayq.{part}"] == part


def test_package_data_names_files_that_exist():
    config = setuptools_config()
    for package, patterns in config.get("package-data", {}).items():
        folder = ROOT / config["package-dir"].get(package, package.replace(".", "/"))
        for pattern in patterns:
            assert list(folder.glob(pattern)), f"package-data {package}: {pattern} matches nothing in {folder}"


def test_the_version_has_one_home_which_the_wheel_reads():
    project = pyproject()["project"]
    assert "version" not in project, "the version lives in delayq/__init__.py only"
    assert "version" in project["dynamic"]
    assert setuptools_config()["dynamic"]["version"] == {"attr": "delayq.__version__"}


def test_the_release_record_ships_with_the_package():
    assert "releases.toml" in setuptools_config()["package-data"]["delayq"]  # delayq.releases reads it installed
