"""The soak's view of a replicated Kafka cluster (``delayq soak --brokers N``): who leads what, who is in sync.

Pure helpers the broker faults (:mod:`.soak_faults`) choose and judge by, and the two things
they need from Kafka beyond signals:

* :func:`read_cluster`: the brokers registered now and, for the topics the soak cares about
  (the buffer, the target topics, ``__transaction_state``), each partition's leader,
  replicas and in-sync replicas, through a fresh AdminClient bootstrapped from the brokers
  that are up (a paused broker still accepts connections and would hold the request).
* :class:`LeaderMover`: a partition reassignment that reorders each partition's replicas
  (same brokers, the one after its leader preferred), then a preferred-leader election.
  confluent-kafka has the election but no reassignment, and the cached Kafka jars hold
  the broker and kafka-clients but not Kafka's tools, so the reassignment is a few lines
  of Java on kafka-clients' ``Admin``, compiled once per run (a JDK's ``javac``).

A partition *serves* (:func:`serving_problems`) when an acknowledged write (acks=all) can
be made now: it has a leader that is up, at least ``min.insync.replicas`` replicas in sync,
and no broker that is down among them (the leader waits for every in-sync replica, and
keeps a dead or frozen one there until the controllers fence it, ``broker.session.timeout.ms``
after its last heartbeat). While one does not, the cluster is *out*: the soak counts that
time as an outage, like a killed single broker's, and judges stalls beyond it.

A transactional id's coordinator is the leader of the ``__transaction_state`` partition
Kafka files it under: ``abs(hashCode) % partitions`` with Java's ``String.hashCode``
(:func:`coordinator_partition`; there is no public API that names it).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import ElectionType, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from delayq.delay_service import TRANSACTION_STATE_TOPIC, coordinator_partition


@dataclass(frozen=True)
class PartitionState:
    """One partition as the metadata has it: its leader (-1: none), replicas (in assignment order) and ISR."""

    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    @property
    def name(self) -> str:
        return f"{self.topic}/{self.partition}"


@dataclass(frozen=True)
class ClusterState:
    """The brokers registered (unfenced) now, and the watched topics' partitions."""

    brokers: frozenset[int]
    partitions: tuple[PartitionState, ...]
    missing_topics: tuple[str, ...] = ()

    def of(self, topic: str) -> list[PartitionState]:
        return [p for p in self.partitions if p.topic == topic]


def read_cluster(bootstrap: Iterable[str], topics: Iterable[str], timeout_s: float = 3.0) -> ClusterState:
    """The cluster as a fresh AdminClient bootstrapped from ``bootstrap`` (addresses) sees it.

    Raises:
        KafkaException: no broker answered within ``timeout_s``.
    """
    admin = AdminClient({"bootstrap.servers": ",".join(bootstrap),
                         "socket.timeout.ms": max(1000, int(timeout_s * 1000)), "log_level": 0})
    metadata = admin.list_topics(timeout=timeout_s)
    found: list[PartitionState] = []
    missing = []
    for topic in topics:
        described = metadata.topics.get(topic)
        if described is None or described.error is not None:
            missing.append(topic)
            continue
        found.extend(PartitionState(topic, p.id, p.leader, tuple(p.replicas), tuple(p.isrs))
                     for p in sorted(described.partitions.values(), key=lambda p: p.id))
    return ClusterState(frozenset(metadata.brokers), tuple(found), tuple(missing))


def min_insync_replicas(bootstrap: Iterable[str], topics: Iterable[str], timeout_s: float = 15.0) -> dict[str, int]:
    """Each topic's ``min.insync.replicas`` (``__transaction_state``'s is its ``transaction.state.log.min.isr``).

    Raises:
        KafkaException: Kafka did not answer.
    """
    from delayq.delay_service.topics import min_insync_replicas as of_topic

    admin = AdminClient({"bootstrap.servers": ",".join(bootstrap), "log_level": 0})
    return {topic: of_topic(admin, topic, timeout_s) for topic in topics}


