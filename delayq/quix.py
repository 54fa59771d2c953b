"""``from delayq.quix import DelaySink``: the quixstreams sink (:mod:`delayq.proxy.quix`).

Needs the optional extra: ``pip install 'delayq[quix]'``.
"""

from delayq.proxy.quix import DelaySink, delay_id_for

__all__ = ["DelaySink", "delay_id_for"]
