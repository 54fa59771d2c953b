"""Building the Go example: what a user without go, or with a broken module, is told."""

from __future__ import annotations

import pytest

from delayq.dev import StackError
from delayq.dev.go_client import build_go


def test_without_go_on_path_the_build_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StackError, match=r"go \(1\.26 or newer\) is needed .* install it"):
        build_go(tmp_path, tmp_path / "out", say=lambda _text: None)


def test_a_module_the_compiler_refuses_fails_with_its_output(tmp_path):
    (tmp_path / "go.mod").write_text("module broken.example\n\ngo 1.22\n")
    (tmp_path / "main.go").write_text("package main\n\nfunc main() { undefinedName() }\n")
    with pytest.raises(StackError, match=r"go build in .* failed \(exit 1\):(.|\n)*undefined: undefinedName"):
        build_go(tmp_path, tmp_path / "out", say=lambda _text: None)
    assert not (tmp_path / "out").exists()
