"""delayq: arbitrary-time delayed delivery for Apache Kafka.

Change ``from confluent_kafka import Producer`` to ``from delayq import Producer``
and ``produce(..., delay=30)`` holds a message for 30 seconds before it reaches
its topic. See docs/DESIGN.md for how.
"""

__version__ = "0.1.0"

from .settings import Settings  # noqa: E402

# After Settings: the proxy imports it from here.
from delayq.proxy import Producer, cancel, lookup  # noqa: E402

__all__ = ["Producer", "Settings", "__version__", "cancel", "lookup"]
