"""RocksDB tuning of the time index, in one small class with typed defaults.

The store has four column families (five from store format 5) with different access patterns (docs/DESIGN.md,
"Store"), so each gets its own options, built here from one :class:`StoreOptions`.
"""

from __future__ import annotations

from dataclasses import dataclass

try:
    import rocksdict
except ImportError as err:
    from delayq.extras import MissingExtra

    raise MissingExtra("delayq.store needs delayq's 'node' extra (rocksdict, which bundles RocksDB, is not "
                       "installed): pip install 'delayq[node]'") from err

TIME_CF = "time"
IDS_CF = "ids"
OFFSETS_CF = "offsets"
META_CF = "meta"
# Store format 5 on (store/time_index.py): the producer writes of the last minutes, for copy detection.
WRITTEN_CF = "written"
COLUMN_FAMILIES = (TIME_CF, IDS_CF, OFFSETS_CF, META_CF)

_COMPRESSIONS = {
    "none": rocksdict.DBCompressionType.none,
    "snappy": rocksdict.DBCompressionType.snappy,
    "lz4": rocksdict.DBCompressionType.lz4,
    "lz4hc": rocksdict.DBCompressionType.lz4hc,
    "zstd": rocksdict.DBCompressionType.zstd,
    "zlib": rocksdict.DBCompressionType.zlib,
    "bz2": rocksdict.DBCompressionType.bz2,
}

# The time index is deleted from the front all day long (every delivered message gets
# a `done`). An SST file in which 500 of any 1000 consecutive entries, or half of all
# entries, are deletions is compacted early, so scans from the front do not wade
# through tombstones until size-triggered compaction happens to reach them.
_DELETION_WINDOW = 1000
_DELETIONS_TRIGGER = 500
_DELETION_RATIO = 0.5

# Offsets hold a handful of keys rewritten on every batch: a small memtable is plenty,
# and it keeps the WAL from being pinned by a column family that never fills.
_SMALL_CF_WRITE_BUFFER = 1 << 20
# The producer writes of the last minutes (about 40 bytes each; in meta's sys/written/ in store
# format 4, in the written family from format 5): a memtable of a couple of hundred thousand.
_WRITTEN_WRITE_BUFFER = 8 << 20

# Time-index blocks are read front to back by due(), so larger blocks mean fewer
# block fetches per scan and better compression of neighbouring payloads; the id
# index is read by point lookups, where the default 4 KiB block keeps reads small.
_TIME_BLOCK_SIZE = 16 << 10

# RocksDB's info LOG rolls on every open; keep a few for post-mortems, not hundreds.
_KEEP_LOG_FILES = 5


