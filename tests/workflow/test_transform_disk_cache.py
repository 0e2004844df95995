"""The transformed reads kept on a local disk across epochs (``Workflow(cache_dir=)``, ``workflow.cache``).

The oracle is the same dataset without any cache: with most ranges on disk, the batches are equal,
bit for bit, every epoch, in this process and in DataLoader workers; a refit drops the files; a file
cut short or changed is read again; a full or unwritable disk goes on without the cache (one
warning); each process's files live in its own folder, removed with the dataset, and nothing else
in ``cache_dir`` is touched or read.
"""

from __future__ import annotations

import errno
import gc
import os
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from test_transform_cache import COLUMNS, HORIZON, WINDOW, make_workflow, read_rows

from dask_windows import WindowDataset
from dask_windows.errors import ConfigError
from dask_windows.planning.budget import PoolWarning
from dask_windows.workflow import Workflow
from dask_windows.workflow import cache as cache_module
from dask_windows.workflow.cache import FOLDER_PREFIX, TransformCache, TransformCacheWarning

#: Memory for about 2 of the 12 ranges an epoch reads: the others go to disk.
SMALL = 6_000


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from test_transform_cache import panel

    root = tmp_path_factory.mktemp("diskcache")
    panel().to_parquet(root / "p.parquet", row_group_size=150, index=False)
    return str(root)


@pytest.fixture(scope="module")
def fresh(data):
    """Three epochs of batches without any cache."""
    return run_epochs(data, make_workflow(0).fit(data, scheduler="sync"))[0]


def dataset(root: str, wf: Workflow) -> WindowDataset:
    return WindowDataset(root, workflow=wf.named(index=True), window=WINDOW, horizon=HORIZON, batch_size=40, seed=2,
                         buffer_bytes=80_000)  # fmt: skip


def run_epochs(
    root: str, wf: Workflow, n: int = 3, ds: WindowDataset | None = None
) -> tuple[list, list, WindowDataset]:
    """``n`` epochs of named batches of one dataset, and its cache's counters after each."""
    ds = ds if ds is not None else dataset(root, wf)
    out, counts = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PoolWarning)  # (the pool's mixing advice: small data on purpose)
        for epoch in range(n):
            ds.set_epoch(epoch)
            out.append([{k: v.numpy() for k, v in b.items()} for b in ds])
            c = ds.source.cache
            counts.append((c.hits, c.misses, c.disk_hits, c.held, c.disk_held))
    return out, counts, ds


def assert_same(got: list, want: list) -> None:
    assert len(got) == len(want)
    for epoch, (mine, theirs) in enumerate(zip(got, want)):
        assert len(mine) == len(theirs)
        for b, w in zip(mine, theirs):
            assert b.keys() == w.keys()
            for k in b:
                np.testing.assert_array_equal(b[k], w[k], err_msg=f"epoch {epoch}, {k}")


def files_in(folder: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, names in os.walk(folder) for f in names)


def folders(cache_dir) -> list[str]:
    return sorted(f for f in os.listdir(cache_dir) if f.startswith(FOLDER_PREFIX))


@pytest.mark.parametrize("cap", [None, 12_000])
def test_disk_tier_yields_the_batches_of_no_cache_every_epoch(data, fresh, tmp_path, cap):
    wf = make_workflow(SMALL).fit(data, scheduler="sync")
    wf.cache_dir, wf.cache_disk_bytes = tmp_path, cap
    got, counts, ds = run_epochs(data, wf)
    assert_same(got, fresh)
    cache = ds.source.cache
    written = files_in(cache.folder)
    assert written and all(os.path.dirname(f) == cache.folder for f in written)
    assert cache.disk_held == sum(os.path.getsize(f) for f in written) <= (cap or cache.disk_budget)
    assert cache.held <= SMALL and cache.damaged == 0
    (hits1, misses1, disk1, _, _), (hits3, misses3, disk3, _, _) = counts[0], counts[-1]
    if cap is None:  # everything kept: the 2nd and 3rd epochs read nothing, most of their hits from disk
        assert misses3 == misses1 and hits3 - hits1 >= 2 * misses1 and disk3 - disk1 > (hits3 - hits1) // 2
    else:  # what fits in 12,000 bytes is kept, the rest read again
        assert disk3 > 0 and misses3 > misses1


