"""Stores across releases: what the previous release's own code (delayq 0.1.0, from its recorded commit) makes of a
store this code wrote, at each store format. Real RocksDB on both sides; no Kafka needed.

Before a cluster is finalized at level 2 its nodes keep store format 4, and any node may go back to 0.1.0 on its
data directory: 0.1.0 must read such a store whole. After the finalize, stores are migrated to format 5, and a
node of 0.1.0 (which predates the feature-level check) must refuse them, in one line, without touching them,
rather than rebuild them from a buffer that holds frames of level 2 it would dead-letter.
"""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest

from delayq.store import Put, Remove, TimeIndex, producer_write

pytestmark = pytest.mark.integration

T0 = 1_900_000_000_000

# Run by the previous release's python, in a folder of its own so that it imports its own delayq.
READ_WITH_THE_RELEASE = textwrap.dedent("""
    import json, sys
    from delayq.store import StoreError, TimeIndex
    try:
        with TimeIndex(sys.argv[1]) as store:
            due = [[e.delay_id, e.deliver_at_ms, e.payload.decode()] for e in store.due(2**63 - 1, 1000)]
            print(json.dumps({"due": due, "offsets": store.offsets(), "pending": store.pending_count()}))
    except StoreError as err:
        print(json.dumps({"refused": str(err)}))
""")


def read_with(release_env, path, cwd) -> dict:
    run = subprocess.run([str(release_env.python), "-c", READ_WITH_THE_RELEASE, str(path)], cwd=cwd,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, f"delayq {release_env.release.version} failed on {path}:\n{run.stderr}"
    return json.loads(run.stdout)


def write_history(path, store_format: int) -> list[list]:
    """Puts (producer writes and a master's), a reschedule, a cancel and a done, as ingest applies them."""
    with TimeIndex(path, store_format=store_format) as store:
        store.apply([
            Put("a", T0 + 1, b"a", version=0, written=producer_write(0, 0, T0, b"digest-a")),
            Put("b", T0 + 2, b"b", version=1, written=producer_write(0, 1, T0, b"digest-b")),
            Put("c", T0 + 3, b"c", version=2, written=producer_write(0, 2, T0, b"digest-c")),
            Put("b", T0 + 9, b"b later", version=3, written=producer_write(0, 3, T0 + 1, b"digest-B")),
            Remove("c", written=producer_write(0, 4, T0 + 2, b"cancel-c")),
            Put("d", T0 + 4, b"d", version=5, restores=1),
            Remove("d", version=5),
        ], {0: 6}, ingested_at_ms=T0)
        assert store.store_format == store_format
        return [[e.delay_id, e.deliver_at_ms, e.payload.decode()] for e in store.due(2**63 - 1, 1000)]


def test_the_previous_release_reads_a_format_4_store_this_code_wrote_whole(release_env, tmp_path):
    due = write_history(tmp_path / "store", 4)
    assert [entry[0] for entry in due] == ["a", "b"]

    seen = read_with(release_env, tmp_path / "store", tmp_path)
    assert seen == {"due": due, "offsets": {"0": 6}, "pending": 2}, (
        f"delayq {release_env.release.version} reads the store otherwise than this code wrote it: {seen}")


def test_the_previous_release_refuses_a_migrated_format_5_store_in_one_line_and_leaves_it_whole(release_env,
                                                                                                tmp_path):
    due = write_history(tmp_path / "store", 4)
    with TimeIndex(tmp_path / "store", store_format=5) as store:
        assert (store.found_format, store.store_format) == (4, 5)

    seen = read_with(release_env, tmp_path / "store", tmp_path)
    assert "not a delayq store" in seen.get("refused", ""), seen
    assert "\n" not in seen["refused"]
    with TimeIndex(tmp_path / "store", store_format=5) as store:
        assert [[e.delay_id, e.deliver_at_ms, e.payload.decode()] for e in store.due(2**63 - 1, 1000)] == due
        assert store.offsets() == {0: 6}
        assert store.apply([Put("a", T0 + 1, b"a", version=7, written=producer_write(0, 7, T0, b"digest-a"))],
                           {}).copies == 1, "the producer writes survived the migration and the refusal"
