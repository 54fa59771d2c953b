"""The stores of a node's shards (delay_service/stores.py): what is removed when the data folder changes shape."""

from __future__ import annotations

from delayq.delay_service.stores import SHARDS_DIR, forget_stores
from delayq.store import Put, TimeIndex


def test_stores_no_process_uses_are_removed_and_an_open_store_or_other_files_are_left(tmp_path):
    shards = tmp_path / SHARDS_DIR
    with TimeIndex(shards / "0") as store:
        store.apply([Put("id-1", 1_800_000_000_000, b"x")], {0: 1})
    (shards / "1").mkdir(parents=True)
    (shards / "1" / "notes.txt").write_text("not a store")
    with TimeIndex(shards / "2"):  # open: its process still runs
        forget_stores(tmp_path, "a test")
        assert not (shards / "0").exists(), "a closed store of the old shape is removed"
        assert (shards / "1" / "notes.txt").exists(), "what is no store is never deleted"
        assert TimeIndex.exists(shards / "2"), "an open store is left"
    forget_stores(tmp_path / "nowhere", "nothing there")  # no shards folder: nothing to do
