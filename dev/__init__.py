"""delayq.dev: the embedded local stack (real Apache Kafka in KRaft mode and real ZooKeeper).

Public surface::

    from delayq.dev import DevStack, StackError, recorded_ports
"""

from .runtime import KAFKA_VERSION, ZOOKEEPER_VERSION, StackError, cache_dir
from .stack import DevStack, Ports, ServiceStatus, default_state_dir, recorded_ports

__all__ = [
    "KAFKA_VERSION",
    "ZOOKEEPER_VERSION",
    "DevStack",
    "Ports",
    "ServiceStatus",
    "StackError",
    "cache_dir",
    "default_state_dir",
    "recorded_ports",
]
