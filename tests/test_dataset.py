"""WindowDataset over local Parquet against a brute-force pandas/numpy oracle."""

from __future__ import annotations

import os
import pickle
import threading
import tracemalloc

import forkrun
import numpy as np
import pandas as pd
import pytest
import torch
from helpers import collect, make_frames, oracle_starts, write_parquet

import dask_windows as dw


@pytest.fixture(scope="module")
def frames():
    return make_frames(seed=1, num_files=5, num_series=14, min_len=2, max_len=90)


@pytest.fixture(scope="module")
def root(frames, tmp_path_factory):
    path = tmp_path_factory.mktemp("ds")
    write_parquet(frames, str(path), row_group_size=37)
    return str(path)


def make(root, **kw):
    args = dict(features=["f0", "f1", "f2"], series="sid", window=8, batch_size=16, return_index=True)
    args.update(kw)
    return dw.WindowDataset(root, **args)


def check_values(batches, full, window, horizon, layout="NCL", targets=True):
    """Every yielded window holds exactly the rows it claims, and y the rows it should."""
    feats = full[["f0", "f1", "f2"]].to_numpy(np.float32)
    for batch in batches:
        x, idx = batch[0], batch[-1]
        rows = idx[:, None] + np.arange(window)  # (B, L)
        expect = feats[rows]  # (B, L, C)
        assert np.array_equal(x, expect.transpose(0, 2, 1) if layout == "NCL" else expect)
        if targets:
            y = batch[1]
            tg = full[["y", "z"]].to_numpy(np.float32)
            if horizon:
                hrows = idx[:, None] + window + np.arange(horizon)  # (B, H)
                assert np.array_equal(y, tg[hrows].transpose(0, 2, 1))
            else:
                assert np.array_equal(y, tg[idx + window - 1])


@pytest.mark.parametrize("window,stride,horizon", [(1, 1, 0), (8, 1, 0), (8, 3, 2), (20, 5, 0), (4, 2, 7)])
@pytest.mark.parametrize("layout", ["NCL", "NLC"])
def test_coverage_and_values_match_oracle(frames, root, window, stride, horizon, layout):
    ds = make(root, targets=["y", "z"], window=window, stride=stride, horizon=horizon, layout=layout)
    batches = collect(ds)
    idx = np.concatenate([b[-1] for b in batches])
    expected = oracle_starts(frames, "sid", window, stride, horizon)
    assert np.array_equal(np.sort(idx), expected)
    assert len(idx) == ds.num_windows == len(expected)
    assert len(batches) == len(ds)
    assert all(len(b[0]) == 16 for b in batches[:-1])
    full = pd.concat(frames, ignore_index=True)
    check_values(batches, full, window, horizon, layout)
    x = batches[0][0]
    assert x.dtype == np.float32 and x.flags.c_contiguous
    shape = (16, 3, window) if layout == "NCL" else (16, window, 3)
    assert x.shape == shape


def test_no_window_crosses_series_or_file(frames, root):
    ds = make(root, window=6)
    idx = np.concatenate([b[-1] for b in collect(ds)])
    full = pd.concat(frames, ignore_index=True)
    file_of = np.repeat(np.arange(len(frames)), [len(f) for f in frames])
    sid = full["sid"].to_numpy()
    rows = idx[:, None] + np.arange(6)
    assert np.all(sid[rows] == sid[rows[:, :1]])
    assert np.all(file_of[rows] == file_of[rows[:, :1]])


def test_without_series_windows_stay_inside_files(frames, root):
    ds = make(root, series=None, window=30, stride=4)
    idx = np.concatenate([b[-1] for b in collect(ds)])
    assert np.array_equal(np.sort(idx), oracle_starts(frames, None, 30, 4))