def _ranges(numbers: Iterable[int]) -> str:
    return ",".join(str(n) for n in sorted(numbers))


def _by_topic(names: list[tuple[str, int]]) -> list[str]:
    grouped: dict[str, list[int]] = {}
    for topic, partition in names:
        grouped.setdefault(topic, []).append(partition)
    return [f"{topic}/{_ranges(partitions)}" for topic, partitions in grouped.items()]


def serving_problems(state: ClusterState, min_insync: Mapping[str, int], down: Collection[int]) -> list[str]:
    """Why some watched partitions cannot take an acknowledged write now (module docstring); empty if all can.

    ``down``: the brokers a fault has killed or stopped (the metadata keeps naming them until
    the controllers fence them). One line per cause, naming the partitions.
    """
    leaderless: list[tuple[str, int]] = []
    led_by_down: list[tuple[str, int]] = []
    waiting: list[tuple[str, int]] = []
    short: list[tuple[str, int]] = []
    for p in state.partitions:
        if p.leader < 0:
            leaderless.append((p.topic, p.partition))
        elif p.leader in down:
            led_by_down.append((p.topic, p.partition))
        elif len(p.isr) < min_insync.get(p.topic, 1):
            short.append((p.topic, p.partition))
        elif set(p.isr) & set(down):
            waiting.append((p.topic, p.partition))
    problems = []
    for what, names in (("no leader", leaderless), (f"led by a broker that is down ({_ranges(down)})", led_by_down),
                        ("fewer in-sync replicas than min.insync.replicas", short),
                        ("a broker that is down still in sync", waiting)):
        if names:
            problems.append(f"{what}: {' '.join(_by_topic(names))}")
    problems += [f"topic {topic} not in the metadata" for topic in state.missing_topics]
    return problems


def replication_problems(state: ClusterState, brokers: Collection[int]) -> list[str]:
    """What keeps the cluster from whole health: a broker of ``brokers`` not registered, a partition whose
    in-sync replicas are not all of its replicas (under-replicated), one without a leader; empty if none."""
    problems = []
    absent = sorted(set(brokers) - state.brokers)
    if absent:
        problems.append(f"broker{'s' if len(absent) > 1 else ''} {_ranges(absent)} not registered")
    under = [(p.topic, p.partition) for p in state.partitions if p.leader < 0 or set(p.isr) != set(p.replicas)]
    if under:
        problems.append(f"under-replicated: {' '.join(_by_topic(under))}")
    problems += [f"topic {topic} not in the metadata" for topic in state.missing_topics]
    return problems


def busiest_leader(partitions: Iterable[PartitionState]) -> int | None:
    """The broker leading the most of ``partitions`` (the lowest id of a tie); None if none has a leader."""
    counts = Counter(p.leader for p in partitions if p.leader >= 0)
    if not counts:
        return None
    return min(counts, key=lambda broker: (-counts[broker], broker))


def coordinator_of(state: ClusterState, transactional_id: str) -> int | None:
    """The broker coordinating ``transactional_id``'s transactions now (None: its partition has no leader)."""
    partitions = state.of(TRANSACTION_STATE_TOPIC)
    if not partitions:
        return None
    wanted = coordinator_partition(transactional_id, len(partitions))
    leader = next(p.leader for p in partitions if p.partition == wanted)
    return leader if leader >= 0 else None


