"""A delayed message that may be delivered at most so late (``expire_after``): the producer's side.

The frame says ``level=2 expires=<due + expire_after>``; the producer asks the cluster's feature
level first (proxy/feature_gate.py) and refuses, before anything is sent, a cluster below level 2
or arguments that make no expiry. What the master does with it is in
tests/integration/test_delivery.py.
"""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from support.stand_ins import zookeeper

import delayq.election
from delayq import Every, Producer, wire
from delayq.election import FeatureRecord
from delayq.proxy.feature_gate import LevelNotFinalized
from delayq.proxy.producer import expiry_options

DUE = 1_800_000_000_000
LEVEL_2 = FeatureRecord(level=2, introduced_by="0.2.0", finalized_at_ms=1_767_225_600_000, finalized_by="0.2.0")


@pytest.mark.parametrize("expire_after, expires", [(0, DUE), (90, DUE + 90_000), (1.5, DUE + 1_500),
                                                   (timedelta(minutes=5), DUE + 300_000)])
def test_the_expiry_is_the_due_time_plus_how_late_it_may_be_and_says_its_level(expire_after, expires):
    assert expiry_options(DUE, expire_after, None) == f" level=2 expires={expires}"


@pytest.mark.parametrize("expire_after, error, text", [
    (-1, ValueError, "seconds >= 0"), (math.nan, ValueError, "seconds >= 0"), (math.inf, ValueError, "seconds >= 0"),
    (timedelta(seconds=-1), ValueError, "seconds >= 0"), ("5m", TypeError, "got str '5m'"),
    (True, TypeError, "got bool"),
])
def test_an_expiry_that_is_no_length_of_time_is_refused_in_one_line(expire_after, error, text):
    with pytest.raises(error, match=text):
        expiry_options(DUE, expire_after, None)


def test_a_repeating_message_cannot_expire():
    with pytest.raises(ValueError, match=r"a repeating message \(repeat=\) cannot expire"):
        expiry_options(DUE, 60, Every(60))


@pytest.fixture
def znodes(monkeypatch) -> dict[str, bytes]:
    """The stand-in ZooKeeper every producer's gate reads."""
    found: dict[str, bytes] = {}
    monkeypatch.setattr(delayq.election, "connect_for", lambda settings, *, timeout_s: zookeeper(found))
    return found


@pytest.fixture
def producer(znodes):
    """A producer of cluster orders whose puts stay in its queue (no broker answers)."""
    made = Producer({"bootstrap.servers": "127.0.0.1:1", "delayq.cluster": "orders", "delayq.zk.connect": "zk:2181"})
    yield made
    made.purge()
    made.close()


def purged_frames(producer: Producer, reports: list) -> list[bytes]:
    """The frame lines of the puts in the producer's queue (purged: their reports carry the records)."""
    producer.purge()
    producer.poll(0)
    return [report.value().split(b"\n")[0] for report in reports]


def test_a_cluster_below_level_2_refuses_expire_after_before_anything_is_sent(producer):
    reports: list = []
    with pytest.raises(LevelNotFinalized, match=r"expire_after needs feature level 2 .* finalized at level 1"):
        producer.produce("reminders", b"pay?", delay=60, expire_after=300, on_delivery=lambda e, m: reports.append(m))
    assert purged_frames(producer, reports) == [], "nothing queued"


@pytest.mark.parametrize("arguments", [dict(delay=60), dict(deliver_at=DUE), dict(delay_level=3)])
def test_a_cluster_at_level_2_takes_expire_after_with_any_due_time(producer, znodes, arguments):
    znodes["/delayq/orders/features"] = LEVEL_2.to_json()
    reports: list = []
    delay_id = producer.produce("reminders", b"pay?", expire_after=300,
                                on_delivery=lambda err, msg: reports.append(msg), **arguments)

    [frame] = purged_frames(producer, reports)
    record = wire.parse_buffer_record(delay_id.encode(), frame + b"\npay?", None)
    assert record.envelope.expires_at_ms == record.envelope.deliver_at_ms + 300_000


def test_expire_after_without_a_delay_is_refused(producer):
    with pytest.raises(ValueError, match="give delay, deliver_at or delay_level too"):
        producer.produce("reminders", b"now", expire_after=300)
