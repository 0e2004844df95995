"""The local cache of remote partitions, against a real S3 endpoint on 127.0.0.1 with a request counter."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import forkrun
import numpy as np
import pytest
from helpers import collect, make_frames, oracle_starts, parquet_bytes, s3_endpoint, same_batches, skip_unless_installed

from dask_windows.dataset import WindowDataset
from dask_windows.errors import ConfigError
from dask_windows.sources.cache import OWN_FOLDER, TEMP_PREFIX, RangeCache
from dask_windows.sources.parquet.footer_index import INDEX_NAME

skip_unless_installed("s3fs", "moto")


# next_pass_seconds=0: GETs are counted per epoch; a pass's read-ahead of the next one's first units
# (speedups/nextpass) would make them while the next count runs.
KW = dict(
    features=["f0", "f1"], targets=["y"], series="sid", window=8, stride=2, batch_size=16, return_index=True,
    next_pass_seconds=0,
)  # fmt: skip
HERE = os.path.dirname(os.path.abspath(os.path.dirname(__file__)))
ROOT = os.path.dirname(HERE)


def _parquet_bytes(frame) -> bytes:
    return parquet_bytes(frame, row_group_size=17)


@pytest.fixture(scope="module")
def s3():
    endpoint = s3_endpoint("bucket", make_frames(seed=5, num_files=5))
    yield endpoint
    endpoint.close()


_same = same_batches


def _data_gets(s3) -> int:
    """GETs of object data (footer tails at open are ``bytes=-N`` suffix ranges; the look for a dataset index
    at open, one GET answered 404 here, reads no object data)."""
    return len(_data_paths(s3, unique=False))


def _data_paths(s3, unique: bool = True) -> Any:
    paths = [
        r.path
        for r in s3.log.requests
        if r.kind == "get" and not (r.range or "").startswith("bytes=-") and not r.path.endswith(INDEX_NAME)
    ]
    return set(paths) if unique else paths


def test_second_epoch_and_second_open_make_no_get(s3, tmp_path):
    url, options = "s3://bucket/data/", s3.storage_options()
    plain = WindowDataset(url, storage_options=options, **KW)
    s3.reset()
    ds = WindowDataset(url, storage_options=options, cache_dir=tmp_path / "c", **KW)
    assert s3.log.count("head") == 0  # versions come from the listing
    assert _data_gets(s3) <= len(ds.partitions)  # the series scan (none when the footer read held it)
    for epoch in (0, 1):
        plain.set_epoch(epoch)
        ds.set_epoch(epoch)
        s3.reset()
        got = collect(ds)
        if epoch == 0:  # one GET per partition (per piece of one, when partitions are read in pieces)
            assert _data_gets(s3) >= len(ds.partitions)
        else:
            assert _data_gets(s3) == 0
        assert _same(got, collect(plain))
    # A new job on the same machine: footers again (that is how a change is seen), no data GET.
    s3.reset()
    again = WindowDataset(url, storage_options=options, cache_dir=tmp_path / "c", **KW)
    again.set_epoch(1)
    assert _data_gets(s3) == 0 and s3.log.count("get") >= len(s3.frames)
    got = collect(again, {"num_workers": 2})
    assert _data_gets(s3) == 0
    plain.set_epoch(1)  # plain was iterated in epoch 1 already: without this its next pass is epoch 2
    assert _same(got, collect(plain, {"num_workers": 2}))


def test_concurrent_processes_share_the_cache(s3, tmp_path):
    """Two processes at once, each reading one cache without a budget, then another under a tiny one."""
    shared, tiny, budget = tmp_path / "shared", tmp_path / "tiny", 3000  # tiny: a few entries, always evicting
    want = collect(WindowDataset("s3://bucket/data/", storage_options=s3.storage_options(), **KW))
    procs = [_child(s3, [(shared, None, 1), (tiny, budget, 2)], tmp_path / f"out{i}.npz") for i in range(2)]
    _wait(procs)
    for i in range(2):
        with np.load(tmp_path / f"out{i}.npz") as got:
            for run in range(3):  # every epoch of every process yields the uncached batches
                assert [got[f"r{run}_{k}"].tolist() for k in range(len(want))] == [b[-1].tolist() for b in want]
    for cache in (shared, tiny):
        assert not [n for n in os.listdir(cache / OWN_FOLDER) if n.startswith(TEMP_PREFIX)]
    assert RangeCache(tiny).disk_bytes() <= budget
    s3.reset()
    collect(WindowDataset("s3://bucket/data/", storage_options=s3.storage_options(), cache_dir=shared, **KW))
    assert _data_gets(s3) == 0  # what the two processes stored serves a third


def test_budget_is_never_exceeded(s3, tmp_path, monkeypatch):
    seen = []
    store = RangeCache._store

    def watched(self, entries):
        store(self, entries)
        seen.append(self.disk_bytes())

    monkeypatch.setattr(RangeCache, "_store", watched)
    url, options = "s3://bucket/data/", s3.storage_options()
    unbounded = WindowDataset(url, storage_options=options, cache_dir=tmp_path / "all", **KW)
    collect(unbounded)
    total = unbounded.source.cache.disk_bytes()
    budget = total // 2
    ds = WindowDataset(url, storage_options=options, cache_dir=tmp_path / "half", cache_bytes=budget, **KW)
    seen.clear()
    for epoch in range(3):
        ds.set_epoch(epoch)
        s3.reset()
        plain = WindowDataset(url, storage_options=options, **KW)
        plain.set_epoch(epoch)  # the same epoch's order: its reads are what the cache may spare
        collect(plain)
        uncached = _data_gets(s3)
        s3.reset()
        collect(ds)
        assert 0 < _data_gets(s3) <= uncached  # part of the epoch is cached, not all of it
    assert seen and max(seen) <= budget < total
    with pytest.raises(ConfigError, match="cache_bytes"):
        WindowDataset(url, storage_options=options, cache_dir=tmp_path / "x", cache_bytes=-1, **KW)


def test_changed_object_is_fetched_again(s3, tmp_path):
    prefix, cache = "bucket/changing", tmp_path / "c"
    frames = make_frames(seed=9, num_files=3)
    for i, frame in enumerate(frames):
        s3.fs.pipe(f"{prefix}/part-{i:04d}.parquet", _parquet_bytes(frame))
    url, options = f"s3://{prefix}/", s3.storage_options()
    collect(WindowDataset(url, storage_options=options, cache_dir=cache, **KW))
    # Same rows and size, other values: only the ETag tells.
    changed = frames[1].copy()
    changed["f1"] = changed["f1"][::-1].to_numpy()
    s3.fs.pipe(f"{prefix}/part-0001.parquet", _parquet_bytes(changed))
    s3.reset()
    ds = WindowDataset(url, storage_options=options, cache_dir=cache, **KW)
    got = collect(ds)
    assert _data_paths(s3) == {f"/{prefix}/part-0001.parquet"}
    assert _same(got, collect(WindowDataset(url, storage_options=options, **KW)))


def test_killed_writer_leaves_nothing_a_reader_takes(s3, tmp_path):
    cache = tmp_path / "c"
    proc = _child(s3, [(cache, None, 1)], tmp_path / "never.npz", die_mid_write=True)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == -9, out
    leftovers = [n for n in os.listdir(cache / OWN_FOLDER) if n.startswith(TEMP_PREFIX)]
    assert len(leftovers) == 1 and not [n for n in os.listdir(cache / OWN_FOLDER) if n.endswith(".bin")]
    ds = WindowDataset("s3://bucket/data/", storage_options=s3.storage_options(), cache_dir=cache, **KW)
    plain = WindowDataset("s3://bucket/data/", storage_options=s3.storage_options(), **KW)
    s3.reset()
    want = collect(plain)
    uncached = _data_gets(s3)
    assert _same(collect(ds), want)
    assert not [n for n in os.listdir(cache / OWN_FOLDER) if n.startswith(TEMP_PREFIX)]  # the next writer removed it
    # Entries cut short under their final names (a disk that lost a write) are not taken either.
    entries = [os.path.join(cache, OWN_FOLDER, n) for n in os.listdir(cache / OWN_FOLDER) if n.endswith(".bin")]
    for entry in entries:
        with open(entry, "r+b") as f:
            f.truncate(10)
    s3.reset()
    ds.set_epoch(0)  # the order of `want` again (a second pass would take epoch 1)
    assert _same(collect(ds), want)
    assert 0 < _data_gets(s3) <= uncached  # the entries cut short are fetched again
    assert sum(os.path.getsize(e) != 10 for e in entries if os.path.exists(e)) > 0  # stored again, whole


def _child(s3, runs: list, out, die_mid_write: bool = False) -> subprocess.Popen:
    """A process reading epoch 0 for each ``(cache_dir, cache_bytes, epochs)`` of ``runs`` (a DataLoader
    worker for the second epoch of a run), saving every batch's start rows in ``out``."""
    runs = [(str(c), b, e) for c, b, e in runs]
    code = f"""
import os, signal, sys
import numpy as np
sys.path.insert(0, {HERE!r})
from helpers import collect
from dask_windows.dataset import WindowDataset
from dask_windows.sources import cache as cache_module
if {die_mid_write!r}:
    real = os.fdopen
    def dying(fd, mode):
        f = real(fd, mode)
        f.write(b"half an entry")
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    cache_module.os.fdopen = dying
saved, n = {{}}, 0
for cache, budget, epochs in {runs!r}:
    ds = WindowDataset("s3://bucket/data/", storage_options={s3.storage_options()!r}, cache_dir=cache,
                       cache_bytes=budget, **{KW!r})
    for epoch in range(epochs):
        ds.set_epoch(0)  # the same order every pass, to compare with one uncached pass
        batches = collect(ds, {{"num_workers": 1}} if epoch == 1 else None)
        saved.update({{f"r{{n}}_{{k}}": b[-1] for k, b in enumerate(batches)}})
        n += 1
np.savez({str(out)!r}, **saved)
"""
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    return forkrun.popen([sys.executable, "-c", code], env=env)