@pytest.mark.parametrize("num_workers", [0, 1, 2])
@pytest.mark.parametrize("drop_last", [False, True])
def test_workers_share_the_epoch_exactly(frames, root, num_workers, drop_last):
    ds = make(root, batch_size=24, drop_last=drop_last, buffer_partitions=1)
    batches = collect(ds, dict(num_workers=num_workers))
    idx = np.concatenate([b[-1] for b in batches])
    assert len(batches) == len(ds)
    assert len(np.unique(idx)) == len(idx)
    expected = oracle_starts(frames, "sid", 8)
    if drop_last:
        assert all(len(b[0]) == 24 for b in batches)
        assert len(idx) == len(expected) // 24 * 24
        assert set(idx) <= set(expected)
    else:
        assert np.array_equal(np.sort(idx), expected)
        assert sum(len(b[0]) < 24 for b in batches) <= 1


def test_same_seed_and_epoch_give_identical_batches(root):
    a = collect(make(root, seed=3), dict(num_workers=2))
    b = collect(make(root, seed=3), dict(num_workers=2))
    assert len(a) == len(b)
    for p, q in zip(a, b):
        assert all(np.array_equal(u, v) for u, v in zip(p, q))


def test_set_epoch_changes_order_and_without_it_each_pass_takes_the_next_epoch(root):
    ds = make(root)
    e0 = np.concatenate([b[-1] for b in collect(ds)])
    auto = np.concatenate([b[-1] for b in collect(ds)])  # the second pass is epoch 1
    assert ds.epoch == 1 and not np.array_equal(e0, auto)
    ds.set_epoch(0)
    assert np.array_equal(e0, np.concatenate([b[-1] for b in collect(ds)]))
    ds.set_epoch(1)
    e1 = np.concatenate([b[-1] for b in collect(ds)])
    assert np.array_equal(e1, auto)
    assert not np.array_equal(e0, e1)
    assert np.array_equal(np.sort(e0), np.sort(e1))
    other_seed = np.concatenate([b[-1] for b in collect(make(root, seed=9))])
    assert not np.array_equal(e0, other_seed)


def test_shuffle_false_yields_canonical_order(frames, root):
    ds = make(root, shuffle=False)
    idx = np.concatenate([b[-1] for b in collect(ds)])
    assert np.array_equal(idx, oracle_starts(frames, "sid", 8))


def test_shuffle_mixes_within_buffer(root):
    ds = make(root, buffer_partitions=3)
    first = collect(ds)[0][-1]
    assert not np.all(np.diff(first) > 0)


def test_small_partition_bytes_splits_files_at_row_groups(frames, root):
    ds = make(root, partition_bytes=1)
    assert len(ds.partitions) > len(frames)
    assert any("row groups" in p.name for p in ds.partitions)
    idx = np.concatenate([b[-1] for b in collect(ds)])
    # Windows never cross a partition, so splitting files can only lose windows.
    expected = set(oracle_starts(frames, "sid", 8).tolist())
    assert set(idx.tolist()) <= expected
    assert len(np.unique(idx)) == len(idx) == ds.num_windows


def test_glob_and_explicit_list_keep_given_order(frames, root):
    import glob

    paths = sorted(glob.glob(f"{root}/*.parquet"))
    ds = make(root + "/*.parquet", shuffle=False)
    assert ds.num_windows == len(oracle_starts(frames, "sid", 8))
    rev = make(list(reversed(paths)), shuffle=False, series=None, window=5)
    idx = np.concatenate([b[-1] for b in collect(rev)])
    # Global rows follow the given order: the last file's rows come first.
    assert idx[0] == 0 and len(idx) == len(oracle_starts(frames[::-1], None, 5))


def test_outputs_by_configuration(root):
    x = next(iter(make(root, return_index=False)))
    assert isinstance(x, torch.Tensor) and x.shape == (16, 3, 8)
    x, y = next(iter(make(root, targets=["y"], return_index=False)))
    assert y.shape == (16, 1)
    x, y, i = next(iter(make(root, targets=["y"], horizon=4)))
    assert y.shape == (16, 1, 4) and i.dtype == torch.int64


