"""The next pass's first buffer read while the last buffer drains (``nextpass``): same batches, or dropped.

Every test compares a dataset iterated pass after pass (its second pass's first buffer read ahead
during the first pass) with a fresh dataset that reads the same epoch with ``set_epoch`` and
``next_pass_seconds=0``; and checks, by recording ``nextpass.claim``, whether the read-ahead was
taken (a test in which it silently never engages would prove nothing).
"""

from __future__ import annotations

import gc
import os
import pickle
import threading
import time

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import collect, same_batches, threads_started_here, write_parquet

import dask_windows as dw
from dask_windows.errors import SourceReadError
from dask_windows.sources.base import PartitionReader
from dask_windows.speedups import nextpass

FILES, ROWS, GROUP = 4, 960, 120  # 8 row groups per file (partition_bytes=1: a partition each)


def write_files(path, files: int = FILES) -> str:
    rng = np.random.default_rng(0)
    frames = []
    for i in range(files):
        rows = np.arange(i * ROWS, (i + 1) * ROWS)
        frames.append(
            pd.DataFrame({"f0": rows.astype(np.float32), "f1": rng.random(ROWS).astype(np.float32), "y": -rows * 1.0})
        )
    write_parquet(frames, str(path), row_group_size=GROUP)
    return str(path)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("nextpass"))


def make(root: str, **kwargs) -> dw.WindowDataset:
    options = dict(features=["f0", "f1"], series=None, window=16, stride=4, batch_size=32, seed=3, buffer_partitions=1)
    options.update(kwargs)
    if "pieces_per_partition" not in kwargs:  # the next pass is read ahead in the order of whole partitions
        options["pieces_per_partition"] = 1
    return dw.WindowDataset(root, **options)


def epoch_of(ds, epoch: int | None = None) -> list:
    if epoch is not None:
        ds.set_epoch(epoch)
    out = []
    for batch in ds:
        batch = batch if isinstance(batch, (tuple, list)) else (batch,)
        out.append(tuple(b.numpy().copy() for b in batch))
    return out


def fresh(root: str, epoch: int, **kwargs) -> list:
    return epoch_of(make(root, next_pass_seconds=0, **kwargs), epoch)


@pytest.fixture
def claims(monkeypatch):
    """Whether each pass (with ``next_pass_seconds > 0``) took a read-ahead or read its first buffer itself."""
    seen: list[bool] = []
    claim = nextpass.claim

    def recorded(ahead, *args):
        out = claim(ahead, *args)
        if ahead.spec.next_pass_seconds > 0:  # not the references, read with it off
            seen.append(out is not None)
        return out

    monkeypatch.setattr(nextpass, "claim", recorded)
    return seen


def loader_threads() -> list[threading.Thread]:
    return threads_started_here("dask-windows")


def join_loader_threads() -> None:
    for thread in loader_threads():
        thread.join(30)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},  # whole files, one per buffer
        {"partition_bytes": 1},  # a partition per row group
        {"targets": ["y"], "return_index": True, "horizon": 3, "batch_size": 16},
        {"normalize": "sample", "prefetch_partitions": 2},
        {"shuffle": False, "batch_size": 1000, "pieces_per_partition": 1},  # batches across buffers
        {"pieces_per_partition": 1, "buffer_partitions": 4},  # one buffer: its tail shuffled after the handover
    ],
)
def test_passes_are_bit_identical_with_the_read_ahead(root, claims, kwargs):
    ds = make(root, **kwargs)
    passes = [epoch_of(ds) for _ in range(3)]
    assert claims == [False, True, True]  # the second and third passes took their first buffer read ahead
    for epoch, got in enumerate(passes):
        assert same_batches(got, fresh(root, epoch, **kwargs))
    ds.close()


@pytest.mark.filterwarnings("ignore::UserWarning")  # (PoolWarning: the small budget mixes less)
@pytest.mark.parametrize("first_bytes", [None, 1000])  # the whole pool first (small data); one unit first
@pytest.mark.parametrize("budget", [None, 12_000])  # the data resident (a file a unit); row groups, a few resident
def test_the_pool_order_reads_its_next_pass_first_units_ahead(root, claims, monkeypatch, first_bytes, budget):
    import dask_windows.planning.budget as budget_module
    from dask_windows.planning.world import World

    if first_bytes is not None:
        monkeypatch.setattr(budget_module, "POOL_FIRST_BYTES", first_bytes)
    options = dict(features=["f0", "f1"], series=None, window=16, stride=4, batch_size=32, seed=3, return_index=True)
    ds = dw.WindowDataset(root, buffer_bytes=budget, **options)
    plan = ds._plan(World(0, 1, 0, 1))
    assert (plan.fill < plan.spread) == (first_bytes is not None)
    passes = [epoch_of(ds) for _ in range(3)]
    assert claims == [False, True, True]  # the second and third passes took their first units read ahead
    for epoch, got in enumerate(passes):
        assert same_batches(
            got, epoch_of(dw.WindowDataset(root, buffer_bytes=budget, next_pass_seconds=0, **options), epoch)
        )
    ds.close()


