"""delayq.dev: the embedded local stack (real Apache Kafka in KRaft mode and real ZooKeeper).

Public surface::

    from delayq.dev import DevStack, StackError
"""

from .runtime import KAFKA_VERSION, ZOOKEEPER_VERSION, StackError, cache_dir
from .stack import DevStack, ServiceStatus, default_state_dir

__all__ = [
    "DevStack",
    "KAFKA_VERSION",
    "ServiceStatus",
    "StackError",
    "ZOOKEEPER_VERSION",
    "cache_dir",
    "default_state_dir",
]