@dataclass(frozen=True)
class StoreOptions:
    """How the time index uses memory, disk and CPU.

    Args:
        block_cache_mb: One LRU block cache shared by all column families, with index and
            filter blocks charged to it, so this bounds the read-side memory of a node.
        write_buffer_mb: Memtable size of the time and id column families. At 50,000
            ingested messages/s of ~500 bytes a 32 MiB memtable flushes every second or so;
            larger means fewer L0 files at the cost of memory and WAL replay time on start.
        max_write_buffers: Memtables per column family, so a flush in progress never
            stalls ingest.
        bloom_bits_per_key: Bloom filter of the id index. Most id lookups during ingest are
            misses (a `put` of a new id), which the filter answers without reading a block;
            10 bits per key gives about 1% false positives.
        compression: Compression of the time index (the payloads) above the last level.
            lz4 costs little CPU on the ingest path and still shrinks JSON/Avro payloads.
        bottommost_compression: Compression of the last level, where most long-delay data
            settles; written by background compaction only, so zstd's better ratio is cheap.
        background_jobs: Flush and compaction threads. A node has few cores and other work.
        wal: Write each batch to RocksDB's write-ahead log too. Off by default: the store is
            a view of the buffer topic, and every batch carries the buffer offsets it
            reached, so a process that dies loses only the batches still in its memtables
            (at most ``write_buffer_mb`` x ``max_write_buffers`` per family), which it reads
            again from the buffer on start. Atomic flush keeps what is on disk one
            consistent prefix of batches across the column families. The WAL would cost
            the ingest path a second write of every byte, under Python's GIL.
        sync_writes: Write the WAL and fsync it on every batch (implies ``wal``). Turn on
            only if the buffer topic can lose data.

    Raises:
        ValueError: a size or count is not positive, or the compression name is unknown.
        TypeError: a field has the wrong type.
    """

    block_cache_mb: int = 64
    write_buffer_mb: int = 32
    max_write_buffers: int = 3
    bloom_bits_per_key: float = 10
    compression: str = "lz4"
    bottommost_compression: str = "zstd"
    background_jobs: int = 2
    wal: bool = False
    sync_writes: bool = False

    def __post_init__(self) -> None:
        for name in ("block_cache_mb", "write_buffer_mb", "max_write_buffers", "background_jobs"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"StoreOptions.{name} must be an int, not {type(value).__name__}")
            if value < 1:
                raise ValueError(f"StoreOptions.{name} must be at least 1, got {value}")
        bits = self.bloom_bits_per_key
        if not isinstance(bits, (int, float)) or isinstance(bits, bool):
            raise TypeError(f"StoreOptions.bloom_bits_per_key must be a number, not {type(bits).__name__}")
        if not 1 <= bits <= 64:
            raise ValueError(f"StoreOptions.bloom_bits_per_key must be between 1 and 64, got {bits}")
        for name in ("compression", "bottommost_compression"):
            value = getattr(self, name)
            if value not in _COMPRESSIONS:
                raise ValueError(f"StoreOptions.{name} {value!r} is not one of {sorted(_COMPRESSIONS)}")
        for name in ("wal", "sync_writes"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"StoreOptions.{name} must be a bool, not {type(getattr(self, name)).__name__}")

    @property
    def uses_wal(self) -> bool:
        """Whether batches go through the write-ahead log (``wal``, or ``sync_writes``, which fsyncs it)."""
        return self.wal or self.sync_writes

    def db_options(self) -> rocksdict.Options:
        """Database-wide options (also those of the unused ``default`` column family)."""
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.create_missing_column_families(True)
        opts.set_max_background_jobs(self.background_jobs)
        opts.set_keep_log_file_num(_KEEP_LOG_FILES)
        # With ``wal``: a WAL file is kept until every column family with data in it has
        # flushed; the small offsets/meta families fill slowly, so without a cap the WAL would
        # grow to RocksDB's default of 4x all memtables (~800 MiB) and slow every restart's
        # replay. Past the cap RocksDB flushes the families pinning the oldest WAL. (Without
        # it the WAL holds only set_meta's rare writes; TimeIndex.flush bounds a crash's loss.)
        opts.set_max_total_wal_size(4 * self.write_buffer_mb << 20)
        # Batches skip the WAL (``wal``), so what survives a crash is what was flushed: all
        # column families flush together, and each flush holds whole batches, so the
        # offsets on disk always say which buffer records the entries on disk reflect.
        opts.set_atomic_flush(True)
        return opts

    def column_families(self) -> dict[str, rocksdict.Options]:
        """Options of each column family of any delayq store format, all sharing one block cache."""
        cache = rocksdict.Cache(self.block_cache_mb << 20)

        time_opts = self._cf_options(cache, block_size=_TIME_BLOCK_SIZE, bloom=False)
        time_opts.set_write_buffer_size(self.write_buffer_mb << 20)
        time_opts.set_compression_type(_COMPRESSIONS[self.compression]())
        time_opts.set_bottommost_compression_type(_COMPRESSIONS[self.bottommost_compression]())
        time_opts.add_compact_on_deletion_collector_factory(_DELETION_WINDOW, _DELETIONS_TRIGGER, _DELETION_RATIO)

        ids_opts = self._cf_options(cache, block_size=None, bloom=True)
        ids_opts.set_write_buffer_size(self.write_buffer_mb << 20)
        # Keys are 36-byte ids with 8-byte values: little to gain from compression, and
        # every cache miss on a point lookup would pay for decompression.
        ids_opts.set_compression_type(rocksdict.DBCompressionType.none())
        ids_opts.add_compact_on_deletion_collector_factory(_DELETION_WINDOW, _DELETIONS_TRIGGER, _DELETION_RATIO)
        # Misses on ids still in the memtable are answered by a memtable bloom filter
        # instead of a skip-list descent.
        ids_opts.set_memtable_prefix_bloom_ratio(0.02)
        ids_opts.set_memtable_whole_key_filtering(True)

        offsets_opts = self._cf_options(cache, block_size=None, bloom=False)
        offsets_opts.set_write_buffer_size(_SMALL_CF_WRITE_BUFFER)
        # A producer write is looked up once, nearly always a miss (a copy is rare): a bloom
        # filter answers those without reading a block. (Meta holds them too in store format 4.)
        meta_opts = self._cf_options(cache, block_size=None, bloom=True)
        meta_opts.set_write_buffer_size(_WRITTEN_WRITE_BUFFER)
        written_opts = self._cf_options(cache, block_size=None, bloom=True)
        written_opts.set_write_buffer_size(_WRITTEN_WRITE_BUFFER)
        return {TIME_CF: time_opts, IDS_CF: ids_opts, OFFSETS_CF: offsets_opts, META_CF: meta_opts,
                WRITTEN_CF: written_opts}

    def _cf_options(self, cache: rocksdict.Cache, *, block_size: int | None, bloom: bool) -> rocksdict.Options:
        table = rocksdict.BlockBasedOptions()
        table.set_block_cache(cache)
        # Index and filter blocks live in the cache (bounded memory) and L0's stay
        # pinned, since every read consults them.
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        if block_size is not None:
            table.set_block_size(block_size)
        if bloom:
            # A full (not block-based) filter: one probe per SST file.
            # rocksdict's stub says int; the binding takes RocksDB's double bits_per_key (9.5 is valid).
            table.set_bloom_filter(self.bloom_bits_per_key, False)  # type: ignore[arg-type]
        opts = rocksdict.Options(raw_mode=True)
        opts.set_block_based_table_factory(table)
        opts.set_max_write_buffer_number(self.max_write_buffers)
        opts.set_level_compaction_dynamic_level_bytes(True)
        return opts
