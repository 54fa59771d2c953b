"""How delayq's topics and the dev stack are replicated: the rules that need no Kafka."""

from __future__ import annotations

from unittest import mock

import pytest
from confluent_kafka.admin import AdminClient

from delayq import Settings
from delayq.delay_service.topics import EndOffsets, Replication, TopicFacts, replication_for, replication_warnings
from delayq.dev import DevStack, Ports, StackError
from delayq.dev.stack import internal_replication, kafka_nodes
from delayq.errors import ConfigurationError


@pytest.mark.parametrize("brokers, expected", [(1, Replication(1, 1)), (2, Replication(2, 1)),
                                                (3, Replication(3, 2)), (5, Replication(3, 2))])
def test_by_default_the_topics_get_min_brokers_3_replicas_and_one_less_in_sync(brokers, expected):
    assert replication_for(Settings(), brokers) == expected


def test_the_settings_choose_the_replication_the_cluster_can_hold():
    assert replication_for(Settings(buffer_replication_factor=2), 3) == Replication(2, 1)
    assert replication_for(Settings(buffer_replication_factor=3, buffer_min_insync_replicas=3), 3) == Replication(3, 3)


def test_a_replication_factor_above_the_broker_count_is_refused_in_one_line():
    with pytest.raises(ConfigurationError) as caught:
        replication_for(Settings(buffer_replication_factor=3, bootstrap_servers="k:9092"), 1)
    line = str(caught.value)
    assert "\n" not in line
    assert "replication factor 3 is more than the 1 broker of the Kafka cluster at k:9092" in line
    assert "--replication-factor" in line and "DELAYQ_BUFFER_REPLICATION_FACTOR" in line


def test_a_min_insync_above_the_replication_factor_is_refused_in_one_line():
    with pytest.raises(ConfigurationError, match=r"min.insync.replicas 3 is more than its replication factor 2: no "
                                                 r"write could ever be acknowledged.*--min-insync-replicas"):
        replication_for(Settings(buffer_replication_factor=2, buffer_min_insync_replicas=3), 3)


def facts(factor: int, min_insync: int) -> TopicFacts:
    return TopicFacts(partitions=12, replication_factor=factor, min_insync_replicas=min_insync,
                      cleanup_policy="compact", min_compaction_lag_ms=604800000)


def test_a_buffer_at_one_replica_on_a_multi_broker_cluster_is_warned_of_in_one_line():
    [warning] = replication_warnings("b", facts(1, 1), brokers=3)
    assert "\n" not in warning and "b has one replica on a cluster of 3 brokers" in warning
    assert "kafka-reassign-partitions" in warning


def test_min_insync_one_on_three_brokers_is_warned_of_with_the_command_that_fixes_it():
    [warning] = replication_warnings("b", facts(3, 1), brokers=3)
    assert "min.insync.replicas 1" in warning and "--add-config min.insync.replicas=2" in warning


@pytest.mark.parametrize("brokers, factor, min_insync", [(1, 1, 1), (2, 2, 1), (3, 3, 2), (3, 2, 2)])
def test_no_warning_where_the_replication_suits_the_cluster(brokers, factor, min_insync):
    assert replication_warnings("b", facts(factor, min_insync), brokers) == []


def test_what_init_reports_of_a_topic_names_every_fact():
    assert facts(3, 2).describe() == ("12 partitions, replication factor 3, min.insync.replicas 2, cleanup.policy "
                                      "compact, min.compaction.lag.ms 604800000")


# -- the dev stack's replicated layout -------------------------------------------------------------


def test_one_broker_is_its_own_controller_on_the_next_port():
    [node] = kafka_nodes(Ports(9092, 2181))
    assert (node.name, node.node_id, node.roles, node.broker_port, node.controller_port) == (
        "kafka", 1, "broker,controller", 9092, 9093)


def test_three_brokers_take_consecutive_ports_and_three_dedicated_controllers_the_next_ones():
    nodes = kafka_nodes(Ports(9092, 2181, brokers=3))
    assert [(n.name, n.node_id, n.roles, n.address) for n in nodes] == [
        ("controller-1", 101, "controller", "127.0.0.1:9095"),
        ("controller-2", 102, "controller", "127.0.0.1:9096"),
        ("controller-3", 103, "controller", "127.0.0.1:9097"),
        ("kafka-1", 1, "broker", "127.0.0.1:9092"),
        ("kafka-2", 2, "broker", "127.0.0.1:9093"),
        ("kafka-3", 3, "broker", "127.0.0.1:9094"),
    ]


@pytest.mark.parametrize("brokers, expected", [(1, (1, 1)), (2, (2, 1)), (3, (3, 2)), (4, (3, 2))])
def test_internal_topics_are_replicated_min_n_3_with_one_less_in_sync_from_three_brokers(brokers, expected):
    assert internal_replication(brokers) == expected


