"""The soak's view of a replicated Kafka cluster: coordinators, serving partitions, victims (no Kafka here)."""

from __future__ import annotations

import pytest

from delayq.bench.soak_brokers import (
    ClusterState,
    PartitionState,
    busiest_leader,
    choose_broker,
    coordinator_of,
    led_elsewhere,
    replication_problems,
    serving_problems,
)
from delayq.delay_service import TRANSACTION_STATE_TOPIC, coordinator_partition, java_string_hash

BUFFER = "delayq-soak-1-buffer"


def test_java_string_hash_is_javas_string_hashcode():
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("Aa") == java_string_hash("BB") == 65 * 31 + 97 == 2112  # Java's famous collision
    assert java_string_hash("hello") == 99162322
    # Values jshell printed for "...".hashCode(): overflowing, negative, and UTF-16 (a surrogate pair) ones.
    assert java_string_hash("delayq-soak-1-master") == 394549670
    assert java_string_hash("delayq-soak-1-master-1") == 1205112266
    assert java_string_hash("zzzzzzzz") == -1910022912
    assert java_string_hash("é€😀") == 16752006
    assert java_string_hash("polygenelubricants") == -(2**31)


def test_the_coordinator_partition_is_kafkas_abs_hashcode_modulo_the_partitions():
    assert coordinator_partition("delayq-soak-1-master", 4) == 394549670 % 4 == 2
    assert coordinator_partition("delayq-soak-1-master-2", 4) == 1205112267 % 4 == 3
    assert coordinator_partition("zzzzzzzz", 4) == 1910022912 % 4 == 0
    assert coordinator_partition("zzzzzzzz", 50) == 12
    # Utils.abs takes Integer.MIN_VALUE to 0 (Math.abs would leave it negative).
    assert coordinator_partition("polygenelubricants", 7) == 0


def part(topic: str, partition: int, leader: int, replicas: tuple[int, ...] = (1, 2, 3),
         isr: tuple[int, ...] | None = None) -> PartitionState:
    return PartitionState(topic, partition, leader, replicas, replicas if isr is None else isr)


def cluster(*partitions: PartitionState, brokers: tuple[int, ...] = (1, 2, 3)) -> ClusterState:
    return ClusterState(frozenset(brokers), partitions)


MIN_ISR = {BUFFER: 2, "target": 2, TRANSACTION_STATE_TOPIC: 2}


def test_a_cluster_with_every_leader_up_and_enough_in_sync_serves():
    state = cluster(part(BUFFER, 0, 1), part(BUFFER, 1, 2, isr=(2, 3)), part("target", 0, 3))

    assert serving_problems(state, MIN_ISR, down=()) == []
    assert serving_problems(state, MIN_ISR, down=(1,)) == [
        "led by a broker that is down (1): delayq-soak-1-buffer/0",
        "a broker that is down still in sync: target/0"]
    assert serving_problems(cluster(part(BUFFER, 1, 2, isr=(2, 3))), MIN_ISR, down=(1,)) == []


def test_a_partition_without_leader_short_of_min_isr_or_waiting_on_a_down_replica_does_not_serve():
    state = cluster(part(BUFFER, 0, -1), part(BUFFER, 1, 2, isr=(2,)), part(BUFFER, 2, 2, isr=(2, 3)),
                    part("target", 0, 3), part(TRANSACTION_STATE_TOPIC, 3, 3, isr=(3, 1)))

    assert serving_problems(state, MIN_ISR, down=(1,)) == [
        "no leader: delayq-soak-1-buffer/0",
        "fewer in-sync replicas than min.insync.replicas: delayq-soak-1-buffer/1",
        "a broker that is down still in sync: target/0 __transaction_state/3"]


def test_a_topic_missing_from_the_metadata_neither_serves_nor_is_healthy():
    state = ClusterState(frozenset({1, 2, 3}), (part(BUFFER, 0, 1),), ("target",))

    assert serving_problems(state, MIN_ISR, ()) == ["topic target not in the metadata"]
    assert replication_problems(state, (1, 2, 3)) == ["topic target not in the metadata"]


def test_whole_health_wants_every_broker_registered_and_every_replica_in_sync():
    state = cluster(part(BUFFER, 0, 1), part(BUFFER, 1, 2, isr=(2, 3)), part("target", 2, -1), brokers=(1, 2))

    assert replication_problems(cluster(part(BUFFER, 0, 1)), (1, 2, 3)) == []
    assert replication_problems(state, (1, 2, 3)) == [
        "broker 3 not registered", "under-replicated: delayq-soak-1-buffer/1 target/2"]


