"""TimeIndex.upcoming: pages of the entries in due order, each going on from a cursor, a filter's look bounded."""

from __future__ import annotations

import random

import pytest

from delayq.store import Put, Remove, StoreError, TimeIndex, Upcoming

T0 = 1_800_000_000_000


@pytest.fixture
def store(tmp_path):
    with TimeIndex(tmp_path / "store") as index:
        yield index


def fill(store: TimeIndex, count: int, seed: int = 3) -> list[tuple[int, str]]:
    """``count`` entries, several sharing a due time; their (due, id) in due order. Payload: b"even"/b"odd"."""
    rng = random.Random(seed)
    puts = [Put(f"id-{i:05d}", T0 + rng.randrange(count // 3 + 1), b"even" if i % 2 == 0 else b"odd", i)
            for i in range(count)]
    store.apply(puts, {0: count})
    return sorted((put.deliver_at_ms, put.delay_id) for put in puts)


def all_pages(store: TimeIndex, limit: int, **options) -> list[Upcoming]:
    pages = [store.upcoming(None, limit, **options)]
    while pages[-1].next is not None:
        pages.append(store.upcoming(pages[-1].next, limit, **options))
    return pages


def keys(page: Upcoming) -> list[tuple[int, str]]:
    return [(entry.deliver_at_ms, entry.delay_id) for entry in page.entries]


def test_pages_give_every_entry_once_in_due_then_id_order(store):
    expected = fill(store, 1000)
    pages = all_pages(store, 70)
    assert [len(page.entries) for page in pages] == [70] * 14 + [20]
    assert [key for page in pages for key in keys(page)] == expected
    assert pages[0].next == expected[69] and pages[-1].next is None
    first_id = expected[0][1]
    assert pages[0].entries[0].payload == (b"even" if int(first_id[3:]) % 2 == 0 else b"odd")


def test_a_last_page_that_is_exactly_full_says_there_is_no_more(store):
    expected = fill(store, 50)
    page = store.upcoming(None, 50)
    assert keys(page) == expected and page.next is None and page.scanned == 50


def test_a_page_goes_on_after_its_cursor_even_when_that_entry_has_gone_meanwhile(store):
    expected = fill(store, 100)
    first = store.upcoming(None, 10)
    _, delay_id = first.next
    store.apply([Remove(delay_id), Put("late", T0 - 1, b"p", 10_000)], {0: 200})  # gone; one due before the cursor
    assert keys(store.upcoming(first.next, 10)) == expected[10:20]


def test_after_deliveries_the_first_page_starts_at_the_first_entry_still_pending(store):
    expected = fill(store, 300)
    store.due(T0 + 10**6, 100)  # a scan learns where the live keys start
    store.apply([Remove(delay_id) for _, delay_id in expected[:100]], {0: 400})
    store.due(T0 + 10**6, 1)
    page = store.upcoming(None, 10)
    assert keys(page) == expected[100:110] and page.scanned == 10


def test_a_filter_stops_after_its_scan_limit_with_a_cursor_to_go_on_from(store):
    expected = fill(store, 1000)
    odd = [key for key in expected if int(key[1][3:]) % 2 == 1]
    # Nothing matches: each call looks at scan_limit entries and says where to go on.
    page = store.upcoming(None, 10, keep=lambda payload: payload == b"none", scan_limit=300)
    assert page.entries == [] and page.scanned == 300 and page.next == expected[299]
    pages = all_pages(store, 10, keep=lambda payload: payload == b"none", scan_limit=300)
    assert [p.scanned for p in pages] == [300, 300, 300, 100] and pages[-1].next is None
    # Some match: the pages of the filter give every match once, in order, none looking at more than its limit.
    pages = all_pages(store, 25, keep=lambda payload: payload == b"odd", scan_limit=40)
    assert [key for page in pages for key in keys(page)] == odd
    assert all(page.scanned <= 40 and len(page.entries) <= 25 for page in pages)
    assert sum(page.scanned for page in pages) == 1000


def test_an_empty_store_has_one_empty_last_page(store):
    assert store.upcoming(None, 10) == Upcoming([], None, 0)
    assert store.upcoming((T0, "x"), 10, scan_limit=5) == Upcoming([], None, 0)


@pytest.mark.parametrize(("call", "error", "text"), [
    (lambda s: s.upcoming(None, 0), ValueError, "limit must be at least 1"),
    (lambda s: s.upcoming(None, True), TypeError, "limit must be an int"),
    (lambda s: s.upcoming(None, 5, scan_limit=0), ValueError, "scan_limit must be at least 1"),
    (lambda s: s.upcoming([T0, "x"], 5), TypeError, "after must be a"),
    (lambda s: s.upcoming((-1, "x"), 5), ValueError, "after\\[0\\]"),
    (lambda s: s.upcoming((T0, ""), 5), ValueError, "after\\[1\\]"),
])
def test_bad_arguments_are_refused(store, call, error, text):
    with pytest.raises(error, match=text):
        call(store)


def test_a_closed_store_refuses(tmp_path):
    index = TimeIndex(tmp_path / "s")
    index.close()
    with pytest.raises(StoreError, match="closed"):
        index.upcoming(None, 5)