def test_integer_targets_stay_integer(tmp_path):
    frame = pd.DataFrame({"a": np.arange(50, dtype=np.float32), "label": np.arange(50) % 3})
    write_parquet([frame], str(tmp_path))
    x, y = next(iter(dw.WindowDataset(str(tmp_path), features=["a"], targets=["label"], window=5)))
    assert y.dtype == torch.int64


def test_pickle_round_trip(root):
    ds = make(root)
    ds.set_epoch(4)
    clone = pickle.loads(pickle.dumps(ds))
    a = [b[-1].numpy() for b in ds]
    b = [b[-1].numpy() for b in clone]
    assert all(np.array_equal(p, q) for p, q in zip(a, b)) and len(a) == len(b)


def test_breaking_early_stops_the_reader_thread(root):
    # Whole partitions (a pool of buffer_partitions of them): the reader is still reading ahead when the first batch is taken.
    ds = make(root, buffer_partitions=1, prefetch_partitions=2, pieces_per_partition=1)
    it = iter(ds)
    next(it)
    assert any(t.name == "dask-windows-pool" for t in threading.enumerate())
    it.close()
    assert not any(t.name == "dask-windows-pool" for t in threading.enumerate())


def test_normalize_sample_and_global(root):
    x = next(iter(make(root, normalize="sample", return_index=False)))
    assert torch.allclose(x.mean(-1), torch.zeros(()), atol=1e-4)
    assert torch.allclose(x.std(-1, unbiased=False), torch.ones(()), atol=1e-3)
    raw, idx = next(iter(make(root)))
    scaled, _ = next(iter(make(root, normalize={"mean": [1, 2, 3], "std": [2, 4, 8]})))
    expect = (raw - torch.tensor([1.0, 2, 3])[:, None]) / torch.tensor([2.0, 4, 8])[:, None]
    assert torch.allclose(scaled, expect)