def test_ranges_come_back_bit_identical_and_read_only(tmp_path):
    cache = TransformCache(0, tmp_path, 1 << 20)
    rng = np.random.default_rng(0)
    ranges = {
        "floats": {"a": rng.standard_normal(37).astype(np.float32), "b": np.array([np.nan, -0.0, np.inf], np.float32)},
        "mixed": {"i": rng.integers(-9, 9, (5, 3)), "t": np.arange(7).astype("datetime64[ns]"), "k": np.ones(3, bool)},
        "empty": {"a": np.zeros(0, np.float32), "b": np.zeros((0, 2), np.float64)},
        "view": {"a": np.arange(20, dtype=np.float32)[3::2]},  # not contiguous
    }
    for key, columns in ranges.items():
        assert cache.find(key) is None
        cache.keep(key, columns)
    cache.keep("objects", {"s": np.array(["x", "y"], object)})  # Python objects: not written
    assert len(files_in(cache.folder)) == len(ranges) - 1 and cache.find("objects") is None  # (0 bytes: in memory)
    for key, columns in ranges.items():
        back = cache.find(key)
        assert back.keys() == columns.keys()
        for name, values in columns.items():
            assert back[name].dtype == values.dtype and back[name].shape == values.shape
            assert back[name].tobytes() == np.ascontiguousarray(values).tobytes()  # bit for bit (NaN, -0.0)
            assert not back[name].flags.writeable
    assert cache.disk_hits == len(ranges) - 1


def test_a_worker_writes_its_share_of_the_disk_bytes(tmp_path):
    cache = pickle.loads(pickle.dumps(TransformCache(0, tmp_path, 1_000)))  # (as a spawned worker gets it)
    cache.check("fitted", workers=2)  # one of a rank's 2 DataLoader workers: half the disk bytes
    for key in range(3):
        cache.keep(key, {"x": np.zeros(100, np.float32)})  # 400 bytes: one fits in 500
    assert cache.disk_limit == 500 and cache.disk_held == 400 and len(files_in(str(tmp_path))) == 1
    assert cache.find(0) is not None and cache.find(1) is None


def test_a_refit_drops_the_files(data, tmp_path):
    wf = make_workflow(0).fit(data, scheduler="sync")
    wf.cache_dir = tmp_path
    source = WindowDataset(data, workflow=wf, window=WINDOW, batch_size=40).source

    first = read_rows(source)
    before = files_in(source.cache.folder)
    np.testing.assert_array_equal(read_rows(source), first)
    assert len(before) == 1 and source.cache.disk_hits == 1
    other = str(tmp_path / "other")
    os.makedirs(other)
    from test_transform_cache import panel

    df = panel()
    df.assign(value=df["value"] * 3 + 7).to_parquet(os.path.join(other, "o.parquet"), index=False)
    wf.fit(other, scheduler="sync")  # other statistics: other outputs
    refit = make_workflow(0).fit(other, scheduler="sync")
    want = WindowDataset(data, workflow=refit, window=WINDOW, batch_size=40).source.read_rows(0, COLUMNS, 100, 250)
    np.testing.assert_array_equal(read_rows(source), np.stack([want[c] for c in COLUMNS]))
    assert not os.path.exists(before[0]) and len(files_in(source.cache.folder)) == 1
    assert source.cache.disk_hits == 1 and source.cache.misses == 2


@pytest.mark.parametrize("damage", ["cut short", "a byte changed", "removed"])
def test_a_damaged_file_is_read_again(data, fresh, tmp_path, damage):
    wf = make_workflow(SMALL).fit(data, scheduler="sync")
    wf.cache_dir = tmp_path
    got, counts, ds = run_epochs(data, wf, n=1)
    cache = ds.source.cache
    count = len(files_in(cache.folder))
    damaged = files_in(cache.folder)[:2]
    for path in damaged:
        if damage == "cut short":
            os.truncate(path, os.path.getsize(path) - 1)
        elif damage == "a byte changed":
            with open(path, "r+b") as f:
                f.seek(100)
                byte = f.read(1)
                f.seek(100)
                f.write(bytes([byte[0] ^ 1]))
        else:
            os.unlink(path)
    more, _, _ = run_epochs(data, wf, n=2, ds=ds)
    assert_same(got + more[1:], fresh[:2])
    assert cache.damaged == 2 and cache.misses == counts[0][1] + 2  # those two ranges read again, and written again
    assert not any(os.path.exists(p) for p in damaged) and len(files_in(cache.folder)) == count  # (new names)


@pytest.mark.parametrize("how", ["nearly full", "a write fails", "not a folder"])
def test_a_full_or_unwritable_disk_goes_on_without_it_warning_once(data, fresh, tmp_path, monkeypatch, how):
    wf = make_workflow(SMALL).fit(data, scheduler="sync")
    wf.cache_dir = tmp_path
    if how == "nearly full":
        monkeypatch.setattr(cache_module, "KEEP_FREE", 1 << 62)
    elif how == "a write fails":
        calls = []

        def full(path, columns, layout):  # the disk fills after two files
            calls.append(path)
            if len(calls) > 2:
                raise OSError(errno.ENOSPC, "No space left on device", path)
            return real(path, columns, layout)

        real = cache_module._write_file
        monkeypatch.setattr(cache_module, "_write_file", full)
    else:
        (tmp_path / "file").write_text("not a folder")
        wf.cache_dir = tmp_path / "file"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = dataset(data, wf)
        got, _, _ = run_epochs(data, wf, ds=ds)
    said = [str(w.message) for w in caught if issubclass(w.category, TransformCacheWarning)]
    assert len(said) == 1 and "stops writing" in said[0] and "cache_dir" in said[0]
    assert_same(got, fresh)
    cache = ds.source.cache
    kept = {"nearly full": 0, "a write fails": 2, "not a folder": 0}[how]
    assert len(files_in(cache.folder)) == kept if cache.folder else kept == 0
    assert cache.disk_hits >= 2 * kept and (cache.disk_hits == 0) == (kept == 0)  # what was written is read back


