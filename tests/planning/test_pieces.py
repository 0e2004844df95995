"""Whole partitions (``pieces_per_partition=1``) and the default against the pandas oracle.

The loader on every source (coverage, values, determinism, workers, real gloo ranks, resume at
every batch), windows crossing the row-group cuts of a split Parquet file, and the mixing
statistics. (The piece order these tests were written for was retired in 0.3; its plan arithmetic
went with it, and ``pieces_per_partition > 1`` is served by the pool order:
tests/settings/test_pieces_retired.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import collect, make_frames, oracle_starts, write_parquet
from scale_helpers import make_uneven_frames, run_child, wait

import dask_windows as dw
from dask_windows.planning.mixing import block_histogram, mixing_report, plan_batches

KW = dict(features=["f0", "f1"], targets=["y"], series="sid", window=8, batch_size=16, return_index=True)


# -- the loader against the oracle ------------------------------------------------------------


@pytest.fixture(scope="module")
def frames():
    return make_frames(seed=3, num_files=4, num_series=12, min_len=3, max_len=160)


@pytest.fixture(scope="module")
def root(frames, tmp_path_factory):
    path = tmp_path_factory.mktemp("pieces")
    write_parquet(frames, str(path), row_group_size=23)
    return str(path)


def _check(batches: list, window: int) -> np.ndarray:
    """Each window's values are the rows its index names; return the indices."""
    for x, y, idx in batches:
        assert np.array_equal(x[:, 0, :], idx[:, None] + np.arange(window)), "values do not match the index"
        assert np.array_equal(y[:, 0], (idx + window - 1) * 10.0)
    return np.concatenate([b[-1] for b in batches])


@pytest.mark.parametrize("pieces,stride,batch_size", [(None, 1, 16), (1, 3, 7), (None, 1, 32), (1, 2, 5)])
def test_coverage_values_and_determinism(frames, root, pieces, stride, batch_size):
    ds = dw.WindowDataset(root, **{**KW, "batch_size": batch_size, "stride": stride}, pieces_per_partition=pieces)
    ds.set_epoch(3)
    first = collect(ds)
    idx = _check(first, 8)
    assert np.array_equal(np.sort(idx), oracle_starts(frames, "sid", 8, stride))
    assert len(first) == len(ds) and sum(len(b[0]) < batch_size for b in first) <= 1
    again = collect(
        dw.WindowDataset(root, **{**KW, "batch_size": batch_size, "stride": stride}, pieces_per_partition=pieces)
    )
    assert not all(np.array_equal(p[-1], q[-1]) for p, q in zip(first, again))  # epoch 0 differs from epoch 3
    clone = dw.WindowDataset(root, **{**KW, "batch_size": batch_size, "stride": stride}, pieces_per_partition=pieces)
    clone.set_epoch(3)
    assert all(all(np.array_equal(u, v) for u, v in zip(p, q)) for p, q in zip(first, collect(clone)))


def test_the_default_mixes_many_partitions_per_batch(root):
    whole = dw.WindowDataset(root, **KW, pieces_per_partition=1, buffer_partitions=1)
    pieces = dw.WindowDataset(root, **KW)
    files = np.cumsum([p.num_rows for p in whole.partitions])
    spread = [len(np.unique(np.searchsorted(files, b[-1], side="right"))) for b in collect(pieces)[:-1]]
    alone = [len(np.unique(np.searchsorted(files, b[-1], side="right"))) for b in collect(whole)[:-1]]
    assert max(alone) <= 2 and np.mean(spread) > 2.5  # windows of several files in one batch


