"""`delayq init` waits until the brokers serve the topics it created (a stand-in admin client)."""

from __future__ import annotations

from unittest import mock

import pytest
from confluent_kafka.admin import AdminClient, ClusterMetadata, PartitionMetadata, TopicMetadata

from delayq.delay_service import topics
from delayq.errors import UnavailableError


def cluster_view(topic: str, leaders: list[int] | None) -> ClusterMetadata:
    """What list_topics answers: the topic with one leader per partition, or no topic (None)."""
    view = ClusterMetadata()
    if leaders is not None:
        metadata = TopicMetadata()
        metadata.topic = topic
        for index, leader in enumerate(leaders):
            partition = PartitionMetadata()
            partition.id, partition.leader = index, leader
            metadata.partitions[index] = partition
        view.topics[topic] = metadata
    return view


def test_it_returns_once_every_partition_has_a_leader(monkeypatch):
    monkeypatch.setattr(topics.time, "sleep", lambda _s: None)
    admin = mock.Mock(spec_set=AdminClient)
    admin.list_topics.side_effect = [cluster_view("b", None), cluster_view("b", [1, -1, 1]),
                                     cluster_view("b", [1, 1, 1])]

    topics.wait_until_served(admin, "b", 3, timeout_s=60)

    assert admin.list_topics.call_count == 3


def test_it_says_which_topic_no_broker_serves_after_the_timeout(monkeypatch):
    clock = iter(range(0, 1000, 10))
    monkeypatch.setattr(topics.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(topics.time, "sleep", lambda _s: None)
    admin = mock.Mock(spec_set=AdminClient)
    admin.list_topics.return_value = cluster_view("delayq-c-buffer", [1, -1])

    with pytest.raises(UnavailableError, match=r"topic delayq-c-buffer was created but no broker serves all its 2 "
                                               r"partitions after 60s: .*delayq init"):
        topics.wait_until_served(admin, "delayq-c-buffer", 2, timeout_s=60)
