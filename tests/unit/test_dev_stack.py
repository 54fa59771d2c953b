"""The embedded stack's pieces that need no server: the Kafka cluster id, the service names."""

from __future__ import annotations

import base64
import uuid

import pytest

from delayq.dev import DevStack
from delayq.dev import stack as stack_module


def test_the_kafka_cluster_id_never_begins_with_a_dash(monkeypatch):
    # 0xF8 encodes to "-" in base64url: StorageTool would read such an id as an option.
    draws = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=b"\x01" * 16)])
    monkeypatch.setattr(stack_module.uuid, "uuid4", lambda: next(draws))

    cluster_id = stack_module._kafka_cluster_id()

    assert cluster_id == base64.urlsafe_b64encode(b"\x01" * 16).decode().rstrip("=")


def test_every_kafka_cluster_id_is_16_bytes_of_base64url_without_a_leading_dash():
    for _ in range(2000):
        cluster_id = stack_module._kafka_cluster_id()
        assert not cluster_id.startswith("-")
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


@pytest.mark.parametrize("action", ["kill", "start"])
def test_kill_and_start_name_the_services_they_know(tmp_path, action):
    stack = DevStack(tmp_path)

    with pytest.raises(ValueError, match="choose one of zookeeper, kafka"):
        getattr(stack, action)("redis")


def test_killing_a_service_that_is_not_running_says_so(tmp_path):
    assert DevStack(tmp_path).kill("kafka") is False