@pytest.mark.filterwarnings("ignore::UserWarning")  # (PoolWarning: the small budget mixes less)
@pytest.mark.parametrize("first_bytes", [None, 1000])  # the whole pool first (small data); one unit first
def test_by_default_the_next_pass_first_units_are_read_before_the_loop_asks_for_them(root, monkeypatch, first_bytes):
    import dask_windows.planning.budget as budget_module
    import dask_windows.runtime.pool as pool_module
    from dask_windows.planning.world import World

    if first_bytes is not None:
        monkeypatch.setattr(budget_module, "POOL_FIRST_BYTES", first_bytes)
    read, log, asked = pool_module._Pool.read, [], [False]

    def recorded(pool, i):  # each unit read, once read: by which pass's pool, and whether its pass had begun
        out = read(pool, i)
        log.append((pool, i, asked[0]))
        return out

    monkeypatch.setattr(pool_module._Pool, "read", recorded)
    options = dict(features=["f0", "f1"], series=None, window=16, stride=4, batch_size=32, seed=3)
    ds = dw.WindowDataset(root, **options)  # every other setting at its default: the pool order, 30 s
    first = epoch_of(ds)
    plan = ds._plan(World(0, 1, 0, 1), epoch=1)
    fill = range(plan.first_unit, plan.first_unit + plan.fill)
    assert 0 < len(fill) <= len(plan.units) and (len(fill) < len(plan.units)) == (first_bytes is not None)
    this_pass = log[0][0]
    ahead = lambda: [i for pool, i, _ in log if pool is not this_pass]
    deadline = time.monotonic() + 30
    while sorted(ahead()) != list(fill) and time.monotonic() < deadline:  # the reader thread may still be busy
        time.sleep(0.01)
    assert sorted(ahead()) == list(fill)  # epoch 1's first units, read with no pass of epoch 1 asked for
    asked[0] = True
    second = epoch_of(ds)
    next_pool = next(pool for pool, _, _ in log if pool is not this_pass)
    assert sorted(i for pool, i, late in log if pool is next_pool and late) == list(range(fill.stop, len(plan.units)))
    ds.close()
    for epoch, got in enumerate([first, second]):  # the batches of a dataset that reads nothing ahead
        assert same_batches(got, epoch_of(dw.WindowDataset(root, next_pass_seconds=0, **options), epoch))


def test_array_data_reads_its_next_pass_ahead_too(claims):
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal((n, 2)).astype(np.float32) for n in (3000, 5000, 2000, 4000, 3500)]
    kwargs = dict(window=8, stride=3, batch_size=16, partition_rows=2500, seed=2, pieces_per_partition=1)
    ds = dw.WindowDataset(arrays, **kwargs)
    passes = [epoch_of(ds) for _ in range(3)]
    ds.close()
    for epoch, got in enumerate(passes):
        assert same_batches(got, epoch_of(dw.WindowDataset(arrays, next_pass_seconds=0, **kwargs), epoch))
    assert claims == [False, True, True]


def test_set_epoch_to_the_epoch_read_ahead_keeps_it(root, claims):
    ds = make(root)
    epoch_of(ds, 0)
    got = epoch_of(ds, 1)  # what bench_loader does: set_epoch(e + 1) before each pass
    assert claims == [False, True]
    assert same_batches(got, fresh(root, 1))
    ds.close()


def test_set_epoch_during_a_pass_chooses_the_epoch_read_ahead(root, claims):
    ds = make(root)
    it = iter(ds)
    head = [next(it)]
    ds.set_epoch(7)  # before the pass's last buffer: the read-ahead is for epoch 7's pass
    rest = list(it)
    assert len(head + rest) == len(ds)
    got = epoch_of(ds)
    assert claims == [False, True]
    assert same_batches(got, fresh(root, 7))
    ds.close()


