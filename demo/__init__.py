"""delayq.demo: the main job, end to end on the embedded stack (``delayq demo``, ``make demo``).

Public surface::

    from delayq.demo import DemoOptions, run_demo
"""

from .story import DemoOptions, run_demo

__all__ = ["DemoOptions", "run_demo"]