def test_a_replicated_stack_names_every_service_and_bootstraps_from_every_broker(tmp_path):
    stack = DevStack(tmp_path, kafka_port=19092, zk_port=12181, brokers=3)

    assert stack.services == ("zookeeper", "controller-1", "controller-2", "controller-3",
                              "kafka-1", "kafka-2", "kafka-3")
    assert stack.broker_names == ("kafka-1", "kafka-2", "kafka-3")
    assert stack.bootstrap_servers == "127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094"
    assert [s.name for s in stack.status()] == ["kafka-1", "kafka-2", "kafka-3", "controller-1", "controller-2",
                                                "controller-3", "zookeeper"]
    with pytest.raises(ValueError, match="choose one of zookeeper, controller-1"):
        stack.kill("kafka")


def properties(stack: DevStack, name: str) -> dict[str, str]:
    """The ``server.properties`` that ``stack`` writes for its Kafka process ``name``."""
    return dict(line.split("=", 1) for line in stack.kafka_properties(
        stack.kafka_node(name), stack.folder / "d").splitlines())


def test_a_broker_properties_carry_the_quorum_and_the_replication_of_internal_topics(tmp_path):
    stack = DevStack(tmp_path, kafka_port=19092, zk_port=12181, brokers=3)
    broker = properties(stack, "kafka-2")
    controller = properties(stack, "controller-1")

    voters = "101@127.0.0.1:19095,102@127.0.0.1:19096,103@127.0.0.1:19097"
    assert (broker["process.roles"], broker["node.id"], broker["controller.quorum.voters"]) == ("broker", "2", voters)
    assert broker["listeners"] == broker["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19093"
    for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor",
                "default.replication.factor"):
        assert broker[key] == "3"
    assert broker["transaction.state.log.min.isr"] == broker["min.insync.replicas"] == "2"
    assert (controller["process.roles"], controller["listeners"]) == ("controller", "CONTROLLER://127.0.0.1:19095")
    assert "advertised.listeners" not in controller


def test_only_a_lone_broker_outwaits_a_long_pause_before_its_own_controller_fences_it(tmp_path):
    lone = DevStack(tmp_path / "one", kafka_port=19092, zk_port=12181)
    replicated = DevStack(tmp_path / "three", kafka_port=19092, zk_port=12181, brokers=3)

    assert properties(lone, "kafka")["process.roles"] == "broker,controller"
    assert properties(lone, "kafka")["broker.session.timeout.ms"] == "15000"
    # Where another broker can lead, a dead one is fenced after Kafka's default 9 s.
    assert "broker.session.timeout.ms" not in properties(replicated, "controller-1")
    assert "broker.session.timeout.ms" not in properties(replicated, "kafka-1")


def test_the_broker_count_is_recorded_and_a_later_call_uses_it(tmp_path):
    DevStack(tmp_path, kafka_port=19092, zk_port=12181, brokers=3).record_ports()

    assert DevStack(tmp_path).ports == Ports(19092, 12181, 3)


def test_another_broker_count_on_a_formatted_stack_is_refused_with_the_fix(tmp_path):
    DevStack(tmp_path, kafka_port=19092, zk_port=12181).record_ports()
    (tmp_path / "kafka" / "data").mkdir(parents=True)
    (tmp_path / "kafka" / "data" / "meta.properties").write_text("cluster.id=abc\nnode.id=1\n")

    with pytest.raises(StackError) as caught:
        DevStack(tmp_path, brokers=3).up(say=lambda _text: None)
    line = str(caught.value)
    assert "has the data of 1 broker, not 3" in line and "delayq dev down --wipe" in line and "\n" not in line


@pytest.mark.parametrize("brokers, secure, problem", [
    (0, False, "a dev stack of 0 brokers is not possible: choose 1 to 9 with --brokers"),
    (10, False, "a dev stack of 10 brokers is not possible"),
    (3, True, "the secured dev stack runs one broker, not 3"),
])
def test_impossible_broker_counts_are_refused_in_one_line(tmp_path, brokers, secure, problem):
    with pytest.raises(StackError, match=problem):
        DevStack(tmp_path, brokers=brokers, secure=secure)


def test_ports_past_the_last_controller_are_refused(tmp_path):
    with pytest.raises(StackError, match=r"Kafka port 65531 is out of range: choose one from 1 to 65530 \(Kafka's "
                                         r"3 brokers and controllers listen on it and the next 5\)"):
        DevStack(tmp_path, kafka_port=65531, zk_port=2181, brokers=3)
    with pytest.raises(StackError, match=r"ZooKeeper port 9096 collides with Kafka's ports 9092 to 9097"):
        DevStack(tmp_path, kafka_port=9092, zk_port=9096, brokers=3)