def test_open_reads_only_metadata_and_bookkeeping_is_tiny(tmp_path):
    """The 15,190,054-row seed case with window 1024: megabytes, not a 116 GiB index."""
    rows = 15_190_054
    mm = np.lib.format.open_memmap(str(tmp_path / "big.npy"), mode="w+", dtype=np.float32, shape=(rows, 1))
    mm[::100_000] = 1.0
    mm.flush()
    del mm
    arr = np.load(str(tmp_path / "big.npy"), mmap_mode="r")
    # a small open first: what open imports on first use (alone, this test counted 1.5 MB of imports) is not
    # bookkeeping
    dw.WindowDataset([np.zeros((5_000, 1), np.float32)], window=1024, batch_size=256, prefetch_partitions=0)
    tracemalloc.start()
    ds = dw.WindowDataset([arr], window=1024, batch_size=256, buffer_partitions=1, prefetch_partitions=0)
    opened = tracemalloc.get_traced_memory()[1]
    assert ds.num_windows == rows - 1023
    tracemalloc.stop()
    assert opened < 1 * 2**20
    assert len(ds) == -(-(rows - 1023) // 256)


# -- bad input ------------------------------------------------------------------------------


def test_missing_column_names_file_and_column(root):
    with pytest.raises(dw.SchemaError, match=r"feature 'nope' is missing from .*part-0000.parquet"):
        make(root, features=["f0", "nope"])
    with pytest.raises(KeyError, match="series column 'sensor'"):
        make(root, series="sensor")
    with pytest.raises(dw.SchemaError, match="target 'label'"):
        make(root, targets=["label"])


def test_schema_mismatch_names_both_files(frames, tmp_path):
    bad = [f.copy() for f in frames[:2]]
    bad[1]["f1"] = bad[1]["f1"].astype(np.float64)
    write_parquet(bad, str(tmp_path))
    with pytest.raises(dw.SchemaError, match=r"'f1' is double in .*part-0001.parquet but float in .*part-0000"):
        make(str(tmp_path))


def test_corrupt_and_truncated_files_raise_naming_the_file(frames, tmp_path):
    write_parquet(frames[:3], str(tmp_path))
    (tmp_path / "part-0001.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(dw.SourceReadError, match=r"part-0001.parquet"):
        make(str(tmp_path))
    data = (tmp_path / "part-0000.parquet").read_bytes()
    (tmp_path / "part-0001.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(OSError, match="part-0001.parquet"):
        make(str(tmp_path))


def test_file_damaged_after_open_raises_in_the_training_loop(frames, tmp_path):
    write_parquet(frames[:3], str(tmp_path))
    ds = make(str(tmp_path), series=None, buffer_partitions=1)
    data = (tmp_path / "part-0002.parquet").read_bytes()
    (tmp_path / "part-0002.parquet").write_bytes(data[:100])  # truncated inside the column chunks, after open
    with pytest.raises(dw.SourceReadError, match="part-0002.parquet"):
        for _ in ds:
            pass
    assert not any(t.name == "dask-windows-pool" for t in threading.enumerate())


def test_nan_inside_a_window_raises_naming_file_column_row(frames, tmp_path):
    bad = [f.copy() for f in frames]
    bad[2].loc[5, "f1"] = np.nan
    write_parquet(bad, str(tmp_path))
    with pytest.raises(dw.DataError, match=r"NaN in feature column 'f1' of .*part-0002.parquet at row 5"):
        list(make(str(tmp_path)))
    # nan="drop": exactly the windows touching the NaN row are left out.
    ds = make(str(tmp_path), nan="drop")
    idx = np.concatenate([b[-1] for b in collect(ds)])
    nan_row = sum(len(f) for f in frames[:2]) + 5
    expected = [s for s in oracle_starts(frames, "sid", 8) if not s <= nan_row < s + 8]
    assert np.array_equal(np.sort(idx), expected) and len(idx) == ds.num_windows


def test_nan_in_unused_target_row_is_fine_but_in_y_raises(frames, tmp_path):
    bad = [f.copy() for f in frames]
    bad[0].loc[0, "y"] = np.nan  # row 0 is never a window's last row for window 8
    write_parquet(bad, str(tmp_path))
    list(make(str(tmp_path), targets=["y"]))
    with pytest.raises(dw.DataError, match="target column 'y'"):
        list(make(str(tmp_path), targets=["y"], window=1))


def test_window_longer_than_every_series(root):
    with pytest.raises(dw.DataError, match=r"window=500 is longer than every series run .* \(longest: \d+ rows\)"):
        make(root, window=500)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(window=0), "window=0"),
        (dict(stride=-1), "stride=-1"),
        (dict(batch_size=0), "batch_size=0"),
        (dict(layout="CLN"), "layout='CLN'"),
        (dict(horizon=2), "horizon=2 needs targets"),
        (dict(features=[]), "features=\\[\\] is empty"),
        (dict(nan="ignore"), "nan='ignore'"),
        (dict(buffer_partitions=0), "buffer_partitions=0"),
        (dict(normalize="global"), "normalize='global'"),
        (dict(rank=2, world_size=2), "rank=2"),
    ],
)
def test_invalid_parameters(root, kw, match):
    with pytest.raises(ValueError, match=match):
        make(root, **kw)