def _wait(procs: list) -> None:
    try:
        for p in procs:
            out, _ = p.communicate(timeout=180)
            assert p.returncode == 0, out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()


def test_oracle_still_holds_through_the_cache(s3, tmp_path):
    ds = WindowDataset("s3://bucket/data/", storage_options=s3.storage_options(), cache_dir=tmp_path, **KW)
    for _ in range(2):
        starts = np.sort(np.concatenate([b[-1] for b in collect(ds)]))
        assert np.array_equal(starts, oracle_starts(s3.frames, "sid", 8, 2))
    assert ds.source.cache.hits > 0


def test_budget_of_half_the_data_hits_about_half_in_epoch_two(s3, tmp_path, monkeypatch):
    """A scan over twice the budget keeps what it stored (LRU evicted every entry before its next read)."""
    url, options = "s3://bucket/data/", s3.storage_options()
    kw = dict(KW, shuffle=False, buffer_partitions=1)  # a cyclic scan: the same order every epoch
    stored, store = [], RangeCache._store

    def watched(self, entries):
        stored.append(sum(len(blob) + 4 for _, blob in entries))  # each read's entries, CRC included
        store(self, entries)

    monkeypatch.setattr(RangeCache, "_store", watched)
    whole = WindowDataset(url, storage_options=options, cache_dir=tmp_path / "all", **kw)
    collect(whole)
    reads, sizes = whole.source.cache.misses, list(stored)  # one fetch per partition read in an epoch
    budget = whole.source.cache.disk_bytes() // 2
    held, kept = 0, 0  # oracle: reads stored while they fit, in read order, the others never
    for size in sizes:
        if held + size <= budget:
            held, kept = held + size, kept + 1
    ds = WindowDataset(url, storage_options=options, cache_dir=tmp_path / "half", cache_bytes=budget, **kw)
    cache = ds.source.cache
    collect(ds)
    assert (cache.hits, cache.misses) == (0, reads)
    ds.set_epoch(1)
    collect(ds)
    assert cache.hits == kept and cache.misses == 2 * reads - kept
    assert 0.3 * reads <= kept  # about half: what half the bytes hold
    assert RangeCache(tmp_path / "half").disk_bytes() <= budget


def test_stale_entries_make_room_and_fresh_ones_are_kept():
    from dask_windows.sources.cache_policy import evictions

    now, hour = 10**18, 3600 * 10**9
    entries = [(now - 30 * hour, "a", 40), (now - 13 * hour, "b", 30), (now - hour, "c", 20)]
    assert evictions(entries, 90, 100, 10, now) == []  # fits
    assert evictions(entries, 90, 100, 40, now) == [0]  # the oldest stale one goes
    assert evictions(entries, 90, 100, 75, now) == [0, 1]
    assert evictions(entries, 90, 100, 81, now) is None  # 'c' was used an hour ago: kept, not stored
    assert evictions(entries, 90, 100, 101, now) is None
    assert evictions(entries, 90, None, 10**9, now) == []
    assert evictions(entries, 90, 100, 40, now, keep_seconds=0) == [0]
