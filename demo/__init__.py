"""delayq.demo: the main job, end to end on the embedded stack (``delayq demo``, ``make demo``).

Public surface::

    from delayq.demo import DemoOptions, choose_stack, run_demo
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .options import DemoOptions

if TYPE_CHECKING:
    from .story import StackChoice, choose_stack, run_demo

__all__ = ["DemoOptions", "StackChoice", "choose_stack", "run_demo"]


def __getattr__(name: str) -> Any:
    if name in ("StackChoice", "choose_stack", "run_demo"):  # the story loads Kafka clients and rich's live view
        return getattr(importlib.import_module(".story", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
