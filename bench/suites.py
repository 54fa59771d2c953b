"""What `delayq bench --help` and `delayq soak --help` list, light to import: suites and fault kinds, in order."""

SUITE_TEXT: dict[str, str] = {
    "ingest": "msg/s from the buffer into one node's store",
    "delivery": "msg/s from the master to Kafka (and the Redis poller's)",
    "lateness": "p50/p99/max lateness at 1k, 5k, 20k msg/s falling due (and the peer's)",
    "expiry": "100,000 messages due in the same ms: time until all delivered (and the peer's)",
    "limits": "the same expiry to a topic with a dispatch limit of 20,000/s: time until all delivered, and the "
              "lateness of another topic's messages falling due meanwhile",
    "security": "delivery msg/s on the secured stack (SASL_SSL, SCRAM-SHA-512, ACLs; the node as its own "
                "principal) beside the plain stack's, alternating runs",
    "failover": "delivery gap after SIGKILL and after SIGTERM of the master",
    "scale": "6 shards on 1, 2, 3 nodes, R=0 and R=1: delivery msg/s (all due at once on a settled cluster) and "
             "ingest msg/s (a backlog written while the readers are paused, timed from their resume until every "
             "holder stored its shards' messages); the Redis poller's delivery beside",
    "produce": "delayed produce() cost against plain confluent-kafka produce(), and the asyncio producer's against "
               "confluent-kafka's AIOProducer",
    "capacity": "10M pending in one node: disk and RSS per message (and Redis memory)",
    "rebuild": "a wiped node with 10M pending: time until ready",
    "reconcile": "the Spark reconciliation of 1M delayed messages",
    "capacity-100m": "100M pending in one node: RSS and disk per message (only with --only: ~40 min, ~60 GB disk)",
}

# Suites a plain `delayq bench` leaves out: they run only when --only names them.
OPT_IN_SUITES = frozenset({"capacity-100m"})

# The chaos soak's fault kinds (bench/soak_faults.py), each at least once per run.
FAULT_TEXT: dict[str, str] = {
    "master_kill": "SIGKILL a shard's master, restart it",
    "master_pause": "SIGSTOP a shard's master past the session timeout, SIGCONT",
    "standby_term": "SIGTERM a standby, restart it",
    "standby_wipe": "stop a standby, wipe its data, restart it",
    "kafka_kill": "SIGKILL the Kafka broker, restart it",
    "zookeeper_kill": "SIGKILL ZooKeeper, restart it",
    "kafka_pause": "SIGSTOP the Kafka broker 6-10 s (3-8 s in runs up to 5 min: a long GC pause), SIGCONT",
    "zookeeper_pause": "SIGSTOP ZooKeeper 8-12 s (5-8 s in runs up to 5 min), SIGCONT",
}
