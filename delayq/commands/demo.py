"""``delayq demo``: the main job on the embedded stack.

For now a round trip: the stack up, one record through a Kafka transaction and back
through a read_committed consumer, and one ephemeral znode through ZooKeeper.
"""

from __future__ import annotations

import argparse
import time
import uuid

from rich.console import Console

from delayq.dev import DevStack, default_state_dir

console = Console()


def register(subparsers) -> None:
    demo = subparsers.add_parser("demo", help="run the main job end to end on the embedded stack")
    demo.add_argument("--state-dir", default=default_state_dir())
    demo.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from kazoo.client import KazooClient

    stack = DevStack(args.state_dir)
    with console.status("starting the embedded stack"):
        started = stack.up(say=console.print)
    console.print(f"stack up at {stack.bootstrap_servers} / {stack.zk_connect} (started: {started or 'none'})")

    topic = f"delayq-demo-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers, "transactional.id": f"{topic}-tx"})
    producer.init_transactions(30)
    producer.begin_transaction()
    sent_at = time.time()
    producer.produce(topic, key=b"order-1", value=b"cancel if unpaid")
    producer.commit_transaction(30)
    console.print(f"Kafka: committed one record to [bold]{topic}[/] in a transaction")

    consumer = Consumer({"bootstrap.servers": stack.bootstrap_servers, "group.id": f"{topic}-reader",
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    consumer.subscribe([topic])
    record = None
    deadline = time.monotonic() + 30
    while record is None and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            record = message
    consumer.close()
    if record is None:
        console.print("[red]Kafka: the committed record never came back[/]")
        return 1
    console.print(f"Kafka: read it back with read_committed: key={record.key()!r} value={record.value()!r} "
                  f"after {1000 * (time.time() - sent_at):.0f} ms")

    zk = KazooClient(hosts=stack.zk_connect)
    zk.start(timeout=10)
    path = zk.create(f"/delayq-demo/{topic}", b"alive", ephemeral=True, makepath=True)
    seen = zk.exists(path) is not None
    zk.stop()
    zk.close()
    checker = KazooClient(hosts=stack.zk_connect)
    checker.start(timeout=10)
    gone = checker.exists(path) is None
    checker.stop()
    checker.close()
    console.print(f"ZooKeeper: ephemeral znode {path} existed={seen}, gone after its session closed={gone}")
    admin.delete_topics([topic])
    return 0 if seen and gone else 1
