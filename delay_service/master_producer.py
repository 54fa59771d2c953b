"""A shard master's transactional producer, and the spare one a node in line for the shard makes ahead.

A new master's first step is its producer: made, connected, then ``init_transactions``
(which fences the shard's previous master). Making and connecting one costs a tenth of a
second on an idle loopback and up to a second in a busy node: librdkafka reads its first
metadata through the bootstrap connection, drops it, and connects again to the broker the
metadata names. On a handover that is most of the time the shard has no master. So a node
waiting in line for a shard's lock makes the producer while it waits (:class:`SpareProducer`),
and the term that follows only fences and reads the buffer to its end.

A spare is safe to hold beside the live master: a transactional producer talks to the
transaction coordinator only from ``init_transactions`` on, so until its node wins the
election it fences nobody.
"""

from __future__ import annotations

import logging
import threading
import warnings

from confluent_kafka import KafkaException, Producer

from delayq.settings import Settings

from .topics import LEADER_REFRESH_CONF

log = logging.getLogger("delayq.delivery")

# How long to wait for the shard's metadata while connecting a producer.
CONNECT_TIMEOUT_S = 10.0
# How long retire_producer waits for the producer to be destroyed before it goes on (see there): a close() takes
# milliseconds unless it waits for Kafka to abort, and then the term must not wait with it.
RETIRE_WAIT_S = 0.5


def master_producer(settings: Settings, shard: int) -> Producer:
    """The shard's transactional producer, connected (its metadata read), before init_transactions.

    A producer whose init_transactions starts before its connection to the coordinator is
    up finds "no broker available" and waits for librdkafka's PID timer, half a second;
    read first, the init takes milliseconds.

    Raises:
        KafkaException: the metadata could not be read (an error that may pass).
    """
    producer = Producer(settings.kafka_conf(**{
        "transactional.id": settings.transactional_id(shard),
        "client.id": f"delayq-master-{shard}-{settings.node_id}",
        "linger.ms": 1,
        **LEADER_REFRESH_CONF,
        "transaction.timeout.ms": 60_000,
        "message.timeout.ms": 30_000,
        # A producer's metadata request would otherwise create a missing target topic on a broker
        # with auto.create.topics.enable=true (Kafka's default): a message for a topic that does
        # not exist must be retried and dead-lettered, never create it.
        "allow.auto.create.topics": False,
    }))
    producer.list_topics(timeout=CONNECT_TIMEOUT_S)
    return producer


# Spares a node makes while it waits in line for a shard: the term takes one; the other is there for the term's
# fence when the previous master left a transaction open (transactions.FIRST_ASK_S), or else for the next term.
SPARES = 2


def retire_producer(producer: Producer, *, until_closed: bool = False) -> None:
    """Destroy a term's producer now: from here on it sends nothing, whatever it was doing.

    Letting it go is not enough. A producer lives as long as a reference to it does, and one
    that a stuck commit raised through keeps one in the frames of that exception's traceback,
    a reference cycle, until the garbage collector's next full pass; meanwhile librdkafka
    carries on by itself. In CI's soak a master's term ended on a commit the killed broker left
    unconfirmed; 12 s later, the broker back, its producer resumed that commit
    (AddPartitionsToTxn), the next master's init_transactions aborted it, and the abort markers
    ended as aborted the records of the transaction before it on those partitions (one the
    coordinator had committed, but whose markers the restarted broker had dropped): a delivery
    without its ``done``, and a ``done`` without its delivery.

    What the producer still holds is purged, then ``close()`` destroys it. ``close()`` first
    aborts a transaction still open, and waits for that without a bound: refused at once while a
    commit is pending or when nothing is open, but an abort the coordinator must answer waits
    for Kafka. So it runs on a thread of its own, waited for :data:`RETIRE_WAIT_S` (with
    ``until_closed``, until it is closed): what it can still do then is abort its own
    transaction, which the next master's ``init_transactions`` would abort anyway.
    """
    closing = threading.Thread(target=_close, args=(producer,), name="delayq-retire-producer", daemon=True)
    closing.start()
    closing.join(None if until_closed else RETIRE_WAIT_S)
    if closing.is_alive():
        log.info("a master producer is still aborting its transaction; it is closed once Kafka answers")


def close_unused(producer: Producer) -> None:
    """Destroy a producer that never began a transaction (a spare), on a thread of its own, without waiting.

    It has nothing to abort, so nothing depends on when it is gone; its caller (placement dropping a
    shard) must not wait for librdkafka to stop its threads.
    """
    threading.Thread(target=_close, args=(producer,), name="delayq-close-spare", daemon=True).start()


def _close(producer: Producer) -> None:
    try:
        producer.purge(in_queue=True, in_flight=True)
        with warnings.catch_warnings():
            # close() says when it could not abort (a commit pending, init_transactions under way) or flush
            # (purged): expected here, and nothing is left to abort or flush.
            warnings.simplefilter("ignore", RuntimeWarning)
            producer.close()
    except Exception as err:  # a thread of its own: a fenced or fatal producer's refusal must reach the log
        log.info("closing a master producer: %s", err)


class SpareProducer:
    """The shard's master producers, made and connected while this node waits in line for the shard.

    :meth:`prepare` starts making :data:`SPARES` in the background (those ready or coming count);
    :meth:`take` hands one to a term, waiting for one on its way, or makes one then and there.
    A spare made before a broker restart still works: librdkafka connects again when it is used.
    """

    def __init__(self, settings: Settings, shard: int):
        self.settings = settings
        self.shard = shard
        self._cond = threading.Condition()
        self._ready: list[Producer] = []
        self._making = 0
        self._closed = False

    def prepare(self) -> None:
        """Make spares in the background, up to :data:`SPARES` ready or on their way."""
        with self._cond:
            if self._closed:
                return
            wanted = max(0, SPARES - len(self._ready) - self._making)
            self._making += wanted
        for _ in range(wanted):
            threading.Thread(target=self._make, name=f"spare-producer-{self.shard}", daemon=True).start()

    def take(self) -> Producer:
        """A spare (waiting for one on its way), or, without one, a producer made now.

        Raises:
            KafkaException: a producer made now could not read its metadata.
        """
        with self._cond:
            while not self._ready and self._making:
                self._cond.wait()
            producer = self._ready.pop(0) if self._ready else None
        return producer if producer is not None else master_producer(self.settings, self.shard)

    def close(self) -> None:
        """Close the spares, and those still being made once they are (the seat is going).

        Closed, not dropped: a producer in a reference cycle would keep its connections and threads until the
        collector's next pass over its generation, which a node's tuned collector makes rare (collector.py).
        """
        with self._cond:
            self._closed = True
            spares, self._ready = self._ready, []
        for producer in spares:
            close_unused(producer)

    def _make(self) -> None:
        producer: Producer | None = None
        try:
            producer = master_producer(self.settings, self.shard)
        except KafkaException as err:  # the term makes its own, and may meet the error itself
            log.info("shard %d: the spare master producer could not connect: %s", self.shard, err.args[0].str())
        except Exception:  # a thread of its own: what went wrong must reach the log, not vanish
            log.exception("shard %d: making the spare master producer failed", self.shard)
        finally:
            unwanted = None
            with self._cond:
                self._making -= 1
                if producer is not None:
                    if self._closed:
                        unwanted = producer
                    else:
                        self._ready.append(producer)
                self._cond.notify_all()
            if unwanted is not None:
                close_unused(unwanted)