def test_each_process_writes_in_its_own_folder_removed_with_the_dataset(data, tmp_path):
    (tmp_path / "theirs.txt").write_text("a user's file")
    old = tmp_path / (FOLDER_PREFIX + "an-earlier-run")
    old.mkdir()
    (old / "1.bin").write_bytes(b"\0" * 4096)  # an earlier run's leftover: never read, never removed
    wf = make_workflow(SMALL).fit(data, scheduler="sync")
    wf.cache_dir = tmp_path
    _, _, ds = run_epochs(data, wf, n=2)
    folder = ds.source.cache.folder
    assert os.path.dirname(folder) == str(tmp_path) and files_in(folder)
    copy = pickle.loads(pickle.dumps(ds.source.cache))  # (as a spawned DataLoader worker gets it)
    copy.keep("k", {"a": np.zeros(100_000, np.float32)})
    assert os.path.dirname(copy.folder) == folder  # inside the opening process's folder
    ds.close()
    del ds, copy
    gc.collect()
    assert not os.path.exists(folder)
    assert sorted(os.listdir(tmp_path)) == sorted(["theirs.txt", old.name]) and (old / "1.bin").exists()


def test_the_folder_is_removed_at_exit(tmp_path):
    script = (
        "import sys, numpy as np\n"
        "from dask_windows.workflow.cache import TransformCache\n"
        "cache = TransformCache(0, sys.argv[1], 1 << 20)\n"
        "cache.keep('k', {'a': np.zeros(1000, np.float32)})\n"
        "assert cache.find('k') is not None\n"
        "print(cache.folder)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))}
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(tmp_path)) and os.listdir(tmp_path) == []


def test_dataloader_workers_yield_the_batches_of_no_cache(data, fresh, tmp_path):
    wf = make_workflow(SMALL).fit(data, scheduler="sync")
    wf.cache_dir = tmp_path
    ds = dataset(data, wf)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    folder = ds.source.cache.folder
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PoolWarning)
        for epoch, want in enumerate(fresh):
            ds.set_epoch(epoch)
            got = [{k: v.numpy() for k, v in b.items()} for b in loader]
            for k in want[0]:  # the same windows (the workers interleave their batches): in start-row order
                mine, theirs = (np.concatenate([b[k] for b in part]) for part in (got, want))
                order = [np.argsort(np.concatenate([b["index"] for b in part]), kind="stable") for part in (got, want)]
                np.testing.assert_array_equal(mine[order[0]], theirs[order[1]], err_msg=f"epoch {epoch}, {k}")
            if epoch == 0:  # each worker writes in a folder of its own, inside the opening process's
                inside = [f for f in os.listdir(folder) if f.startswith(FOLDER_PREFIX)]
                assert len(inside) == 2 and all(files_in(os.path.join(folder, f)) for f in inside)
                written = files_in(folder)
    assert files_in(folder) == written  # the later epochs read the files back, writing none
    del loader  # the persistent workers end: their folders go with them
    gc.collect()
    assert not [f for f in os.listdir(folder) if f.startswith(FOLDER_PREFIX)]
    assert folders(tmp_path) == [os.path.basename(folder)]


def test_cache_dir_and_cache_disk_bytes_are_checked_and_not_saved(data, tmp_path):
    with pytest.raises(ConfigError, match="cache_dir=5"):
        make_workflow(0).cache_dir = 5  # type: ignore[assignment]
    with pytest.raises(ConfigError, match="cache_dir='s3://b/x'.*local"):
        make_workflow(0).cache_dir = "s3://b/x"
    with pytest.raises(ConfigError, match="cache_disk_bytes=-1"):
        make_workflow(0).cache_disk_bytes = -1
    wf = make_workflow(0)
    assert wf.cache_dir is None and wf.cache_disk_bytes is None
    wf.cache_dir, wf.cache_disk_bytes = tmp_path, 1 << 20
    assert wf.cache_dir == str(tmp_path)
    wf.fit(data, scheduler="sync").save(str(tmp_path / "wf.json"))  # a loader setting: not in the file
    loaded = Workflow.load(str(tmp_path / "wf.json"))
    assert loaded.cache_dir is None and loaded.cache_disk_bytes is None
