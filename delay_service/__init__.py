"""delayq.delay_service: the node (ingest on every node, delivery on the master, HTTP).

Public surface::

    from delayq.delay_service import Node, MemberProcesses, ensure_topics, ensure_shards
    from delayq.delay_service import cluster_status, kafka_status
    from delayq.delay_service import required_acls, apply_acls   # the Kafka ACLs of each role

Nodes as child processes, for tests, bench and the demo, are scaffolding: ``delayq.testing``.
The names load on first use, so a command that only needs ``ensure_topics`` (or only
``--help``) does not load RocksDB, kazoo and prometheus_client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .acls import AclLine, apply_acls, required_acls
    from .layout import ensure_shards
    from .members import MemberProcesses, die_with_parent
    from .node import Node
    from .status import cluster_status, kafka_status
    from .topics import TRANSACTION_STATE_TOPIC, TopicCheck, coordinator_partition, ensure_topics, java_string_hash

_HOMES = {"AclLine": ".acls", "apply_acls": ".acls", "required_acls": ".acls", "Node": ".node",
          "cluster_status": ".status", "kafka_status": ".status", "TopicCheck": ".topics", "ensure_topics": ".topics",
          "TRANSACTION_STATE_TOPIC": ".topics", "coordinator_partition": ".topics", "java_string_hash": ".topics",
          "ensure_shards": ".layout", "MemberProcesses": ".members", "die_with_parent": ".members"}
__all__ = ["TRANSACTION_STATE_TOPIC", "AclLine", "MemberProcesses", "Node", "TopicCheck", "apply_acls",
           "cluster_status", "coordinator_partition", "die_with_parent", "ensure_shards", "ensure_topics",
           "java_string_hash", "kafka_status", "required_acls"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home, __name__), name)
