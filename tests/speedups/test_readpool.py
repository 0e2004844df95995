"""read_workers: real worker processes decode whole buffers; batches bit for bit those of read_workers=0.

The pool is checked on its own (tickets, errors as themselves, a killed worker, objects travelling once)
and through ``WindowDataset``: every window once per epoch against the brute-force oracle, the same
batches as ``read_workers=0`` for a seed, resume, a second iterator, one pool for all passes.
"""

from __future__ import annotations

import os
import re
import signal
import time

import numpy as np
import pytest
from helpers import make_frames, oracle_starts, write_parquet

from dask_windows.errors import SourceReadError
from dask_windows.runtime.buffer import Part
from dask_windows.speedups.handoff import shared_empty
from dask_windows.speedups.readpool import ReadPool, pool_for

ROWS = 50_000  # (4, ROWS) float32 = 800 kB: travels through shared memory
READY_S = 120  # generous: the forkserver imports torch once, on a loaded machine


def read(i: int) -> Part:
    if i < 0:
        raise SourceReadError(f"s3://bucket/part-{-i}.parquet is unreadable: boom; check the object")
    x = np.arange(4 * ROWS, dtype=np.float32).reshape(4, ROWS) + i
    y = np.full((1, 10), i, np.int64)  # small: pickled inline
    return Part(i, f"part-{i}", x, y, np.zeros(0, np.int64), np.array([i], np.int64))


def read_arena(i: int) -> list:
    """One array allocated shared and two parts viewing it, each listed twice (as a unit's segments)."""
    base = shared_empty((4, ROWS), np.float32)
    base[...] = np.arange(4 * ROWS, dtype=np.float32).reshape(4, ROWS) + i
    a = Part(i, "a", base[:, :100], None, np.zeros(0, np.int64), np.zeros(0, np.int64), arena=(base, None, 0))
    b = Part(i, "b", base[:, 100:], None, np.zeros(0, np.int64), np.zeros(0, np.int64), arena=(base, None, 100))
    return [a, a, b, b]


def kill_self(i: int) -> Part:
    if i == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return read(i)


def shm_entries(pids=()) -> set[str]:
    """``/dev/shm`` names this test could leave: every name but those that carry another process's pid
    (torch's ``torch_<pid>_...`` and joblib/loky's ``sem.loky-<pid>-...``: another job's DataLoader workers
    or Dask/joblib pools on the same machine, or another pytest-xdist worker's, which may end while the
    test runs). Such names count for this process, its live children and ``pids`` (read workers, dead or
    alive: a killed worker's leak is seen). The pool's own memory has no name at all."""
    if not os.path.isdir("/dev/shm"):
        return set()
    import multiprocessing

    ours = {str(os.getpid()), *(str(p.pid) for p in multiprocessing.active_children()), *map(str, pids)}

    holders: dict[str, set[str]] = {}  # /dev/shm name -> pids that map it (a named semaphore is mapped)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    if "/dev/shm/" in line:
                        holders.setdefault(line.rsplit("/dev/shm/", 1)[1].split()[0], set()).add(pid)
        except OSError:  # gone, or not ours to read
            continue

    def foreign(name: str) -> bool:
        found = re.match(r"(?:torch_|sem\.loky-)(\d+)[_-]", name)
        if found is not None:
            return found.group(1) not in ours
        held = holders.get(name, set())
        if name.startswith("sem.mp-"):
            # multiprocessing's named semaphores (queues and locks of a spawn or forkserver context): the
            # pool makes none (pipes and socket pairs only), so one is ours only where our processes map
            # it; others come and go with other jobs (another xdist worker's or session's DataLoader
            # queues, left until their resource tracker ends when their owner was killed)
            return not held & ours
        return bool(held) and not held & ours

    # a name must outlive a short pause: multiprocessing's ``sem.mp-*`` semaphores of any process on the
    # machine (another suite's DataLoader queues) are unlinked right after they are made, so a listing
    # can catch one in passing; what leaks stays.
    first = set(os.listdir("/dev/shm"))
    time.sleep(0.2)
    return {n for n in first & set(os.listdir("/dev/shm")) if not foreign(n)}