def test_missing_path_and_wrong_type(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        dw.WindowDataset(str(tmp_path / "nothing"), features=["a"], window=2)
    with pytest.raises(TypeError, match="cannot read windows from int"):
        dw.WindowDataset(42, features=["a"], window=2)


def test_normalize_from_a_stats_file(frames, root, tmp_path):
    import json

    full = pd.concat(frames, ignore_index=True)
    stats = {
        "format": "dask_windows.stats",
        "version": 1,
        "rows": len(full),
        "features": {
            c: {
                "count": len(full),
                "mean": float(full[c].mean()),
                "std": float(full[c].std(ddof=0)),
                "min": float(full[c].min()),
                "max": float(full[c].max()),
                "nan_count": 0,
            }
            for c in ["f0", "f1", "f2"]
        },
    }
    path = tmp_path / "stats.json"
    path.write_text(json.dumps(stats))
    raw, _ = next(iter(make(root)))
    scaled, _ = next(iter(make(root, normalize=str(path))))
    mean = torch.tensor([stats["features"][c]["mean"] for c in ["f0", "f1", "f2"]])[:, None]
    std = torch.tensor([stats["features"][c]["std"] for c in ["f0", "f1", "f2"]])[:, None]
    assert torch.allclose(scaled, (raw - mean) / std, atol=1e-5)
    with pytest.raises(KeyError, match="no mean/std for feature 'f2'"):
        del stats["features"]["f2"]
        path.write_text(json.dumps(stats))
        make(root, normalize=str(path))


def test_manifest_runs_replace_the_series_scan(frames, tmp_path):
    """A `dask-windows convert` manifest is trusted for the runs; a stale one is ignored."""
    import fsspec

    from dask_windows.sources.manifest import series_runs, write_manifest

    paths = write_parquet(frames, str(tmp_path))
    fs = fsspec.filesystem("file")
    entries = [
        {
            "path": os.path.basename(p),
            "rows": len(f),
            "bytes": os.path.getsize(p),
            "runs": series_runs(f["sid"].to_numpy()),
        }
        for p, f in zip(paths, frames)
    ]
    write_manifest(str(tmp_path), fs, series="sid", time="ts", files=entries)
    scanned = make(str(tmp_path), series="sid")  # same runs either way: counts agree with the oracle
    assert scanned.source._manifest is not None
    assert scanned.num_windows == len(oracle_starts(frames, "sid", 8))
    idx = np.concatenate([b[-1] for b in collect(scanned)])
    assert np.array_equal(np.sort(idx), oracle_starts(frames, "sid", 8))
    # The manifest, not the column, decides: two runs per file (keys agreeing with the footer's
    # min/max of the series column, which the loader checks) mean other windows than the column's.
    claimed = []
    for e, f in zip(entries, frames):
        low, high = int(f["sid"].min()), int(f["sid"].max())
        e["runs"] = [[0, 1, low], [1, len(f) - 1, high]] if len(f) > 1 else [[0, 1, low]]
        claimed.append(f.assign(sid=[low] + [high] * (len(f) - 1)))
    write_manifest(str(tmp_path), fs, series="sid", time="ts", files=entries)
    assert make(str(tmp_path), series="sid").num_windows == len(oracle_starts(claimed, "sid", 8))
    # A manifest whose row counts disagree with the files is ignored.
    entries[0]["rows"] += 1
    entries[0]["runs"][-1][1] += 1
    write_manifest(str(tmp_path), fs, series="sid", time="ts", files=entries)
    stale = make(str(tmp_path), series="sid")
    assert stale.source._manifest is None and stale.num_windows == len(oracle_starts(frames, "sid", 8))


def test_persistent_workers_follow_set_epoch_and_advance_without_it(root):
    """Worker copies read the epoch from memory shared with the main process."""
    import sys

    script = f"""
import numpy as np, torch, dask_windows as dw
ds = dw.WindowDataset({root!r}, features=["f0"], series="sid", window=8, batch_size=16, return_index=True)
def order(loader):
    return np.concatenate([b[-1].numpy() for b in loader])
loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
first, second = order(loader), order(loader)   # epochs 0 and 1
ds.set_epoch(0)
again = order(loader)                          # set_epoch wins: epoch 0 again
ds.set_epoch(1)
fresh = order(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
print(np.array_equal(first, second), np.array_equal(first, again), np.array_equal(second, fresh),
      np.array_equal(np.sort(first), np.sort(second)))
"""
    root_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root_dir)
    out = forkrun.run([sys.executable, "-c", script], env=env, timeout=180)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "True", "True"]
