"""The embedded stack explains a missing Java or a failed download in one sentence."""

from __future__ import annotations

import pytest

from delayq.dev import StackError
from delayq.dev.runtime import Artifact, Runtime, ensure_runtime, java_executable


def test_missing_java_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no java anywhere

    with pytest.raises(StackError, match=r"Java 17 or newer is needed .* install it"):
        java_executable()


def test_failed_download_names_what_failed(monkeypatch, tmp_path):
    monkeypatch.setenv("DELAYQ_CACHE_DIR", str(tmp_path))
    missing = Runtime("nothing", "0", (Artifact("org.apache.kafka", "kafka_2.13", "0.0.0-does-not-exist"),))

    with pytest.raises(StackError, match=r"downloading nothing 0 from Maven Central failed"):
        ensure_runtime(missing, say=lambda _: None)
    assert not (tmp_path / "nothing-0" / ".complete").exists()
