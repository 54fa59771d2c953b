"""The dead-letter topic: copies Kafka takes even at its size limit, and the ledger of what is dead-lettered.

Each malformed buffer record is dead-lettered once per cluster, however many nodes
read it, restart or rebuild: every node keeps it in its store (ingest), and only the
master writes the copy, in a Kafka transaction that also commits, as the consumer
group ``delayq-<cluster>-dead-letters``, the buffer offsets below which every
malformed record has its copy (``send_offsets_to_transaction``: Kafka's own
consume-transform-produce). The copies and that mark commit together or not at all;
a new master fences the old one's open transaction and reads the mark before it
writes; nodes drop stored records below the mark. Committed offsets of a group
without members expire after ``offsets.retention.minutes`` (7 days by default), so
the master commits the mark again at the start of each term and every few hours.

A dead-letter copy adds headers to the original, so an original just under the
producer's ``message.max.bytes`` makes a copy over it, and librdkafka refuses it in
``produce()``. Refusing to dead-letter would leave the record where it is, failing
every node in turn; so the copy then drops the original's value and headers and says
so in its reason. The original stays in the buffer, where the source header points.
"""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from delayq import wire
from delayq.settings import Settings

# A key longer than this is not kept in a copy without its value (a key can be as large as a value).
MAX_STUB_KEY = 4096


def produce_copy(producer: Producer, topic: str, key: bytes | None, value: bytes | None,
                 headers: wire.ProduceHeaders) -> None:
    """Produce a dead-letter copy: key, value and ``headers`` (the original's, then delayq's).

    Raises:
        KafkaException: Kafka refused even the copy without the value (not a size problem).
    """
    try:
        producer.produce(topic, key=key, value=value, headers=headers)
    except KafkaException as err:
        if err.args[0].code() != KafkaError.MSG_SIZE_TOO_LARGE:
            raise
        dropped = (f"; the copy leaves out the original's value ({len(value or b'')} bytes) and user headers: "
                   "too large for Kafka with the dead-letter headers")
        kept = [(name, data) for name, data in headers if name.startswith(wire.RESERVED_PREFIX)]
        kept = [(name, _header_bytes(data) + dropped.encode()) if name == wire.DEAD_LETTER_REASON else (name, data)
                for name, data in kept]
        producer.produce(topic, key=key if key is None or len(key) <= MAX_STUB_KEY else None, value=None,
                         headers=kept)


def _header_bytes(data: str | bytes | None) -> bytes:
    """A header value as Kafka carries it: confluent-kafka sends a str as UTF-8; b"" for no value."""
    return data.encode() if isinstance(data, str) else data or b""


class DeadLetterLedger:
    """Where the cluster's master has dead-lettered malformed buffer records up to: a consumer group's offsets."""

    def __init__(self, settings: Settings):
        self.topic = settings.buffer_topic
        self.group = settings.dead_letter_group
        # Never subscribes or consumes: it reads the group's committed offsets and gives the master the
        # group metadata its transactions commit them with.
        self.consumer = Consumer(settings.kafka_conf(**{
            "group.id": self.group,
            "client.id": f"delayq-dead-letter-ledger-{settings.node_id}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            # It never polls, so its log lines would queue (while a broker is down, hundreds) until close;
            # its errors reach the caller through committed() anyway. Critical lines only.
            "log_level": 2,
        }))

    def handled(self, partitions: list[int], timeout_s: float = 10.0) -> dict[int, int]:
        """Buffer partition -> offset below which every malformed record is dead-lettered (0: none yet).

        Raises:
            KafkaException: the group coordinator did not answer.
        """
        found = self.consumer.committed([TopicPartition(self.topic, p) for p in partitions], timeout=timeout_s)
        handled = {}
        for tp in found:
            if tp.error is not None:
                raise KafkaException(tp.error)
            handled[tp.partition] = max(tp.offset, 0)
        return handled

    def group_metadata(self) -> object:
        return self.consumer.consumer_group_metadata()

    def close(self) -> None:
        self.consumer.close()