# -- partitions that cannot take an acknowledged write ------------------------------------------------


def view(topic: str, partitions: list[tuple[int, list[int]]]):
    """list_topics' answer: ``topic`` with (leader, in-sync replicas) per partition, each on three replicas."""
    from confluent_kafka.admin import ClusterMetadata, PartitionMetadata, TopicMetadata

    cluster = ClusterMetadata()
    metadata = TopicMetadata()
    metadata.topic = topic
    for index, (leader, isr) in enumerate(partitions):
        partition = PartitionMetadata()
        partition.id, partition.leader, partition.replicas, partition.isrs = index, leader, [1, 2, 3], isr
        metadata.partitions[index] = partition
    cluster.topics[topic] = metadata
    return cluster


def test_partitions_below_min_insync_or_without_a_leader_are_named(monkeypatch):
    from unittest import mock

    from confluent_kafka.admin import AdminClient

    from delayq.delay_service import topics

    admin = mock.Mock(spec_set=AdminClient)
    admin.list_topics.return_value = view("b", [(1, [1, 2, 3]), (2, [2]), (-1, []), (3, [3, 1]), (2, [2])])
    monkeypatch.setattr(topics, "describe_config", lambda _admin, _topic, _timeout=30.0: {"min.insync.replicas": "2"})

    [short] = topics.insync_shortfalls(admin, {"b": [0, 1, 2, 3], "absent": None})

    assert short == topics.InSyncShortfall("b", (1, 2), in_sync=0, min_insync=2)  # partition 4 is not asked about
    line = topics.shortfall_text([short])
    assert line == ("Kafka has fewer in-sync replicas than min.insync.replicas on b partitions 1,2 (0 in sync, "
                    "min.insync.replicas 2): writes there wait (none fails, none is lost) until enough brokers are "
                    "back")


def test_a_topic_whose_config_may_not_be_read_is_judged_by_its_leaders_alone(monkeypatch):
    from unittest import mock

    from confluent_kafka.admin import AdminClient

    from delayq.delay_service import topics

    def refused(_admin, _topic, _timeout=30.0):
        raise TimeoutError("describe_configs")

    admin = mock.Mock(spec_set=AdminClient)
    admin.list_topics.return_value = view("b", [(2, [2]), (-1, [])])
    monkeypatch.setattr(topics, "describe_config", refused)

    assert topics.insync_shortfalls(admin, {"b": None}) == [topics.InSyncShortfall("b", (1,), 0, 1)]


@pytest.mark.parametrize("transactional_id, partitions, expected", [
    # Java 17's String.hashCode(): "a" 97, "delayq-orders-master" 939662859, "delayq-orders-master-2" 1072876784.
    ("a", 50, 47), ("delayq-orders-master", 50, 9), ("delayq-orders-master", 4, 3), ("delayq-orders-master-2", 50, 34),
])
def test_the_transaction_coordinator_partition_is_kafkas(transactional_id, partitions, expected):
    from delayq.delay_service.topics import coordinator_partition, java_string_hash

    assert java_string_hash("a") == 97 and java_string_hash("polygenelubricants") == -2147483648
    assert coordinator_partition(transactional_id, partitions) == expected
    assert coordinator_partition("polygenelubricants", 7) == 0  # Integer.MIN_VALUE: Kafka's Utils.abs gives 0


def test_the_node_watch_says_the_problem_while_it_lasts_and_nothing_stale(monkeypatch):
    from delayq.delay_service import insync
    from delayq.delay_service.topics import InSyncShortfall

    answers = iter([[InSyncShortfall("b", (0,), 1, 2)], [], [InSyncShortfall("b", (0,), 1, 2)], TimeoutError(), []])
    asked = []
    clients = []  # the admin client each question went through

    def ask(_watch, admin):
        asked.append(_watch.held())
        clients.append(admin)
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(insync.InSyncWatch, "_ask", ask)
    monkeypatch.setattr(insync, "admin_client", lambda _settings: mock.Mock(spec_set=AdminClient))
    now = [100.0]
    monkeypatch.setattr(insync.time, "monotonic", lambda: now[0])
    watch = insync.InSyncWatch(Settings(cluster="c"), lambda: ([0, 3], ["delayq-c-master"]))

    watch.check()
    assert watch.problem is not None and "b partition 0 (1 in sync, min.insync.replicas 2)" in watch.problem
    watch.check()
    assert watch.problem is None  # enough in sync again
    watch.check()
    watch.check()  # Kafka did not answer (any error): the last answer stands a while, a fresh admin client next
    assert watch.problem is not None
    now[0] += insync.STALE_S + 1
    assert watch.problem is None  # too old to say anything
    watch.check()
    assert clients[:4] == [clients[0]] * 4 and clients[4] is not clients[0], "a new client after the failure"
    assert asked[0] == ([0, 3], ["delayq-c-master"])


