"""The unpaid-order timeout as a quixstreams pipeline, with delayq as its timer.

Orders come in on ``order-events`` as JSON: ``{"order": "o-17", "event": "placed"}`` and,
if the customer pays, ``{"order": "o-17", "event": "paid"}``. Every placed order schedules
"cancel o-17 if unpaid" on ``order-timeouts`` 30 minutes later (``ORDER_TIMEOUT_S``); a
payment cancels it. The delay id is the order's (``delay_id_for``), so the payment finds
the timeout, and a replayed row replaces it rather than doubling it.

Run it next to delayq nodes (``delayq dev up``, ``delayq init``, ``delayq node``)::

    pip install "delayq[quix]"
    python examples/order_timeouts_quix.py

Settings: ``KAFKA`` (bootstrap servers, default 127.0.0.1:9092), ``DELAYQ_CLUSTER`` (the
delayq cluster), ``ORDER_EVENTS``, ``ORDER_TIMEOUTS`` (topic names), ``ORDER_TIMEOUT_S``,
``RUN_FOR_S`` (stop after that long; default: run until interrupted).
"""

from __future__ import annotations

import os

from quixstreams import Application

from delayq.quix import DelaySink, delay_id_for


def unpaid_order_timeouts() -> Application:
    kafka = os.environ.get("KAFKA", "127.0.0.1:9092")
    app = Application(broker_address=kafka, consumer_group=os.environ.get("CONSUMER_GROUP", "order-timeouts"),
                      auto_offset_reset="earliest", processing_guarantee="at-least-once")
    events = app.dataframe(app.topic(os.environ.get("ORDER_EVENTS", "order-events"), value_deserializer="json"))
    events = events.filter(lambda event: event.get("event") in ("placed", "paid"))
    events = events.apply(lambda event: {"order": event["order"], "event": event["event"],
                                         "action": "cancel if unpaid"})
    events.sink(DelaySink(
        os.environ.get("ORDER_TIMEOUTS", "order-timeouts"),
        delay=float(os.environ.get("ORDER_TIMEOUT_S", 30 * 60)),
        delay_id=lambda value, key, timestamp, headers: delay_id_for("unpaid", value["order"]),
        cancel_when=lambda value, key, timestamp, headers: value["event"] == "paid",
        key_serializer=lambda key: key if isinstance(key, bytes) or key is None else str(key).encode(),
        producer_conf={"bootstrap.servers": kafka}))
    return app


if __name__ == "__main__":
    application = unpaid_order_timeouts()
    run_for = os.environ.get("RUN_FOR_S")
    if run_for:
        import threading

        threading.Timer(float(run_for), application.stop).start()
    application.run()
