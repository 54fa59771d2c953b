"""What the master prepares while the broker commits: the next batch when it is covered, else the next cover's ends."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from unittest import mock

from delayq.clock import now_ms
from delayq.delay_service.cover import Cutoff, Ends, ShardCover
from delayq.delay_service.lookahead import Lookahead
from delayq.delay_service.routing import Router
from delayq.store import StoredEntry, TimeIndex

LOG = logging.LoggerAdapter(logging.getLogger("test"), {})


def lookahead(due_ms: int | None, covers_ms: int) -> tuple[Lookahead, mock.Mock, mock.Mock, mock.Mock]:
    store, cover = mock.Mock(spec_set=TimeIndex), mock.Mock(spec_set=[*dir(ShardCover), "cutoff"])  # set by __init__
    router = mock.Mock(spec_set=Router)
    store.due.return_value = [] if due_ms is None else [StoredEntry("id-1", due_ms, b"")]
    cutoff = Cutoff([0])
    cutoff.covers_ms = covers_ms
    cover.cutoff = cutoff
    skip = mock.Mock(return_value={"in-flight"})
    return Lookahead(store, cover, router, 500, skip, LOG), store, cover, router


def committed_after(seconds: float) -> Future[None]:
    commit: Future[None] = Future()
    threading.Timer(seconds, commit.set_result, [None]).start()
    return commit


def test_a_covered_backlog_is_picked_and_routed_during_the_commit_and_taken_once():
    ahead, store, cover, router = lookahead(due_ms=now_ms() - 10, covers_ms=now_ms())
    done: Future[None] = Future()
    done.set_result(None)

    ahead.during(done)

    cover.pick.assert_called_once_with(store, 500, {"in-flight"})
    assert ahead.take() == (router.route.return_value, None)
    assert ahead.take() == (None, None)


def test_a_message_falling_due_during_the_commit_gets_its_ends_read_then_not_after_the_commit():
    ahead, _store, cover, router = lookahead(due_ms=now_ms() + 50, covers_ms=now_ms() - 1000)
    cover.read_ends.side_effect = lambda: Ends(now_ms(), {0: 7})

    ahead.during(committed_after(0.3))

    batch, ends = ahead.take()
    assert batch is None and ends is not None and ends.targets == {0: 7}
    router.route.assert_not_called()
    assert cover.read_ends.call_count >= 2, "read again and again while the commit lasts: the latest covers most"


def test_nothing_due_prepares_nothing():
    ahead, _store, cover, _router = lookahead(due_ms=None, covers_ms=0)

    ahead.during(committed_after(0.0))

    assert ahead.take() == (None, None)
    cover.read_ends.assert_not_called()


def test_a_failure_while_preparing_leaves_nothing_prepared_and_never_raises():
    ahead, _store, cover, _router = lookahead(due_ms=now_ms() - 10, covers_ms=now_ms())
    cover.pick.side_effect = OSError("store closed")

    ahead.during(committed_after(0.0))

    assert ahead.take() == (None, None)
