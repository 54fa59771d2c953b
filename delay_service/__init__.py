"""delayq.delay_service: the node (ingest on every node, delivery on the master, HTTP).

Public surface::

    from delayq.delay_service import Node, ensure_topics, cluster_status
    from delayq.delay_service import LocalCluster    # nodes as child processes (demo, bench, tests)
"""

from .local import LocalCluster, NodeError, NodeProcess
from .node import Node
from .status import cluster_status
from .topics import TopicCheck, ensure_topics

__all__ = ["LocalCluster", "Node", "NodeError", "NodeProcess", "TopicCheck", "cluster_status", "ensure_topics"]