def choose_broker(pick: float, state: ClusterState, buffer_topic: str, transactional_ids: list[str],
                  brokers: Collection[int], exclude: Collection[int] = ()) -> tuple[int, str]:
    """The broker a fault hits, drawn by ``pick`` (0 to 1), and why, as text.

    Picks in the first third take the leader of the most buffer partitions; in the second,
    the transaction coordinator of a shard master (``transactional_ids``, one per shard: the
    rest of the pick says which); in the last, any broker. A broker of ``exclude``, or a
    role no live broker has now (a partition without a leader), falls back to any broker.

    Raises:
        ValueError: every broker is excluded.
    """
    candidates = sorted(set(brokers) - set(exclude))
    if not candidates:
        raise ValueError("no broker left to choose")
    role = min(2, int(pick * 3))
    rest = min(0.999999, pick * 3 - role)  # 0 to 1: the choice within the role
    fallback = "drawn at random"
    if role == 0:
        buffer = state.of(buffer_topic)
        leader = busiest_leader(p for p in buffer if p.leader in candidates)
        if leader is not None:
            led = sum(1 for p in buffer if p.leader == leader)
            return leader, f"leader of {led} of the buffer's {len(buffer)} partitions"
        fallback += " (no buffer leader to choose)"
    elif role == 1 and transactional_ids:
        shard = int(rest * len(transactional_ids))
        transactional_id = transactional_ids[shard]
        coordinator = coordinator_of(state, transactional_id)
        if coordinator in candidates:
            partition = coordinator_partition(transactional_id, len(state.of(TRANSACTION_STATE_TOPIC)))
            return coordinator, (f"transaction coordinator of shard {shard}'s master ({transactional_id}: "
                                 f"{TRANSACTION_STATE_TOPIC}/{partition})")
        fallback += f" (shard {shard}'s coordinator {'is excluded' if coordinator is not None else 'unknown'})"
    return candidates[int(rest * len(candidates))], fallback


def led_elsewhere(replicas: tuple[int, ...], leader: int) -> tuple[int, ...]:
    """The replicas turned round so that the one after ``leader`` (in assignment order) comes first, the
    preferred leader, and ``leader`` last: a preferred election then moves the leadership (same brokers,
    nothing to copy). A partition without a leader among its replicas is turned one place."""
    start = replicas.index(leader) + 1 if leader in replicas else 1
    return replicas[start:] + replicas[:start]


# -- moving every leader -------------------------------------------------------------

JAVA_CLASS = "SoakReassign"
JAVA_SOURCE = """\
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewPartitionReassignment;
import org.apache.kafka.clients.admin.PartitionReassignment;
import org.apache.kafka.common.TopicPartition;

/** delayq soak: reassign partitions (args: bootstrap, then topic:partition:broker,broker,...), wait until done. */
public final class SoakReassign {
    private SoakReassign() {
    }

    public static void main(String[] args) throws Exception {
        Map<TopicPartition, Optional<NewPartitionReassignment>> wanted = new HashMap<>();
        for (int i = 1; i < args.length; i++) {
            String[] parts = args[i].split(":");
            List<Integer> replicas = new ArrayList<>();
            for (String broker : parts[2].split(",")) {
                replicas.add(Integer.valueOf(broker));
            }
            wanted.put(new TopicPartition(parts[0], Integer.parseInt(parts[1])),
                       Optional.of(new NewPartitionReassignment(replicas)));
        }
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        try (Admin admin = Admin.create(props)) {
            admin.alterPartitionReassignments(wanted).all().get(60, TimeUnit.SECONDS);
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
            while (true) {
                Map<TopicPartition, PartitionReassignment> ongoing =
                    admin.listPartitionReassignments(wanted.keySet()).reassignments().get(30, TimeUnit.SECONDS);
                if (ongoing.isEmpty()) {
                    break;
                }
                if (System.nanoTime() > deadline) {
                    System.out.println("still reassigning after 60 s: " + ongoing.keySet());
                    System.exit(3);
                }
                Thread.sleep(200);
            }
        }
        System.out.println("reassigned " + wanted.size() + " partitions");
    }
}
"""


class LeaderMoveError(RuntimeError):
    """The reassignment or the election failed; the message says which and what Kafka said."""