@pytest.fixture
def pool_of():
    pools = []

    def make(fn, workers: int) -> ReadPool:
        pool = ReadPool(fn, workers)
        pools.append(pool)
        assert pool.wait_ready(READY_S)
        return pool

    yield make
    for pool in pools:
        pool.close()


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_results_come_back_per_ticket_with_equal_values(pool_of, workers):
    pool = pool_of(read, workers)
    keys = [5, 0, 3, 3, 9, 1, 2]
    tickets = [pool.submit(k) for k in keys]
    for key, ticket in reversed(list(zip(keys, tickets))):  # any order of taking
        part, expect = pool.result(ticket), read(key)
        np.testing.assert_array_equal(part.x, expect.x)
        np.testing.assert_array_equal(part.y, expect.y)
        assert part.name == expect.name and part.x.dtype == np.float32 and part.x.shape == (4, ROWS)
    assert pool.submitted == len(keys) and len({p.pid for p in pool.processes}) == workers


def test_an_object_travels_once_and_views_stay_views(pool_of):
    pool = pool_of(read_arena, 1)
    a, a2, b, b2 = pool.result(pool.submit(7))
    assert a is a2 and b is b2  # a unit's part is one object for its segments (Buffer holds it once)
    base = a.arena[0]
    assert b.arena[0] is base and np.shares_memory(a.x, base) and np.shares_memory(b.x, base)
    expect = np.arange(4 * ROWS, dtype=np.float32).reshape(4, ROWS) + 7
    np.testing.assert_array_equal(base, expect)
    np.testing.assert_array_equal(a.x, expect[:, :100])
    np.testing.assert_array_equal(b.x, expect[:, 100:])


def test_an_error_in_a_worker_is_raised_as_itself_and_the_pool_goes_on(pool_of):
    pool = pool_of(read, 2)
    bad, good = pool.submit(-7), pool.submit(4)
    with pytest.raises(SourceReadError, match=r"s3://bucket/part-7\.parquet is unreadable"):
        pool.result(bad)
    assert pool.result(good).index == 4 and pool.alive


def test_a_killed_worker_is_an_error_not_a_hang_and_leaves_no_shared_memory(pool_of):
    before = shm_entries()
    pool = pool_of(kill_self, 1)
    first, doomed = pool.submit(0), pool.submit(2)
    assert pool.result(first).index == 0
    with pytest.raises(RuntimeError, match=r"read worker dask-windows-read-0 \(pid \d+\) exited unexpectedly"):
        pool.result(doomed)
    assert pool.broken and not pool.alive
    with pytest.raises(RuntimeError, match="exited unexpectedly"):
        pool.submit(1)
    assert shm_entries([p.pid for p in pool.processes]) - before == set()


def killed_mid_segment(i: int) -> Part:
    """Read ``i``; at 2, die as torch's allocation would between naming a segment and unlinking it."""
    if i == 2:
        fd = os.open(f"/dev/shm/torch_{os.getpid()}_12345_0", os.O_CREAT | os.O_RDWR, 0o600)
        os.ftruncate(fd, 1 << 20)
        os.kill(os.getpid(), signal.SIGKILL)
    return read(i)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_a_worker_killed_inside_a_shared_allocation_leaves_no_name_in_dev_shm(pool_of):
    other = f"/dev/shm/torch_{os.getpid()}_12345_0"  # a live process's name: never touched
    with open(other, "wb"):
        pass
    try:
        pool = pool_of(killed_mid_segment, 1)
        pid = pool.processes[0].pid
        doomed = pool.submit(2)
        with pytest.raises(RuntimeError, match="exited unexpectedly"):
            pool.result(doomed)
        deadline = time.monotonic() + 10
        while pool.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        pool.close()
        assert not os.path.exists(f"/dev/shm/torch_{pid}_12345_0")  # the dead worker's, unlinked
        assert os.path.exists(other)
    finally:
        os.unlink(other)