def test_the_busiest_leader_leads_most_partitions_the_lowest_id_breaking_ties():
    assert busiest_leader([part(BUFFER, 0, 2), part(BUFFER, 1, 3), part(BUFFER, 2, 3)]) == 3
    assert busiest_leader([part(BUFFER, 0, 3), part(BUFFER, 1, 2)]) == 2
    assert busiest_leader([part(BUFFER, 0, -1)]) is None


def transaction_state(*leaders: int) -> tuple[PartitionState, ...]:
    return tuple(part(TRANSACTION_STATE_TOPIC, i, leader) for i, leader in enumerate(leaders))


def test_a_transactional_ids_coordinator_leads_its_transaction_state_partition():
    # delayq-soak-1-master hashes to partition 2, its shard 1's id to 2 and shard 2's to 3 (of 4).
    state = cluster(*transaction_state(1, 1, 2, 3))

    assert coordinator_of(state, "delayq-soak-1-master") == 2
    assert coordinator_of(state, "delayq-soak-1-master-2") == 3
    assert coordinator_of(cluster(*transaction_state(1, 1, -1, 3)), "delayq-soak-1-master") is None
    assert coordinator_of(cluster(), "delayq-soak-1-master") is None


IDS = ["delayq-soak-1-master", "delayq-soak-1-master-1", "delayq-soak-1-master-2"]


def test_the_pick_chooses_the_busiest_buffer_leader_a_coordinator_or_any_broker():
    state = cluster(part(BUFFER, 0, 3), part(BUFFER, 1, 3), part(BUFFER, 2, 1), *transaction_state(1, 1, 2, 3))

    assert choose_broker(0.1, state, BUFFER, IDS, (1, 2, 3)) == (3, "leader of 2 of the buffer's 3 partitions")
    # Second third: the shard by the rest of the pick: 0.4 -> shard 0 (partition 2, broker 2), 0.65 -> shard 2.
    assert choose_broker(0.4, state, BUFFER, IDS, (1, 2, 3)) == (
        2, "transaction coordinator of shard 0's master (delayq-soak-1-master: __transaction_state/2)")
    assert choose_broker(0.65, state, BUFFER, IDS, (1, 2, 3))[0] == 3
    assert [choose_broker(pick, state, BUFFER, IDS, (1, 2, 3)) for pick in (0.7, 0.8, 0.99)] == [
        (1, "drawn at random"), (2, "drawn at random"), (3, "drawn at random")]


def test_an_excluded_broker_is_never_chosen_and_its_role_falls_back_to_any_other():
    state = cluster(part(BUFFER, 0, 3), part(BUFFER, 1, 3), part(BUFFER, 2, 1), *transaction_state(1, 1, 2, 3))

    # The busiest leader among the others: broker 1.
    assert choose_broker(0.1, state, BUFFER, IDS, (1, 2, 3), exclude=(3,))[0] == 1
    broker, why = choose_broker(0.4, state, BUFFER, IDS, (1, 2, 3), exclude=(2,))
    assert broker in (1, 3) and why == "drawn at random (shard 0's coordinator is excluded)"
    for pick in (0.0, 0.3, 0.5, 0.9, 0.999999):
        assert choose_broker(pick, state, BUFFER, IDS, (1, 2, 3), exclude=(1, 3))[0] == 2
    with pytest.raises(ValueError):
        choose_broker(0.5, state, BUFFER, IDS, (1,), exclude=(1,))


def test_the_replica_after_the_leader_becomes_the_preferred_one_and_the_leader_the_last():
    assert led_elsewhere((1, 2, 3), 1) == (2, 3, 1)
    assert led_elsewhere((1, 2, 3), 2) == (3, 1, 2)
    assert led_elsewhere((1, 2, 3), 3) == (1, 2, 3)  # the preferred leader does not lead now: just elect it
    assert led_elsewhere((2, 1), 2) == (1, 2)
    assert led_elsewhere((1, 2, 3), -1) == (2, 3, 1)
    assert led_elsewhere((4,), 4) == (4,)


def test_a_soak_too_short_for_the_fault_kinds_of_its_brokers_is_one_line_and_exit_code_2(capsys):
    from delayq.cli import main

    assert main(["soak", "--brokers", "3", "--duration", "2m", "--no-reconcile"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "--duration 120s is too short to fit every fault kind of 3 brokers: give 3m or more" in err