def test_set_epoch_to_another_epoch_releases_it(root, claims):
    ds = make(root)
    epoch_of(ds)
    assert any(t.name == "dask-windows-next-pass" for t in loader_threads())
    ds.set_epoch(5)
    assert loader_threads() == []  # released at once: its threads joined
    assert same_batches(epoch_of(ds), fresh(root, 5))
    assert claims == [False, False]


def test_load_state_dict_mid_epoch_resumes_as_today(root, claims):
    reference = make(root, next_pass_seconds=0)
    reference.set_epoch(1)
    it = iter(reference)
    for _ in range(3):
        next(it)
    state = reference.state_dict()
    del it
    ds = make(root)
    epoch_of(ds)  # reads epoch 1's first buffer ahead
    ds.load_state_dict(state)
    assert loader_threads() == []
    assert same_batches(epoch_of(ds), fresh(root, 1)[3:])
    assert claims == [False, False]


def test_another_rank_reads_its_own_first_buffer(root, claims):
    ds = make(root, rank=0, world_size=2)
    epoch_of(ds)
    ds._explicit_world = (1, 2)  # the same dataset now stands for rank 1 (the key holds the reader's World)
    got = epoch_of(ds)
    assert claims == [False, False]
    assert same_batches(got, fresh(root, 1, rank=1, world_size=2))
    ds.close()


def test_close_and_garbage_collection_release_it(root):
    ds = make(root)
    epoch_of(ds)
    names = {t.name for t in loader_threads()}
    assert {"dask-windows-next-pass", "dask-windows-pool"} <= names
    ds.close()
    assert loader_threads() == []
    ds = make(root)
    epoch_of(ds)
    assert loader_threads()
    del ds
    gc.collect()  # the threads hold a proxy of the dataset, not the dataset
    join_loader_threads()
    assert loader_threads() == []


def test_an_unclaimed_first_buffer_is_released_after_next_pass_seconds(root, claims):
    ds = make(root, next_pass_seconds=0.05)
    epoch_of(ds)
    join_loader_threads()  # the timer releases it (no wall-clock assertion: only that it happens)
    assert loader_threads() == []
    assert same_batches(epoch_of(ds), fresh(root, 1))
    assert claims == [False, False]


def test_off_without_threads_or_with_zero_seconds(root, claims):
    for kwargs in ({"prefetch_partitions": 0}, {"next_pass_seconds": 0}, {"on_error": "skip"}):
        ds = make(root, **kwargs)
        epoch_of(ds)
        assert loader_threads() == []
        epoch_of(ds)
    assert not any(claims)
    with pytest.raises(ValueError, match="next_pass_seconds"):
        make(root, next_pass_seconds=-1)


