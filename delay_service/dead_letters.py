"""Copies on the dead-letter topic: a record Kafka takes even when the original is at Kafka's size limit.

A dead-letter copy adds headers to the original, so an original just under the
producer's ``message.max.bytes`` makes a copy over it, and librdkafka refuses it in
``produce()``. Refusing to dead-letter would leave the record where it is, failing
every node in turn; so the copy then drops the original's value and headers and says
so in its reason. The original stays in the buffer, where the source header points.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException, Producer

from delayq.proxy import envelope

# A key longer than this is not kept in a copy without its value (a key can be as large as a value).
MAX_STUB_KEY = 4096


def produce_copy(producer: Producer, topic: str, key: bytes | None, value: bytes | None,
                 headers: list[tuple[str, bytes | None]]) -> None:
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
        kept = [(name, data) for name, data in headers if name.startswith(envelope.RESERVED_PREFIX)]
        kept = [(name, (data or b"") + dropped.encode()) if name == envelope.DEAD_LETTER_REASON else (name, data)
                for name, data in kept]
        producer.produce(topic, key=key if key is None or len(key) <= MAX_STUB_KEY else None, value=None,
                         headers=kept)
