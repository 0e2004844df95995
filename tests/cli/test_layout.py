"""convert's spread layout: exactly the windows of each whole series, and batches that mix like a global shuffle."""

from __future__ import annotations

import json
import os
import warnings

import dask
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dask_windows as dw
from dask_windows.cli.convert import convert
from dask_windows.cli.layout import canonical_rows, file_runs, plan_spread, read_converted
from dask_windows.planning.index import run_grid
from dask_windows.sources.manifest import MANIFEST_NAME, span_shortfall


@pytest.fixture(autouse=True)
def _sync_scheduler():
    with dask.config.set(scheduler="sync"):
        yield


def oracle(series_rows: np.ndarray, span: int, stride: int) -> set[tuple[int, int]]:
    """Every window of every whole series: ``(series, start row in the series)``."""
    return {(s, p) for s, n in enumerate(series_rows.tolist()) for p in range(0, n - span + 1, stride)}


def planned_windows(
    series_rows: np.ndarray, num_files: int, convert_span: int, chunk: int, span: int, stride: int
) -> tuple[list[tuple[int, int]], list[dict]]:
    """Windows the grid finds in a planned spread layout, and the manifest entries of its files."""
    plan = plan_spread(series_rows, num_files, convert_span, chunk)
    keys = list(range(len(series_rows)))
    found, entries = [], []
    for f in range(num_files):
        rows, runs = file_runs(plan, series_rows, keys, f)
        entries.append({"path": f"part-{f}", "rows": rows, "bytes": 0, "runs": runs})
        if not runs:
            continue
        table = np.array([[r[0], r[1], r[3], r[4]] for r in runs], np.int64)
        first, counts = run_grid(table[:, 0], table[:, 1], span, stride, table[:, 2], table[:, 3])
        for (start, _, key, origin, _), a, c in zip(runs, first, counts):
            found += [(key, origin + (a - start) + k * stride) for k in range(int(c))]
    return found, entries


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(1, 120), min_size=1, max_size=8),
    st.integers(1, 6),
    st.integers(1, 12),
    st.integers(1, 40),
    st.integers(1, 5),
    st.integers(0, 6),
)
def test_spread_plan_keeps_exactly_the_windows_of_each_whole_series(
    lengths, num_files, convert_span, chunk, stride, smaller
):
    series_rows = np.array(lengths)
    span = max(1, convert_span - smaller)  # any window + horizon up to the one convert was told
    found, entries = planned_windows(series_rows, num_files, convert_span, chunk, span, stride)
    assert len(found) == len(set(found)), "a window is yielded twice"
    assert set(found) == oracle(series_rows, span, stride)
    # Owned rows tile every series exactly once; stored rows are the series' own rows.
    owned = sorted((r[2], r[3] + i) for e in entries for r in e["runs"] for i in range(r[4]))
    assert owned == [(s, p) for s, n in enumerate(lengths) for p in range(n)]
    for e in entries:
        for _, rows, key, origin, _ in e["runs"]:
            assert origin + rows <= lengths[key]
    files = [sum(r[4] for r in e["runs"]) for e in entries]
    assert max(files) - min(files) <= chunk  # files own equal rows, up to one chunk


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 150), min_size=1, max_size=6),
    st.integers(2, 5),
    st.integers(2, 10),
    st.integers(1, 30),
    st.integers(1, 4),
    st.integers(1, 8),
)
def test_a_longer_span_than_converted_for_loses_exactly_the_counted_windows(
    lengths, num_files, convert_span, chunk, stride, extra
):
    series_rows = np.array(lengths)
    span = convert_span + extra
    found, entries = planned_windows(series_rows, num_files, convert_span, chunk, span, stride)
    want = oracle(series_rows, span, stride)
    assert set(found) <= want and len(found) == len(set(found))
    manifest = {"version": 2, "span": convert_span, "files": entries}
    assert span_shortfall(manifest, span, stride) == (
        (len(want) - len(found), len(want)) if span > convert_span else (0, 0)
    )


