"""delayq: arbitrary-time delayed delivery for Apache Kafka.

Change ``from confluent_kafka import Producer`` to ``from delayq import Producer``
and ``produce(..., delay=30)`` holds a message for 30 seconds before it reaches
its topic. See docs/DESIGN.md for how.

The names below load on first use (PEP 562): ``import delayq`` alone, as every
``delayq`` command does, costs neither pydantic nor confluent-kafka, and no import
order inside the package matters.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The one home of delayq's version: pyproject.toml reads it from here (setuptools' attr), so a source
# tree and its wheel never disagree. A ".devN" version is the next release, not cut yet;
# delayq/releases.toml records each release's commit.
__version__ = "0.2.0.dev0"

if TYPE_CHECKING:
    # lookup from its own module: delayq.proxy.lookup is both that submodule and the function
    # delayq.proxy re-exports, which mypy confuses inside the import cycle delayq <-> delayq.proxy.
    from delayq.proxy import Cron, Every, Producer, RetryPolicy, cancel, retry_later
    from delayq.proxy.lookup import lookup
    from delayq.settings import Settings

_HOMES = {"Producer": "delayq.proxy", "cancel": "delayq.proxy", "lookup": "delayq.proxy",
          "Every": "delayq.proxy", "Cron": "delayq.proxy", "RetryPolicy": "delayq.proxy",
          "retry_later": "delayq.proxy", "Settings": "delayq.settings"}
__all__ = ["Cron", "Every", "Producer", "RetryPolicy", "Settings", "__version__", "cancel", "lookup", "retry_later"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'delayq' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