def test_a_file_rewritten_between_passes_is_not_served_stale(tmp_path, claims):
    frames = [
        pd.DataFrame({"f0": np.arange(ROWS, dtype=np.float32) + i, "f1": np.ones(ROWS, np.float32)})
        for i in range(FILES)
    ]
    paths = write_parquet(frames, str(tmp_path), row_group_size=GROUP)
    ds = make(str(tmp_path), buffer_partitions=FILES)  # one buffer of every file
    epoch_of(ds)  # the first buffer of epoch 1 is read from the files as they are now
    pending, waited = ds._read_ahead.pending, time.monotonic() + 60
    while 1 not in pending.partitions_read() and time.monotonic() < waited:  # the readers reach file 1 in time
        time.sleep(0.01)
    assert 1 in pending.partitions_read()
    changed = frames[1].assign(f0=frames[1].f0 * 2)
    write_parquet([frames[0], changed, *frames[2:]], str(tmp_path), row_group_size=GROUP)
    stat = os.stat(paths[1])
    os.utime(paths[1], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a later mtime, whatever the clock's grain
    with pytest.raises(SourceReadError, match="changed after the dataset was opened"):
        epoch_of(ds)  # today's error, from the pass's own read
    assert claims == [False, False]
    ds.close()


@pytest.fixture
def failing_reads(monkeypatch):
    """An event that, while set, makes every partition read raise a ``SourceReadError``."""
    failing = threading.Event()
    for name in ("read_ranges", "read_rows"):
        original = getattr(PartitionReader, name)

        def read(self, *args, _original=original, **kwargs):
            if failing.is_set():
                raise SourceReadError("injected failure of part-0000.parquet")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(PartitionReader, name, read)
    begin = nextpass.begin

    def failing_begin(*args, **kwargs):
        failing.set()  # only the reads ahead fail (the pass's own reads are all done by now)
        begin(*args, **kwargs)

    monkeypatch.setattr(nextpass, "begin", failing_begin)
    return failing


def test_an_exception_in_the_read_ahead_is_dropped_and_read_again(root, claims, failing_reads):
    ds = make(root)
    first = epoch_of(ds)  # no exception here: the read ahead failed quietly
    assert failing_reads.is_set()
    pending = ds._read_ahead.pending
    pending.reads.reader._threads.threads[0].join(30)  # the reader stopped at the failure
    failing_reads.clear()
    references = fresh(root, 0), fresh(root, 1)
    assert same_batches(first, references[0])
    assert same_batches(epoch_of(ds), references[1])  # read again by the pass
    assert claims[:2] == [False, False]
    ds.close()


def test_a_lasting_failure_surfaces_in_the_pass_with_todays_error(root, failing_reads):
    ds = make(root)
    epoch_of(ds)
    with pytest.raises(SourceReadError, match="injected failure"):
        epoch_of(ds)
    ds.close()


def test_pickled_and_split_copies_carry_no_read_ahead(root, claims):
    ds = make(root)
    epoch_of(ds)
    assert ds._read_ahead.pending is not None  # the next pass's first buffer, read ahead
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._read_ahead.pending is None
    train, _ = ds.split(0.5)
    assert train._read_ahead.pending is None and ds._read_ahead.pending is not None
    assert same_batches(epoch_of(copy), fresh(root, 1))
    assert same_batches(epoch_of(ds), fresh(root, 1))
    assert claims == [False, False, True]
    ds.close()
    copy.close()


def test_persistent_workers_over_three_epochs_equal_a_fresh_loader_per_epoch(tmp_path, monkeypatch):
    root = write_files(tmp_path / "data", 2 * FILES)  # 4 buffers per worker
    taken = tmp_path / "claimed"
    claim = nextpass.claim

    def recorded(*args):  # inherited by the forked workers
        out = claim(*args)
        if out is not None:
            with open(taken, "a") as f:
                f.write("x")
        return out

    monkeypatch.setattr(nextpass, "claim", recorded)
    kwargs = {"num_workers": 2, "persistent_workers": True, "multiprocessing_context": "fork"}
    ds = make(root)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, **kwargs)
    epochs = [[tuple(b.numpy() for b in (batch,)) for batch in loader] for _ in range(3)]
    del loader
    for epoch, got in enumerate(epochs):
        reference = make(root, next_pass_seconds=0)
        reference.set_epoch(epoch)
        assert same_batches(got, collect(reference, {"num_workers": 2, "multiprocessing_context": "fork"}))
    # Each worker's first pass reads nothing ahead (a worker that is not persistent ends after it); from
    # its second pass on it does, so the third epoch's two workers took theirs.
    assert taken.read_text() == "xx"


def test_workers_that_are_not_persistent_end_cleanly(root):
    ds = make(root)
    epoch_of(ds)  # in this process first: epoch 1's first buffer read ahead
    ds.set_epoch(1)  # (kept)
    assert loader_threads()
    fork = {"num_workers": 2, "multiprocessing_context": "fork"}
    reference = make(root, next_pass_seconds=0)
    for epoch in (1, 2):
        got = collect(ds, fork)
        assert loader_threads() == []  # released before the fork: no reader inside pyarrow at a fork
        reference.set_epoch(epoch)
        assert same_batches(got, collect(reference, fork))  # (the main process's pass counter moves on)


def test_an_object_store_dataset_reads_its_next_pass_ahead_too(claims):
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from helpers import make_frames, s3_endpoint

    from dask_windows.planning.world import World

    s3 = s3_endpoint("nextpass", make_frames(seed=5, num_files=5, num_series=40, max_len=200))
    try:
        kwargs = dict(
            features=["f0", "f1"], series="sid", window=8, stride=2, batch_size=16, buffer_partitions=1,
            pieces_per_partition=1,
        )  # fmt: skip
        url, options = "s3://nextpass/data/", s3.storage_options()
        ds = dw.WindowDataset(url, storage_options=options, **kwargs)
        assert len(ds._plan(World()).units) >= 4
        passes = [epoch_of(ds) for _ in range(2)]
        ds.close()
        for epoch, got in enumerate(passes):
            reference = dw.WindowDataset(url, storage_options=options, next_pass_seconds=0, **kwargs)
            assert same_batches(got, epoch_of(reference, epoch))
        assert claims == [False, True]
    finally:
        s3.close()