class LeaderMover:
    """Moves every leader of some topics to another of its replicas (module docstring).

    Args:
        folder: where the Java helper is written and compiled (:meth:`prepare`).
    """

    def __init__(self, folder: Path):
        self.folder = folder
        self.classpath: list[Path] | None = None

    def prepare(self) -> None:
        """Compile the Java helper (once).

        Raises:
            StackError: no javac, no kafka-clients jar, or the compiler refused it.
        """
        from delayq.dev.java_client import compile_java

        if self.classpath is not None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        source = self.folder / f"{JAVA_CLASS}.java"
        source.write_text(JAVA_SOURCE)
        self.classpath = compile_java(source, self.folder / "classes", say=lambda _text: None)

    def move(self, bootstrap: list[str], topics: list[str], timeout_s: float = 60.0) -> str:
        """Reorder the replicas of every partition of ``topics`` with more than one (:func:`led_elsewhere`),
        elect the preferred leaders, and wait until every one leads; return what moved, as text.

        Raises:
            LeaderMoveError: the reassignment, the election or the wait failed.
        """
        from delayq.dev.java_client import run_java

        self.prepare()
        assert self.classpath is not None
        began = time.monotonic()
        before = {p.name: p for p in read_cluster(bootstrap, topics, 10).partitions if len(p.replicas) > 1}
        wanted = {name: led_elsewhere(p.replicas, p.leader) for name, p in before.items()}
        if not wanted:
            raise LeaderMoveError(f"no partition of {', '.join(topics)} has more than one replica")
        args = [f"{p.topic}:{p.partition}:{','.join(map(str, wanted[name]))}" for name, p in before.items()]
        done = run_java(self.classpath, JAVA_CLASS, ",".join(bootstrap), *args, timeout_s=timeout_s)
        if done.returncode != 0:
            said = (done.stdout + done.stderr).strip().splitlines()
            raise LeaderMoveError(f"the reassignment failed (exit {done.returncode}): {' / '.join(said[-3:])}")
        reassigned = time.monotonic() - began
        deadline = time.monotonic() + timeout_s
        # The brokers' metadata follows the controllers' a moment later; the election wants the new order.
        state = self._wait(bootstrap, topics, deadline, lambda s: all(
            p.replicas == wanted[p.name] for p in s.partitions if p.name in wanted))
        admin = AdminClient({"bootstrap.servers": ",".join(bootstrap), "log_level": 0})
        partitions = [TopicPartition(p.topic, p.partition) for p in before.values()]
        try:
            # No timeouts passed: confluent-kafka 2.16's elect_leaders fails with any keyword argument
            # (SystemError "more argument specifiers than keyword list entries"); the default is 60 s.
            results = admin.elect_leaders(ElectionType.PREFERRED, partitions).result(70)
        except KafkaException as err:
            raise LeaderMoveError(f"the preferred-leader election failed: {err.args[0].str()}") from err
        refused = {f"{tp.topic}/{tp.partition}": str(err) for tp, err in results.items()
                   if err is not None and "ELECTION_NOT_NEEDED" not in str(err)}
        if refused:
            raise LeaderMoveError(f"the preferred-leader election was refused for {refused}")
        state = self._wait(bootstrap, topics, deadline, lambda s: all(
            p.leader == wanted[p.name][0] for p in s.partitions if p.name in wanted))
        moved = sum(1 for p in state.partitions if p.name in before and p.leader != before[p.name].leader)
        return (f"replicas of {len(wanted)} partitions reordered ({reassigned:.1f}s), preferred leaders "
                f"elected: {moved} of {len(wanted)} leaders moved, {time.monotonic() - began:.1f}s in all")

    @staticmethod
    def _wait(bootstrap: list[str], topics: list[str], deadline: float, done) -> ClusterState:
        while True:
            try:
                state = read_cluster(bootstrap, topics)
                if done(state):
                    return state
            except KafkaException:
                state = None
            if time.monotonic() >= deadline:
                raise LeaderMoveError("the metadata did not show the new replica order and leaders in time"
                                      + (f": {[(p.name, p.leader, p.replicas) for p in state.partitions]}"
                                         if state else ""))
            time.sleep(0.5)