@pytest.mark.parametrize("num_workers", [1, 2])
def test_dataloader_workers_share_the_epoch_exactly(frames, root, num_workers):
    ds = dw.WindowDataset(root, **KW, pieces_per_partition=1)
    ds.set_epoch(1)
    inline = collect(ds)
    ds.set_epoch(1)  # each pass would otherwise take the next epoch
    batches = collect(ds, dict(num_workers=num_workers))
    idx = _check(batches, 8)
    assert len(batches) == len(ds) and np.array_equal(np.sort(idx), oracle_starts(frames, "sid", 8))
    if num_workers == 1:  # one worker yields what the process itself yields, bit for bit
        assert all(np.array_equal(p[-1], q[-1]) for p, q in zip(inline, batches))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_at_every_batch(root, num_workers):
    settings = dict(KW, batch_size=12, pieces_per_partition=1)
    ds = dw.WindowDataset(root, **settings)
    ds.set_epoch(2)
    full = collect(ds, dict(num_workers=num_workers))
    points = range(len(full) + 1) if num_workers == 0 else range(0, len(full) + 1, 3)
    for k in points:
        state = ds.state_dict(batches=k, num_workers=num_workers)
        resumed = dw.WindowDataset(root, **settings)
        resumed.load_state_dict(state)
        rest = collect(resumed, dict(num_workers=num_workers))
        assert len(rest) == len(full) - k
        assert all(np.array_equal(p[-1], q[-1]) and np.array_equal(p[0], q[0]) for p, q in zip(rest, full[k:]))


def test_windows_crossing_row_group_cuts_are_kept(frames, root):
    """A file split at row groups: every window of the file, none twice (stride 1, with a horizon)."""
    for kw in (dict(), dict(horizon=3), dict(series=None)):
        settings = {**KW, "targets": ["y"], **kw}
        ds = dw.WindowDataset(root, **settings, partition_bytes=1, pieces_per_partition=1)
        assert any("row groups" in p.name for p in ds.partitions) and len(ds.partitions) > 3 * len(frames)
        idx = np.concatenate([b[-1] for b in collect(ds)])
        expected = oracle_starts(frames, settings["series"], 8, 1, kw.get("horizon", 0))
        assert len(np.unique(idx)) == len(idx) and np.array_equal(np.sort(idx), expected)
        whole = dw.WindowDataset(root, **settings)
        assert ds.num_windows == whole.num_windows


def test_row_group_split_nan_drop_sees_the_halo(frames, tmp_path):
    bad = [f.copy() for f in frames]
    bad[1].loc[23, "f1"] = np.nan  # the first row of the file's second row group
    write_parquet(bad, str(tmp_path), row_group_size=23)
    ds = dw.WindowDataset(str(tmp_path), **KW, nan="drop", partition_bytes=1)
    idx = np.concatenate([b[-1] for b in collect(ds)])
    row = len(bad[0]) + 23
    assert not ((idx <= row) & (idx + 8 > row)).any()  # no window holds the NaN row, on either side of the cut
    expected = oracle_starts(frames, "sid", 8)
    assert set(idx) == {s for s in expected if not s <= row < s + 8}


def test_arrays_and_memmaps_read_only_the_piece(tmp_path):
    series = [
        np.stack([np.arange(n, dtype=np.float32) + 1000 * i, np.zeros(n, np.float32)], 1)
        for i, n in enumerate([700, 90, 5, 333])
    ]
    np.save(tmp_path / "s0.npy", series[0])
    arrays = [np.load(tmp_path / "s0.npy", mmap_mode="r"), *series[1:]]
    ds = dw.WindowDataset(
        arrays, features=[0], window=6, stride=2, batch_size=9, partition_rows=128, return_index=True,
        pieces_per_partition=1,
    )  # fmt: skip
    got = collect(ds)
    x = np.concatenate([b[0][:, 0, 0] for b in got])
    expected = np.concatenate([s[: len(s) - 5 : 2, 0] for s in series if len(s) >= 6])
    assert np.array_equal(np.sort(x), np.sort(expected)) and ds.spec.pieces_per_partition == 1


def test_dask_reads_whole_partitions_by_default_as_files_do(root):
    dd = pytest.importorskip("dask.dataframe")
    import dask

    with dask.config.set(scheduler="sync"):
        ddf = dd.read_parquet(root)
        assert dw.WindowDataset(ddf, **KW).spec.pieces_per_partition == 1
        got = collect(dw.WindowDataset(ddf, **KW))
    want = collect(dw.WindowDataset(root, **KW, pieces_per_partition=1))
    assert len(got) == len(want) and all(np.array_equal(p[-1], q[-1]) for p, q in zip(got, want))


def test_bad_pieces_per_partition_is_a_clear_error(root):
    for bad in (0, -1, 2.5, True):
        with pytest.raises(dw.ConfigError, match="pieces_per_partition"):
            dw.WindowDataset(root, **KW, pieces_per_partition=bad)


