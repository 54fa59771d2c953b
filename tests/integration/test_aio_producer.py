"""delayq.aio.AIOProducer on the real stack: what it writes arrives as the synchronous producer's does."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest
from support.kafka_testing import create_topics, read_topic
from support.process_testing import wait_until

import delayq
from delayq import wire
from delayq.aio import AIOProducer

pytestmark = pytest.mark.integration


def delivered(records) -> dict[str, object]:
    return {dict(r.headers())[wire.ID].decode(): r for r in records if wire.ID in dict(r.headers() or [])}


def test_delayed_plain_cancelled_and_rescheduled_messages_arrive_as_the_sync_producers_do(cluster, settings, names):
    target = names.topic("target")
    create_topics(settings.bootstrap_servers, [target], partitions=3)
    cluster.start("node-a")
    conf = {"bootstrap.servers": settings.bootstrap_servers, "delayq.cluster": settings.cluster}
    sync = delayq.Producer(conf)

    async def run() -> dict:
        async with AIOProducer(conf) as producer:
            now = await producer.produce(target, b"now", b"order-1")  # plain: confluent-kafka's future
            ids = {
                "keyed": await producer.produce(target, b"keyed", b"order-1", delay=1.5),
                "headers": await producer.produce(target, b"with headers", b"h", headers=[("trace", b"t1")],
                                                  delay=1.5),
                "pinned": await producer.produce(target, None, partition=2,
                                                 deliver_at=datetime.now(UTC) + timedelta(seconds=2)),
                "cancelled": await producer.produce(target, b"cancelled", delay=2.5),
                "moved": await producer.produce(target, b"original", b"m", delay=600),
                "level": await producer.produce(target, b"level 1", delay_level=1),
            }
            await producer.flush()
            assert (await now).error() is None
            cancel_report = await producer.cancel(ids["cancelled"])  # returns once Kafka holds the cancel
            assert cancel_report.key() == ids["cancelled"].encode() and cancel_report.value() is None
            assert await producer.reschedule(ids["moved"], target, b"rescheduled", b"m", delay=2) == ids["moved"]
            await producer.flush()
            found = await producer.lookup(ids["moved"])
            assert wait_until(lambda: delayq.lookup(ids["moved"], settings=settings).pending)
            return {"ids": ids, "moved_lookup": found}

    result = asyncio.run(run())
    ids = result["ids"]
    # The same messages from the synchronous producer, for the side-by-side comparison.
    twin = sync.produce(target, b"keyed", b"order-1", delay=1.5)
    sync.flush(10)

    records = read_topic(settings.bootstrap_servers, target, expect=7, timeout_s=30, idle_s=1)
    time.sleep(2.0)  # past the cancelled one's due time: its absence means something
    records = read_topic(settings.bootstrap_servers, target, expect=7, timeout_s=30, idle_s=0.5)
    by_id = delivered(records)
    assert set(by_id) == {ids["keyed"], ids["headers"], ids["pinned"], ids["moved"], ids["level"], twin}
    assert [r.value() for r in records if wire.ID not in dict(r.headers() or [])] == [b"now"]
    assert (by_id[ids["moved"]].value(), by_id[ids["moved"]].key()) == (b"rescheduled", b"m")
    assert by_id[ids["pinned"]].partition() == 2 and by_id[ids["pinned"]].value() is None
    assert by_id[ids["headers"]].headers()[0] == ("trace", b"t1")
    ours, theirs = by_id[ids["keyed"]], by_id[twin]
    # Same key, same partition, same value, same delayq headers: the buffer could not tell them apart.
    assert (ours.key(), ours.value(), ours.partition()) == (theirs.key(), theirs.value(), theirs.partition())
    assert [h for h, _ in ours.headers()] == [h for h, _ in theirs.headers()]
    for delay_id, record in by_id.items():
        assert record.timestamp()[1] >= int(dict(record.headers())[wire.DELIVER_AT]), f"{delay_id} early"


BAD_INPUT = [
    dict(delay=-1), dict(delay=float("nan")), dict(delay="5"), dict(deliver_at=datetime(2030, 1, 1)),
    dict(delay=5, deliver_at=10**13), dict(deliver_at=1_700_000_000), dict(delay=5, headers={"delayq-id": "x"}),
    dict(delay=5, partition="1"), dict(delay=5, delay_id="not-an-id"), dict(delay_level=99),
    dict(delay_level=1, delay=5), dict(delay=5, timestamp=1.5), dict(delay=10**12),
]


@pytest.mark.parametrize("kwargs", BAD_INPUT, ids=[",".join(k) for k in map(str, BAD_INPUT)])
def test_bad_input_raises_the_sync_producers_error_word_for_word(settings, kwargs):
    conf = {"bootstrap.servers": settings.bootstrap_servers, "delayq.cluster": settings.cluster}
    sync = delayq.Producer(conf)
    with pytest.raises((TypeError, ValueError)) as theirs:
        sync.produce("orders", b"v", **kwargs)

    async def attempt():
        async with AIOProducer(conf) as producer:
            await producer.produce("orders", b"v", **kwargs)

    with pytest.raises(type(theirs.value)) as ours:
        asyncio.run(attempt())
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("topic", ["buffer", "__consumer_offsets"])
def test_a_forbidden_target_and_a_bad_id_are_refused_before_anything_is_sent(settings, topic):
    conf = {"bootstrap.servers": settings.bootstrap_servers, "delayq.cluster": settings.cluster}
    target = settings.buffer_topic if topic == "buffer" else topic

    async def attempt():
        async with AIOProducer(conf) as producer:
            with pytest.raises(ValueError, match=f"delayq never delivers to {target}"):
                await producer.produce(target, b"v", delay=1)
            with pytest.raises(ValueError, match="is not a delay id"):
                await producer.cancel("nope")
            assert len(producer) == 0

    asyncio.run(attempt())


def test_a_bad_delayq_setting_is_the_sync_producers_one_line(settings):
    async def attempt():
        AIOProducer({"bootstrap.servers": settings.bootstrap_servers, "delayq.max.delay.ms": "soon"})

    with pytest.raises(ValueError, match=r"delayq settings are not valid: conf key 'delayq.max.delay.ms'"):
        asyncio.run(attempt())