def test_close_stops_workers_and_fails_what_was_pending(pool_of):
    pool = pool_of(read, 2)
    ticket = pool.submit(1)
    pool.close()
    assert not pool.alive
    with pytest.raises(RuntimeError):
        pool.submit(2)
    try:  # done before the close, or failed by it: never a hang
        assert pool.result(ticket).index == 1
    except RuntimeError as exc:
        assert "closed" in str(exc)
    with pytest.raises(ValueError, match="num_workers=0"):
        ReadPool(read, 0)


# -- through WindowDataset --------------------------------------------------------------------------

FEATURES = ["f0", "f1"]
SETTINGS = dict(features=FEATURES, series="sid", window=16, stride=3, batch_size=64, return_index=True, seed=5)
SETTINGS.update(buffer_partitions=1, pieces_per_partition=1)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    frames = make_frames(seed=11, num_files=6, num_series=40, min_len=20, max_len=3000)
    root = str(tmp_path_factory.mktemp("readpool"))
    write_parquet(frames, root, row_group_size=900)
    return root, frames


def open_ds(root: str, read_workers: int, **kw):
    from dask_windows.dataset import WindowDataset

    ds = WindowDataset(root, read_workers=read_workers, **{**SETTINGS, **kw})
    if read_workers:
        assert pool_for(ds._pool_reads, read_workers, ds._read_values()).wait_ready(
            READY_S
        )  # so that buffers after the first go to it
    return ds


