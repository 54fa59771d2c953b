"""The job on a cluster without a cluster: which master, its check, and delayq's code shipped to the executors."""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile

import pytest

from delayq import Settings
from delayq.dev.spark import free_port
from delayq.errors import UsageError
from delayq.spark import ReconcileError
from delayq.spark.cli import add_arguments, chosen_master
from delayq.spark.session import check_master, is_local, master_addresses
from delayq.spark.shipping import code_zip, package_files


def parsed(*argv: str, **kinds) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, **kinds)
    return parser.parse_args(list(argv))


def test_delayq_reconcile_takes_its_master_from_the_setting_unless_given(monkeypatch):
    monkeypatch.setenv("DELAYQ_SPARK_MASTER", "spark://127.0.0.1:7077")
    settings = Settings()
    ours = {"default_master": None, "master_from_settings": True}

    assert chosen_master(parsed(**ours), settings) == "spark://127.0.0.1:7077"
    assert chosen_master(parsed("--master", "local[2]", **ours), settings) == "local[2]"
    # Under spark-submit: the master spark-submit was given, whatever the setting says.
    assert chosen_master(parsed(default_master=None), settings) is None


def test_a_standalone_url_names_each_master_and_any_other_master_none():
    assert master_addresses("spark://127.0.0.1:7077") == [("127.0.0.1", 7077)]
    assert master_addresses("spark://a:7077,b:7078") == [("a", 7077), ("b", 7078)]
    assert master_addresses("local[2]") == master_addresses("yarn") == []
    assert is_local("local") and is_local("local[*]") and not is_local("spark://a:1") and not is_local("yarn")


@pytest.mark.parametrize("master", ["spark://", "spark://host", "spark://host:port", "spark://:7077",
                                    "spark://host:70000"])
def test_a_malformed_standalone_url_is_refused_with_the_form_wanted(master):
    with pytest.raises(UsageError, match=r"spark://HOST:PORT"):
        master_addresses(master)


def test_a_dev_master_that_does_not_answer_says_to_start_the_dev_stacks_spark():
    master = f"spark://127.0.0.1:{free_port()}"

    with pytest.raises(ReconcileError) as caught:
        check_master(master)

    text = str(caught.value)
    assert text.startswith(f"the Spark master {master} does not answer") and "delayq dev up --spark" in text
    assert "\n" not in text


def test_the_shipped_code_is_delayqs_own_modules_and_the_job_package_without_caches():
    files = package_files()

    assert {"delayq/__init__.py", "delayq/wire.py", "delayq/spark/__init__.py", "delayq/spark/records.py"} <= set(files)
    assert not [name for name in files if "__pycache__" in name or name.endswith(".pyc")]
    assert not [name for name in files if name.startswith(("delayq/dev/", "delayq/commands/", "delayq/proxy/"))]


def test_the_same_code_is_zipped_once_under_a_name_of_its_contents(tmp_path):
    first = code_zip(tmp_path)
    made = first.stat().st_mtime_ns

    again = code_zip(tmp_path)

    assert again == first and again.stat().st_mtime_ns == made
    assert first.name.startswith("delayq-") and first.suffix == ".zip"
    with zipfile.ZipFile(first) as archive:
        assert set(archive.namelist()) == set(package_files())


def test_the_zip_alone_gives_an_executor_what_it_imports(tmp_path):
    # -S: no site-packages, so no installed delayq to fall back on; only the standard library and the zip. In a
    # folder of its own: the source tree's delayq/ must not be found as the current folder's.
    shipped = code_zip(tmp_path / "cache")
    script = ("import sys; sys.path.insert(1, sys.argv[1]); import delayq.spark.records, delayq.wire; "
              "print(delayq.wire.__file__)")

    result = subprocess.run([sys.executable, "-S", "-c", script, str(shipped)], capture_output=True, text=True,
                            timeout=60, check=False, cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{shipped}/delayq/wire.py"
