"""Build small Go Kafka clients (docs/examples/go) to run against the embedded stack.

``go build`` fetches the example's modules (franz-go) from the Go module proxy the first time, into Go's own
module cache (``go env GOMODCACHE``), and reuses them afterwards; the build itself takes seconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .runtime import StackError

BUILD_TIMEOUT_S = 300  # a first build downloads the modules


def go_executable() -> str:
    """The ``go`` command on PATH.

    Raises:
        StackError: there is none; the message says what to install.
    """
    go = shutil.which("go")
    if go is None:
        raise StackError("go (1.26 or newer) is needed to build the Go example and none was found on PATH: install "
                         "it (https://go.dev/doc/install) or put its bin folder on PATH")
    return go


def build_go(module: Path, out: Path, say=print) -> Path:
    """Build the Go module in ``module`` into the executable ``out``; return ``out``.

    Its go.mod and go.sum are used as they are (``-mod=readonly``): a build never rewrites the example.

    Raises:
        StackError: no go, the modules could not be fetched, or the compiler refused the source (its output is
            in the message).
    """
    go = go_executable()
    out.parent.mkdir(parents=True, exist_ok=True)
    say(f"building the Go example {module} (its modules are fetched once)")
    try:
        result = subprocess.run([go, "build", "-mod=readonly", "-o", str(out), "."], cwd=module, capture_output=True,
                                text=True, timeout=BUILD_TIMEOUT_S, env={**os.environ, "CGO_ENABLED": "0"})
    except subprocess.TimeoutExpired as err:
        raise StackError(f"go build in {module} took over {BUILD_TIMEOUT_S} s (fetching its modules?): check that "
                         "the Go module proxy (go env GOPROXY) answers") from err
    if result.returncode != 0:
        raise StackError(f"go build in {module} failed (exit {result.returncode}):\n{result.stdout}{result.stderr}")
    return out
