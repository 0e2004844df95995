"""Every tuning constant of the package in one place, each with the reason for its value.

A tuning constant trades one cost against another (memory against mixing, threads against
the GIL, a wait against a hang) and has no right value, only a measured one; the modules that
use one import it from here under the name they always had, so a test may still patch it there.
Constants that are not trade-offs stay with their code: file-format layouts and versions,
arithmetic limits (``spec.MAX_SETTING``), numeric tolerances and the chunk sizes of vectorised
loops. Values that change the order of an epoch (marked *order*) change the golden hashes
of ``tests/test_golden.py`` and the resume states saved before.

The package's environment switches (``DASK_WINDOWS_*``) are read here too, by ``switches()``, into
one frozen ``Switches`` value.

Standard library only: ``planning/`` imports it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

# -- dask-windows convert (cli/layout.py) ---------------------------------------------------------

#: ``window + horizon`` the chunks of the spread layout overlap for when convert gets no ``--window``.
CONVERT_SPAN = 128
#: An output file holds at most this many times ``--partition-size`` of decoded (in-memory) rows.
#: ``--partition-size`` counts compressed bytes on disk; data that compresses 50x (constant or
#: zero channels) would otherwise make a file, and the sort of its rows, 50x that in a worker's
#: memory (a 348 MB worker was restarted until the task failed), and every loader buffer too.
CONVERT_DECODED_RATIO = 4
#: Chunks per file the spread layout aims for: the strata each file samples, so a few files mix
#: like the whole dataset.
TARGET_CHUNKS_PER_FILE = 512
#: Chunks are at least this many times the overlap (disk and decode overhead at most 1/4).
MIN_CHUNK_PER_OVERLAP = 4

# -- opening and reading (sources/) ---------------------------------------------------------------

#: ``WindowDataset(threads=)``: footers and series columns are read at open on this many threads;
#: remote stores answer in parallel (local files open on at most ``LOCAL_OPEN_THREADS``).
OPEN_THREADS = 16
#: Parquet files with more uncompressed bytes are split at row groups: a partition is what one
#: read decodes, so this bounds the loader's memory per partition.
DEFAULT_PARTITION_BYTES = 256 * 2**20
#: Rows per partition of array data: large enough that a read is not dominated by its overhead.
DEFAULT_PARTITION_ROWS = 1_000_000
#: Seconds one remote partition read may take, retries included (opening calls get twice this):
#: past it an error names the object instead of a hang.
DEFAULT_TIMEOUT = 60.0
#: ``WindowDataset(retries=)``: retries of a transient storage error (throttling, 5xx, resets).
RETRIES = 3
#: First backoff delay in seconds, doubled per retry: short enough for a reset connection.
RETRY_BASE_DELAY = 0.2
#: Longest backoff delay in seconds: a throttled store gets room without stalling a pass long.
RETRY_MAX_DELAY = 5.0
#: Column chunks of one partition closer than this are fetched in one request (a request costs
#: more than reading this many bytes it does not need).
MAX_GAP = 64 * 2**10
#: Most threads opening local files: opening a cached local file holds the GIL for over half its
#: 30-40 us, so threads mostly trade the GIL (16 threads on 2 idle cores took 4x the CPU time of
#: one); files open on one thread while it computes, on up to this many while it waits (a cold
#: disk, a network filesystem).
LOCAL_OPEN_THREADS = 4
#: Files opened on one thread first, to see whether opening computes or waits.
PROBE_FILES = 256
#: Column chunks read alone to name the one a corrupt read failed on (bounded: a bad file
#: is named quickly even when it has thousands of chunks).
CORRUPT_PROBES = 256
#: About what one read of a column scan holds (``ParquetRows.group_runs``): row groups smaller are
#: read together, so small row groups do not pay a call each.
READ_CHUNK_BYTES = 16 << 20
#: Seconds a rank waits for the footers another rank is reading (plus 10 ms per file) before
#: reading them itself: a dead peer delays opening, never hangs it.
SHARE_WAIT_SECONDS = 120.0
#: Bytes read from the end of each file to find its footer: one request for most footers.
FOOTER_BYTES = 64 * 2**10
#: Files whose tails are fetched by one ``cat_ranges`` call at open (bounds the tails in memory).
TAIL_BATCH = 512
#: Most bytes of parsed footers one source keeps (about ten times the footer's serialized size): a
#: footer of thousands of row groups takes tens of milliseconds to parse, so units of a few row groups
#: each would otherwise parse it again on every read.
PARSED_FOOTER_BYTES = 32 << 20
#: ``cache_dir``: an entry used within this many seconds is kept even when new bytes do not fit,
#: so a budget smaller than the data keeps what it holds across epochs.
CACHE_KEEP_SECONDS = 12 * 3600

# -- the order of an epoch and its memory (planning/, runtime/) -----------------------------------

#: ``buffer_bytes=None``: the pool order's memory budget of decoded rows per rank (shared by its
#: DataLoader workers); 1 GiB holds enough row groups for batches that mix like a global shuffle.
BUFFER_BYTES = 1 << 30
#: *order*: fewest rows of a unit cut from a source without decode units (smaller units cost a
#: read each for few windows).
MIN_UNIT_ROWS = 1024
#: *order*: most units resident per window of a batch: row groups are merged into units of at
#: least pool rows / (this * batch size) rows (fewer, larger reads where the budget holds the data
#: many times over).
UNITS_PER_BATCH = 4
#: *order*: units read beyond the resident ones: one step built ahead, one unit being read.
POOL_AHEAD_UNITS = 2
#: *order*: decoded bytes of units the pool order reads before its first step (at least one unit,
#: at most the pool); then it fills one unit per step. The first batch waits for about this much,
#: not for the whole budget (1 GiB of 250k-row groups took 1-2 s); a smaller fill mixes the
#: first batches over fewer units (the hand-written loop's first batch waits for one partition).
POOL_FIRST_BYTES = 16 << 20
#: Units of the pool's fill read at once from a remote store (``pool.fill_threads``): its reads are
#: independent and wait on the store's latency (256 one-object units at 20 ms a request, moto on the
#: loaded 2-core machine: 25 s one at a time, 4-5 s on 8 threads, 5.6 s on 16: the server is the
#: bound); never more than ``POOL_FIRST_BYTES`` of units' rows in flight, and one
#: thread on local files, whose reads decode more than they wait. Not an order: a unit lands in
#: its planned pool rows whichever thread reads it.
FILL_THREADS = 8
#: *order*: a block of steps is shuffled as one, of at least this many batches (the lag-1
#: correlation of the pool order is about ``-1 / BLOCK_BATCHES``).
BLOCK_BATCHES = 16
#: Buffers at least this large hand their memory back to the system when dropped (smaller ones
#: are reused by the allocator at no cost).
TRIM_BYTES = 8 << 20
#: Seconds the exit hook waits for a prefetcher's threads (a read in flight finishes alone).
EXIT_JOIN_SECONDS = 10.0
#: How often a wait for a loader thread (its start, its next item) checks that the thread still lives:
#: one that died where it could not report (out of memory) ends the wait after at most this long.
THREAD_WATCH_SECONDS = 0.5

# -- gathering batches (runtime/batch.py) ---------------------------------------------------------

#: Rows copied by a run's windows per buffer row, from which a run may go on two lanes.
LANE_RATIO = 8

# -- telemetry's verdict (runtime/telemetry.py) ---------------------------------------------------

#: Wait share (after the first batch) from which a loop is input-bound.
INPUT_BOUND_SHARE = 0.10

# -- optional accelerators (speedups/) and their watchdogs ----------------------------------------

#: ``next_pass_seconds``: how long a next pass's first buffer, read ahead, waits for its pass.
NEXT_PASS_SECONDS = 30.0
#: Longest wait in seconds for the threads of a released read-ahead.
NEXT_PASS_JOIN_SECONDS = 5.0
#: Where ``os.pidfd_open`` is missing: how often a worker checks that its training process lives.
WATCH_POLL_SECONDS = 1.0
#: Shared slots per ring: batches in flight (queued, pinned, held by the loop) before the fallback.
SLOTS_PER_RING = 8
#: Rings per worker process (one per batch size seen); past that, torch's path.
MAX_RINGS = 4
#: Bytes after a batch's features gathered into a slot, for its other tensors.
SLOT_HEADROOM = 64 << 10
#: Batches' features from this size are gathered straight into a slot (smaller ones are copied).
DIRECT_BYTES = 256 << 10
#: A lane's unit: consecutive batches gathered by one call, at least this many bytes.
LANE_UNIT_BYTES = 256 << 10
#: Units handed to the lane helper and not yet taken, at most.
LANE_AHEAD_UNITS = 1
#: Runs of fewer units are gathered on the consumer's thread alone.
LANE_MIN_UNITS = 4
#: Made batches (targets, rows, named fields) at least this large go on two lanes by default
#: (``DASK_WINDOWS_LANES`` unset): named batches at B=256 L=512 stride 1 1.15x wall; at B=64 L=128
#: (128 KiB) lanes gained 1.10x idle but 0.88x busy. Features alone never by default (0.82-1.09x in
#: the default order, ``bench_accelerators.py --only lanes``).
LANE_DEFAULT_BATCH_BYTES = 1 << 20


@dataclass(frozen=True)
class Switches:
    """The environment switches of the package, each named by its variable (what a user or a benchmark
    sets to turn a path on or off; the batches are the same bits either way)."""

    #: ``DASK_WINDOWS_TELEMETRY=0``: a process starts with its passes' counters off (``runtime.telemetry``).
    telemetry: bool = True
    #: ``DASK_WINDOWS_SLOTS=0``: DataLoader workers send batches through torch's path (``speedups.slots``).
    slots: bool = True
    #: ``DASK_WINDOWS_LANES=1`` / ``=0``: two copying lanes at any batch size / never; unset (``None``): from
    #: ``LANE_DEFAULT_BATCH_BYTES`` (``speedups.lanes``).
    lanes: bool | None = None
    #: ``DASK_WINDOWS_SHARE_FOOTERS=0``: each rank reads its own footers (``sources.parquet.footer_share``).
    share_footers: bool = True


def switches(environ: Mapping[str, str] | None = None) -> Switches:
    """The switches ``environ`` (default: this process's environment, read now) sets."""
    env = os.environ if environ is None else environ
    if env.get("DASK_WINDOWS_TORCH_GATHER", "0") != "0":
        import warnings

        warnings.warn(
            "DASK_WINDOWS_TORCH_GATHER no longer does anything: batches are copied by numpy on the consumer's "
            "thread, or on two lanes (DASK_WINDOWS_LANES), which measured faster (issue 33); unset it",
            FutureWarning,
            stacklevel=2,
        )
    lanes = env.get("DASK_WINDOWS_LANES", "")
    return Switches(
        telemetry=env.get("DASK_WINDOWS_TELEMETRY", "1") != "0",
        slots=env.get("DASK_WINDOWS_SLOTS", "1") != "0",
        lanes={"1": True, "0": False}.get(lanes),
        share_footers=env.get("DASK_WINDOWS_SHARE_FOOTERS", "1") != "0",
    )


#: Every constant (upper case) and the switches: the names above, not a second list of them.
__all__ = sorted([name for name in dir() if name.isupper()] + ["Switches", "switches"])
