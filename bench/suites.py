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
    "members": "one node as 1 and as 2 member processes (DELAYQ_PROCESSES) on 2 shards, R=0: delivery msg/s of "
               "messages all due at once, their ratio, and CPU per delivered message over all the node's processes; "
               "the Redis poller's delivery and CPU per message beside",
    "idle": "a settled cluster of 3 nodes, 6 shards, R=1, with nothing due: the cores its processes use (nodes, "
            "readers) and the cores it costs the broker beyond the broker's own idle",
    "produce": "delayed produce() cost against plain confluent-kafka produce(), and the asyncio producer's against "
               "confluent-kafka's AIOProducer",
    "capacity": "10M pending in one node: disk and RSS per message (and Redis memory)",
    "rebuild": "a wiped node with 10M pending: time until ready, reading the buffer alone and copying the store of a "
               "node that holds them",
    "reconcile": "the Spark reconciliation of 1M delayed messages",
    "capacity-100m": "100M pending in one node: RSS and disk per message (only with --only: ~40 min, ~60 GB disk)",
    "follow": "`delayq reconcile --follow` under 20,000 msg/s of live healthy traffic (puts, deliveries, dones), "
              "triggers 10 s and 5 s: lag p50/p95/max and slope (keeps up or not), CPU per record, no finding "
              "(only with --only: ~10 min a run)",
    "console": "the web console's pages with 10M pending and 100k dead letters: median, p95, max per page against "
               "300 ms, and the console index's build in records/s (only with --only: ~21 min; "
               "BENCH_CONSOLE_PENDING=200k for a smaller run)",
}

# Suites a plain `delayq bench` leaves out: they run only when --only names them.
OPT_IN_SUITES = frozenset({"capacity-100m", "follow", "console"})

# The chaos soak's fault kinds (bench/soak_faults.py), each at least once per run. On one broker (the default)
# every kind but the replicated cluster's; with --brokers N (2 or more) those instead of the two that hit "the"
# broker (ONE_BROKER_FAULTS), and two_brokers_down from three brokers on; upgrade_roll only with --upgrade-from.
FAULT_TEXT: dict[str, str] = {
    "master_kill": "SIGKILL a shard's master, restart it",
    "master_pause": "SIGSTOP a shard's master past the session timeout, SIGCONT",
    "standby_term": "SIGTERM a standby, restart it",
    "standby_wipe": "stop a standby, wipe its data, restart it",
    "kafka_kill": "SIGKILL the Kafka broker, restart it (one broker only)",
    "zookeeper_kill": "SIGKILL ZooKeeper, restart it",
    "kafka_pause": "SIGSTOP the Kafka broker 6-10 s (3-8 s in runs up to 5 min: a long GC pause), SIGCONT "
                   "(one broker only)",
    "zookeeper_pause": "SIGSTOP ZooKeeper 8-12 s (5-8 s in runs up to 5 min), SIGCONT",
    "broker_kill": "(2+ brokers) SIGKILL a broker (the busiest buffer leader, a shard master's transaction "
                   "coordinator, or any), restart it after 5-15 s (3-8 s in runs up to 5 min)",
    "broker_pause": "(2+ brokers) SIGSTOP a broker (chosen as for broker_kill) 10-14 s, past its 9 s session, SIGCONT",
    "rolling_restart": "(2+ brokers) SIGTERM each broker in turn, restart it, wait for every partition's full ISR",
    "leader_move": "(2+ brokers) move every buffer and target leader: the replica after it preferred (a "
                   "reassignment), a preferred election (needs javac)",
    "two_brokers_down": "(3+ brokers) SIGKILL two brokers at once (ISR below min ISR 2), restart one after "
                        "5-15 s (3-8 s), then the other",
    "upgrade_roll": "(--upgrade-from) once, as the first or second fault: replace the nodes of the release, one at "
                    "a time, by this code on their data (each ready, shards settled, before the next), then "
                    "`delayq upgrade finalize`; puts with expire_after= (level 2) from then on",
}
# The kinds of a run started with --upgrade-from <release> only, beside those of its brokers.
UPGRADE_FAULTS = ("upgrade_roll",)
# The kinds that act on the one broker of a one-broker stack; a replicated one has the broker_* kinds instead.
ONE_BROKER_FAULTS = ("kafka_kill", "kafka_pause")
# The replicated cluster's kinds (--brokers 2 or more), and the least brokers each needs.
BROKER_FAULTS: dict[str, int] = {"broker_kill": 2, "broker_pause": 2, "rolling_restart": 2, "leader_move": 2,
                                 "two_brokers_down": 3}