def test_real_gloo_ranks_with_whole_partitions(tmp_path):
    sizes = [31, 310, 45, 290, 36]
    frames = make_uneven_frames(sizes, seed=2)
    write_parquet(frames, str(tmp_path / "data"))
    configs = [
        {"num_workers": 2, "epoch": 1, "dataset": {"window": 9, "batch_size": 10, "pieces_per_partition": 1}},
        {"num_workers": 0, "epoch": 2, "dataset": {"window": 9, "batch_size": 6, "stride": 2, "drop_last": True}},
    ]
    init = f"file://{tmp_path / 'rendezvous'}"
    args = {"world_size": 2, "init": init, "data": str(tmp_path / "data"), "configs": configs}
    wait([run_child("ddp", {**args, "rank": r, "out": str(tmp_path / f"rank{r}.npz")}) for r in range(2)], timeout=180)
    ranks = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(2)]
    for n, config in enumerate(configs):
        c = config["dataset"]
        expected = oracle_starts(frames, "sid", 9, c.get("stride", 1))
        assert (
            int(ranks[0][f"len{n}"])
            == int(ranks[1][f"len{n}"])
            == len(ranks[0][f"sizes{n}"])
            == len(ranks[1][f"sizes{n}"])
        )
        union = np.concatenate([r[f"idx{n}"] for r in ranks])
        assert len(np.unique(union)) == len(union) and np.isin(union, expected).all()
        share = len(expected) // 2
        used = share // c["batch_size"] * c["batch_size"] if c.get("drop_last") else share
        assert len(union) == 2 * used


# -- mixing statistics ----------------------------------------------------------------------


def test_plan_batches_are_the_batches_return_index_yields(root):
    for kw in (dict(), dict(pieces_per_partition=1), dict(stride=3, batch_size=7, partition_bytes=1)):
        ds = dw.WindowDataset(root, **{**KW, **kw})
        ds.set_epoch(5)
        got = [b[-1] for b in collect(ds)]
        sim = list(plan_batches(ds))
        assert len(got) == len(sim) and all(np.array_equal(a, b) for a, b in zip(got, sim))
        rows = np.concatenate(got)
        total = sum(p.num_rows for p in ds.partitions)
        assert np.array_equal(block_histogram(ds, 37), np.bincount(rows * 37 // total, minlength=37))


def test_mixing_of_one_long_series_in_time_ordered_files(tmp_path):
    """The layout of the issue, small: whole partitions mix badly; the default, like a shuffle."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, files = 192_000, 16
    per = rows // files
    for f in range(files):
        table = pa.table({"x": np.arange(f * per, (f + 1) * per, dtype=np.float32)})
        pq.write_table(table, tmp_path / f"part-{f:02d}.parquet", row_group_size=per // 8)
    common = dict(features=["x"], window=16, stride=8, batch_size=64)
    old = mixing_report(dw.WindowDataset(str(tmp_path), **common, pieces_per_partition=1))
    new = mixing_report(dw.WindowDataset(str(tmp_path), **common))
    ref = new["global"]
    assert old["loader"]["effective_batch_size"] < 0.2 * 64 and old["loader"]["lag1"] > 0.8
    assert "poorly" in old["verdict"] and "pieces_per_partition" in old["advice"]
    assert new["loader"]["effective_batch_size"] >= 0.5 * 64
    assert new["loader"]["distinct_blocks"] >= 0.75 * ref["distinct_blocks"]
    assert new["loader"]["tv_distance"] <= 1.3 * ref["tv_distance"]
    assert 0.8 * 64 < ref["effective_batch_size"] < 1.25 * 64 and abs(ref["lag1"]) < 0.1
    assert "poorly" not in new["verdict"]


def test_inspect_mixing_on_the_command_line(root):
    from helpers import cli

    args = ["inspect", root, "--series", "sid", "--window", "8", "--mixing"]
    out = cli(*args)  # in this process, through the command line's main
    assert "global shuffle" in out.stdout and "verdict:" in out.stdout
    bad = cli(*args[:-3], "--mixing", expect=1)  # without --window: refused, saying what to pass
    assert "--window" in bad.stderr + bad.stdout