def test_down_of_a_stack_recorded_with_more_brokers_stops_all_of_it_brokers_first(tmp_path):
    DevStack(tmp_path, kafka_port=19092, zk_port=12181, brokers=3).record_ports()

    assert DevStack(tmp_path, brokers=1).stopping_order == (
        "kafka", "kafka-1", "kafka-2", "kafka-3", "controller-1", "controller-2", "controller-3", "zookeeper")


def test_the_master_producer_and_the_ingest_consumer_learn_a_new_leader_within_a_second(monkeypatch):
    # A lost broker stays its partitions' leader in the metadata until the controllers fence it, and librdkafka
    # asks again quickly only while a leader is unknown: without a short periodic refresh, commits and reads
    # waited seconds longer than a plain producer to find the new leaders.
    from delayq.delay_service import ingest, master_producer
    from delayq.delay_service.metrics import NodeMetrics

    seen: list[dict] = []

    class Recording:
        def __init__(self, conf: dict) -> None:
            seen.append(conf)

        def list_topics(self, timeout: float) -> None:
            return None

    monkeypatch.setattr(master_producer, "Producer", Recording)
    settings = Settings()
    master_producer.master_producer(settings, 0)
    consumer_conf = ingest.Ingest(settings, 1, NodeMetrics(), EndOffsets(settings, [0], mock.Mock(spec_set=AdminClient)))._consumer_conf
    for conf in (seen[0], consumer_conf):
        assert int(conf["topic.metadata.refresh.interval.ms"]) <= 1000, conf
    assert seen[0]["transactional.id"] == settings.transactional_id(0)


def test_end_offsets_asked_for_are_not_waited_for_and_a_failed_answer_replaces_the_client(monkeypatch):
    # Ingest asks and takes the answer when it comes: a read waited for held ingest, and every master's cover,
    # for its whole timeout each time a partition's leader was a broker just lost.
    from concurrent.futures import Future

    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    from delayq.delay_service import topics

    settings = Settings()
    futures: dict[TopicPartition, Future] = {TopicPartition(settings.buffer_topic, p): Future() for p in (0, 1)}
    first = mock.Mock(spec_set=AdminClient)
    first.list_offsets.return_value = futures
    replacement = mock.Mock(spec_set=AdminClient)
    monkeypatch.setattr(topics, "admin_client", lambda _settings: replacement)
    end_offsets = EndOffsets(settings, [0, 1], first)

    asked = end_offsets.ask(5.0, partitions=[0, 1])

    assert not asked.done()
    futures[TopicPartition(settings.buffer_topic, 0)].set_result(mock.Mock(offset=7))
    futures[TopicPartition(settings.buffer_topic, 1)].set_exception(
        KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)))
    assert asked.done()
    with pytest.raises(KafkaException):
        asked.result()
    replacement.list_offsets.return_value = {}
    end_offsets.ask(5.0, partitions=[0, 1])
    first.list_offsets.assert_called_once()
    replacement.list_offsets.assert_called_once()  # the next request starts from a new client, with new metadata


def test_after_a_failed_read_the_end_offsets_are_asked_with_short_calls_until_one_answers(monkeypatch):
    # A read sent to a broker just lost waits for its whole timeout; the next, through a new client that knows the
    # new leaders, starts only then: short calls while failing keep covers and ingest within half a second of Kafka.
    from concurrent.futures import Future

    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    from delayq.delay_service import topics

    settings = Settings()
    tp = TopicPartition(settings.buffer_topic, 0)
    admin = mock.Mock(spec_set=AdminClient)
    monkeypatch.setattr(topics, "admin_client", lambda _settings: admin)
    end_offsets = EndOffsets(settings, [0], admin)

    def answer(offset: int | None) -> dict[TopicPartition, Future]:
        future: Future = Future()
        if offset is None:
            future.set_exception(KafkaException(KafkaError(KafkaError._TIMED_OUT)))
        else:
            future.set_result(mock.Mock(offset=offset))
        return {tp: future}

    admin.list_offsets.side_effect = [answer(None), answer(None), answer(3), answer(4)]
    timeouts = []
    for expected in (None, None, 3, 4):
        try:
            assert end_offsets.read(5.0) == {0: expected}
        except KafkaException:
            assert expected is None
        timeouts.append(admin.list_offsets.call_args.kwargs["request_timeout"])
    assert timeouts == [5.0, topics.FAILING_CALL_S, topics.FAILING_CALL_S, 5.0]
