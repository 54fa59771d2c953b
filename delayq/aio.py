"""``from delayq.aio import AIOProducer``: the asyncio producer (:mod:`delayq.proxy.aio`)."""

from delayq.proxy.aio import AIOProducer

__all__ = ["AIOProducer"]