def load_manifest(root) -> dict:
    with open(os.path.join(root, MANIFEST_NAME)) as src:
        return json.load(src)


def write_input(tmp_path, frame: pd.DataFrame, parts: int = 3) -> str:
    src = tmp_path / "in"
    src.mkdir()
    shuffled = frame.sample(frac=1.0, random_state=0)
    for i, rows in enumerate(np.array_split(np.arange(len(shuffled)), parts)):
        shuffled.iloc[rows].to_parquet(src / f"p{i}.parquet", index=False)
    return str(src)


def series_frame(lengths: list[int], seed: int = 0) -> pd.DataFrame:
    """Series whose value ``v`` encodes (series, row in series): ``v = series * 10_000 + row``."""
    rng = np.random.default_rng(seed)
    sid = np.repeat(np.arange(len(lengths)), lengths)
    row = np.concatenate([np.arange(n) for n in lengths])
    ts = np.concatenate([np.sort(rng.choice(10 * n, n, replace=False)) for n in lengths])
    return pd.DataFrame(
        {"sid": sid, "ts": ts, "v": (sid * 10_000 + row).astype(np.float64), "y": row.astype(np.float64)}
    )


@pytest.mark.parametrize(
    "lengths,window,stride,horizon,size",
    [
        ([3000], 8, 3, 2, "6KB"),  # one long series over many files
        ([400, 7, 950, 1, 260, 1300], 5, 2, 0, "5KB"),
        ([40] * 60, 6, 1, 1, "4KB"),  # many short series sorted by id
    ],
)
def test_loader_yields_exactly_each_series_windows_on_converted_data(tmp_path, lengths, window, stride, horizon, size):
    frame = series_frame(lengths)
    report = convert(
        [write_input(tmp_path, frame)],
        str(tmp_path / "out"),
        series="sid",
        time="ts",
        partition_size=size,
        window=window,
        horizon=horizon,
    )
    assert report.files >= 3 and report.rows_out == len(frame) and report.span == window + horizon
    pd.testing.assert_frame_equal(
        read_converted(str(tmp_path / "out")),
        frame.sort_values(["sid", "ts"]).reset_index(drop=True),
        check_dtype=False,
    )
    ds = dw.WindowDataset(
        str(tmp_path / "out"),
        ["v"],
        ["y"],
        series="sid",
        window=window,
        stride=stride,
        horizon=horizon,
        batch_size=64,
        seed=3,
    )
    seen = []
    for x, _ in ds:
        v = x[:, 0, :].numpy().astype(np.int64)  # (B, L) encoded (series, row) of each window row
        assert (np.diff(v, axis=1) == 1).all(), "a window crosses a chunk seam or a series"
        seen += [(int(a) // 10_000, int(a) % 10_000) for a in v[:, 0]]
    want = oracle(np.array(lengths), window + horizon, stride)
    assert len(seen) == len(set(seen)) == len(want) and set(seen) == want
    # the same set with series=None: a spread dataset's chunks come from its manifest
    assert dw.WindowDataset(
        str(tmp_path / "out"), ["v"], ["y"], window=window, stride=stride, horizon=horizon
    ).num_windows == len(want)


def test_longer_window_than_converted_for_warns_with_the_count(tmp_path):
    lengths = [2500]
    frame = series_frame(lengths)
    convert(
        [write_input(tmp_path, frame)], str(tmp_path / "out"), series="sid", time="ts", partition_size="5KB", window=4
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fits = dw.WindowDataset(str(tmp_path / "out"), ["v"], series="sid", window=4)
    assert fits.num_windows == 2500 - 4 + 1
    with pytest.warns(RuntimeWarning, match=r"converted for window \+ horizon <= 4 rows.*--window 9") as caught:
        ds = dw.WindowDataset(str(tmp_path / "out"), ["v"], series="sid", window=9)
    lost = int(str(caught[0].message).split(": ")[1].split(" of ")[0].replace(",", ""))
    assert lost > 0 and ds.num_windows == (2500 - 9 + 1) - lost


def test_version_1_manifests_and_the_contiguous_layout_still_open(tmp_path):
    frame = series_frame([300, 200])
    convert([write_input(tmp_path, frame)], str(tmp_path / "out"), series="sid", time="ts", layout="contiguous")
    manifest = load_manifest(tmp_path / "out")
    assert manifest["version"] == 1 and len(manifest["files"][0]["runs"][0]) == 3
    ds = dw.WindowDataset(str(tmp_path / "out"), ["v"], series="sid", window=10, stride=2)
    assert ds.num_windows == len(oracle(np.array([300, 200]), 10, 2))


def test_a_spread_dataset_with_a_file_missing_raises(tmp_path):
    convert(
        [write_input(tmp_path, series_frame([3000]))],
        str(tmp_path / "out"),
        series="sid",
        time="ts",
        partition_size="6KB",
        window=8,
    )
    parts = sorted(tmp_path.joinpath("out").glob("part-*.parquet"))
    os.remove(parts[1])
    with pytest.raises(dw.DataError, match="lists 1 files that are not there.*rerun `dask-windows convert`"):
        dw.WindowDataset(str(tmp_path / "out"), ["v"], series="sid", window=8)
    pd.read_parquet(parts[0]).iloc[:-1].to_parquet(parts[0], index=False)  # rewritten: one row short
    with pytest.raises(dw.DataError, match="does not match .*rerun `dask-windows convert`"):
        dw.WindowDataset(str(tmp_path / "out"), ["v"], series="sid", window=8)


def test_split_on_converted_data_cuts_each_series_by_its_rows(tmp_path):
    lengths = [1200, 900]
    frame = series_frame(lengths)
    convert(
        [write_input(tmp_path, frame)], str(tmp_path / "out"), series="sid", time="ts", partition_size="5KB", window=6
    )
    ds = dw.WindowDataset(str(tmp_path / "out"), ["v"], series="sid", window=6, stride=1, batch_size=128)
    train, valid = ds.split(0.25)
    for part, test in (
        (train, lambda s, p: p + 6 <= int(lengths[s] * 0.75)),
        (valid, lambda s, p: p >= int(lengths[s] * 0.75)),
    ):
        starts = [(int(a) // 10_000, int(a) % 10_000) for x in part for a in x[:, 0, 0].numpy()]
        want = {(s, p) for s, p in oracle(np.array(lengths), 6, 1) if test(s, p)}
        assert len(starts) == len(want) and set(starts) == want


# -- mixing ------------------------------------------------------------------------------------------------


def mixing_figures(batches: list[np.ndarray], total_rows: int, all_rows: np.ndarray, blocks: int = 100) -> dict:
    """Distinct blocks per batch, TV distance of its block histogram, lag-1 correlation, effective size."""
    every = np.minimum(all_rows * blocks // total_rows, blocks - 1)
    reference = np.bincount(every, minlength=blocks) / len(every)
    distinct, tv, means = [], [], []
    for rows in batches:
        b = np.minimum(rows * blocks // total_rows, blocks - 1)
        distinct.append(len(np.unique(b)))
        tv.append(0.5 * np.abs(np.bincount(b, minlength=blocks) / len(b) - reference).sum())
        means.append(b.mean())
    means = np.asarray(means)
    return {
        "distinct": float(np.mean(distinct)),
        "tv": float(np.mean(tv)),
        "lag1": float(np.corrcoef(means[:-1], means[1:])[0, 1]),
        "ess": float(every.var() / means.var()),
    }


@pytest.mark.parametrize("kind", ["one long series", "series sorted by id"])
def test_default_loader_on_converted_data_mixes_like_a_global_shuffle(tmp_path, kind):
    lengths = [240_000] if kind == "one long series" else [600] * 400
    frame = series_frame(lengths)
    convert(
        [write_input(tmp_path, frame)], str(tmp_path / "out"), series="sid", time="ts", partition_size="500KB", window=8
    )
    manifest = load_manifest(tmp_path / "out")
    assert len(manifest["files"]) >= 4
    batch = 128
    ds = dw.WindowDataset(
        str(tmp_path / "out"),
        ["v"],
        series="sid",
        window=8,
        stride=4,
        batch_size=batch,
        drop_last=True,
        return_index=True,
        seed=1,
    )
    batches = []
    for epoch in range(4):
        ds.set_epoch(epoch)
        batches += [canonical_rows(manifest, rows.numpy()) for _, rows in ds]
    total = len(frame)
    every = np.concatenate(batches[: len(ds)])
    rng = np.random.default_rng(0)
    shuffled = [rng.permutation(every)[: len(ds) * batch].reshape(-1, batch) for _ in range(4)]
    reference = mixing_figures([b for s in shuffled for b in s], total, every)
    got = mixing_figures(batches, total, every)
    assert got["distinct"] >= 0.95 * reference["distinct"], (got, reference)
    assert got["tv"] <= 1.05 * reference["tv"], (got, reference)
    assert abs(got["lag1"]) < 0.05, (got, reference)
    assert got["ess"] >= 0.9 * batch, (got, reference)


def test_nan_drop_on_converted_data_keeps_each_series_grid(tmp_path):
    lengths = [1500, 700]
    frame = series_frame(lengths)
    bad = {(0, 2), (0, 333), (1, 40), (1, 41)}  # (series, row) holding NaN
    for s, r in bad:
        frame.loc[(frame["sid"] == s) & (frame["v"] == s * 10_000 + r), "y"] = np.nan
    convert(
        [write_input(tmp_path, frame)], str(tmp_path / "out"), series="sid", time="ts", partition_size="5KB", window=4
    )
    ds = dw.WindowDataset(
        str(tmp_path / "out"), ["v"], ["y"], series="sid", window=4, stride=3, nan="drop", batch_size=256
    )
    seen = [(int(a) // 10_000, int(a) % 10_000) for x, _ in ds for a in x[:, 0, 0].numpy()]
    # a row with NaN in any column read may lie in no window: those windows go, the grid stays
    want = {(s, p) for s, p in oracle(np.array(lengths), 4, 3) if not any(b == s and p <= r < p + 4 for b, r in bad)}
    assert len(seen) == len(set(seen)) and set(seen) == want


def test_cli_convert_sizes_the_overlap_from_window_and_horizon(tmp_path):
    import subprocess
    import sys

    frame = series_frame([900, 500])
    src = write_input(tmp_path, frame)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(os.path.dirname(__file__))))}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dask_windows.cli",
            "convert",
            src,
            str(tmp_path / "out"),
            "--series",
            "sid",
            "--time",
            "ts",
            "--partition-size",
            "4KB",
            "--window",
            "10",
            "--horizon",
            "2",
            "--workers",
            "1",
            "--no-progress",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    manifest = load_manifest(tmp_path / "out")
    assert manifest["version"] == 2 and manifest["span"] == 12 and report["layout"] == "spread"
    assert report["windows"] == len(oracle(np.array([900, 500]), 12, 1)) and report["windows_lost"] == 0


def test_stats_of_a_spread_dataset_count_each_row_once(tmp_path):
    from dask_windows.cli.summary import compute_stats

    frame = series_frame([3000, 400])
    convert(
        [write_input(tmp_path, frame)], str(tmp_path / "out"), series="sid", time="ts", partition_size="6KB", window=16
    )
    doc = compute_stats(str(tmp_path / "out"), ["v", "y"])
    assert doc["rows"] == len(frame)
    for name in ("v", "y"):
        assert doc["features"][name]["count"] == len(frame)
        assert doc["features"][name]["mean"] == pytest.approx(frame[name].mean(), rel=1e-9)
        assert doc["features"][name]["std"] == pytest.approx(frame[name].std(ddof=0), rel=1e-9)