def epoch(ds, e: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    ds.set_epoch(e)
    return [(x.numpy().copy(), i.numpy().copy()) for x, i in ds]


def assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for (x0, i0), (x1, i1) in zip(a, b):
        np.testing.assert_array_equal(i0, i1)
        np.testing.assert_array_equal(x0, x1)


@pytest.mark.parametrize("workers", [1, 2])
def test_every_window_once_and_the_batches_of_read_workers_0(data, workers):
    root, frames = data
    plain = open_ds(root, 0)
    pooled = open_ds(root, workers)
    pool = pool_for(pooled._pool_reads, workers, pooled._read_values())
    for e in (0, 1):
        expect, got = epoch(plain, e), epoch(pooled, e)
        assert_same(got, expect)
        starts = np.concatenate([i for _, i in got])
        np.testing.assert_array_equal(np.sort(starts), oracle_starts(frames, "sid", 16, 3))  # each once
        x = np.concatenate([x for x, _ in got])  # f0 is the global row: windows hold their own rows
        np.testing.assert_array_equal(x[:, 0, :], starts[:, None] + np.arange(16))
    assert pool_for(pooled._pool_reads, workers, pooled._read_values()) is pool and pool.submitted >= 2 * (
        len(frames) - 2
    )  # buffers 2.. by workers
    pooled.close()
    assert not pool.alive


def test_one_pool_for_every_pass_and_a_second_iterator(data):
    root, _ = data
    plain = open_ds(root, 0)
    expect, expect_next = epoch(plain, 3), epoch(plain, 4)
    ds = open_ds(root, 2)
    pids = [p.pid for p in pool_for(ds._pool_reads, 2, ds._read_values()).processes]
    ds.set_epoch(3)
    first, second = iter(ds), iter(ds)
    a, b = [], []
    for x, i in first:  # interleaved: both passes share the workers
        a.append((x.numpy().copy(), i.numpy().copy()))
        pair = next(second, None)
        if pair is not None:
            b.append((pair[0].numpy().copy(), pair[1].numpy().copy()))
    b += [(x.numpy().copy(), i.numpy().copy()) for x, i in second]
    assert_same(a, expect)
    assert_same(b, expect_next)  # a pass started while another runs takes the next epoch (see epochs)
    peek = iter(ds)
    next(peek)
    del peek  # a pass dropped early: its reads are discarded, the pool stays
    assert_same(epoch(ds, 3), expect)
    assert [p.pid for p in pool_for(ds._pool_reads, 2, ds._read_values()).processes] == pids
    ds.close()


def test_resume_mid_epoch_and_normalized_values(data):
    root, _ = data
    kw = dict(normalize={"mean": np.array([1.0, 2.0], np.float32), "std": np.array([3.0, 0.5], np.float32)})
    expect = epoch(open_ds(root, 0, **kw), 2)
    ds = open_ds(root, 2, **kw)
    ds.set_epoch(2)
    it = iter(ds)
    for _ in range(40):
        next(it)
    state = ds.state_dict()
    del it
    ds.close()
    again = open_ds(root, 1, **kw)
    again.load_state_dict(state)
    rest = [(x.numpy().copy(), i.numpy().copy()) for x, i in again]
    assert_same(rest, expect[40:])
    again.close()


def test_a_killed_read_worker_is_an_error_or_nothing_never_a_hang(data):
    root, _ = data
    expect = epoch(open_ds(root, 0), 0)
    before = shm_entries()
    ds = open_ds(root, 2)
    pool = pool_for(ds._pool_reads, 2, ds._read_values())
    workers = [p.pid for p in pool.processes]
    it = iter(ds)
    got = [next(it)]
    for proc in pool.processes:
        os.kill(proc.pid, signal.SIGKILL)
    try:  # buffers already handed over complete the pass; one still held by a worker fails it
        got += list(it)
        assert len(got) == len(expect)
    except RuntimeError as exc:
        assert "read worker" in str(exc) and "exited unexpectedly" in str(exc)
    del it
    assert_same(epoch(ds, 0), expect)  # the next pass starts new workers
    again = pool_for(ds._pool_reads, 2, ds._read_values())
    assert again is not pool
    assert again.wait_ready(READY_S)  # started on the pool's thread: a worker may not have started yet
    workers += [p.pid for p in again.processes]
    ds.close()
    assert shm_entries(workers) - before == set()


def test_read_workers_are_validated(data):
    root, _ = data
    with pytest.raises(ValueError, match="read_workers"):
        open_ds(root, -1)


def test_skipped_partitions_travel_back_with_their_warnings(tmp_path):
    import warnings

    import pyarrow.parquet as pq

    from dask_windows.faults import SkippedPartitionWarning

    frames = make_frames(seed=11, num_files=6, num_series=30, min_len=20, max_len=800)
    paths = write_parquet(frames, str(tmp_path), row_group_size=300)
    meta = pq.read_metadata(paths[3])
    with open(paths[3], "r+b") as f:  # f0's pages of file 3 become garbage; its footer stays valid
        for g in range(meta.num_row_groups):
            for j in range(meta.num_columns):
                chunk = meta.row_group(g).column(j)
                if chunk.path_in_schema == "f0":
                    f.seek(min(o for o in (chunk.dictionary_page_offset, chunk.data_page_offset) if o))
                    f.write(b"\xff" * chunk.total_compressed_size)
    plain, pooled = open_ds(str(tmp_path), 0, on_error="skip"), open_ds(str(tmp_path), 2, on_error="skip")

    def skips(ds, e: int) -> tuple[list, list[str]]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            batches = epoch(ds, e)
        return batches, [str(w.message) for w in caught if issubclass(w.category, SkippedPartitionWarning)]

    for e in range(4):
        (expect, warned), (got, warned_here) = skips(plain, e), skips(pooled, e)
        assert_same(got, expect)
        assert len(warned_here) == len(warned) > 0 and all("part-0003" in m for m in warned_here)  # in this process
    assert [(s.name, s.stage) for s in pooled.skipped] == [(s.name, s.stage) for s in plain.skipped]
    assert pool_for(pooled._pool_reads, 2, pooled._read_values()).submitted > 0
    pooled.close()


def test_a_collected_dataset_stops_its_workers_and_dataloader_workers_ignore_them(data):
    import gc
    import pickle

    import torch

    root, _ = data
    ds = open_ds(root, 1)
    pool = pool_for(ds._pool_reads, 1, ds._read_values())
    expect = epoch(open_ds(root, 0), 0)
    again = pickle.loads(pickle.dumps(ds))  # the pool is not part of the dataset's state
    loader = torch.utils.data.DataLoader(again, batch_size=None, num_workers=1)
    got = [(x.numpy().copy(), i.numpy().copy()) for x, i in loader]  # the workers read on their threads
    assert_same(got, expect)
    assert pool.alive
    del ds
    gc.collect()
    assert not pool.alive
