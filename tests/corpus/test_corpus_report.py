"""``CorpusDataset.report`` and ``dask-windows inspect --corpus``: no silent loss, against a numpy oracle.

A small corpus with every way a series can go unserved (null rows, empty lists,
series shorter than ``min_length``, series and channels with no observed value,
more channels than a sequence holds) is counted by the report and by a plain
Python oracle over the lists written; the epoch's part is checked against the
batches every rank actually yields: what they serve plus what the report says
they do not equals every observation of the kept series.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dask_windows as dw
from dask_windows.corpus import LeftOutSeriesWarning
from dask_windows.corpus.report import missing_per_channel

KW = dict(patch_size=4, max_length=16, batch_size=3, pack_window=16, return_index=True)


def _rows(seed: int) -> list:
    """Series as nested lists (``None`` for a null row or value): 1 or 2 channels, lengths 0 to 40."""
    rng = np.random.default_rng(seed)
    rows: list = [None, []]  # a null row, an empty list
    for k in range(60):
        channels = 1 + (k % 3 == 0)
        n = int(rng.integers(1, 41))
        values = rng.standard_normal((channels, n))
        values[rng.random((channels, n)) < 0.15] = np.nan
        if k % 11 == 0:
            values[:] = np.nan  # no observed value
        elif k % 7 == 0:
            values[-1] = np.nan  # one channel with none
        rows.append([[None if np.isnan(v) else float(v) for v in ch] for ch in values])
    return rows


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    data, paths = {}, {}
    for name, seed, nested in [("uni", 1, False), ("multi", 2, True)]:
        rows = _rows(seed)
        if not nested:  # univariate rows: the first channel as list<float>
            rows = [r if r is None or r == [] else r[0] for r in rows]
            kind = pa.list_(pa.float32())
        else:
            kind = pa.list_(pa.list_(pa.float64()))
        (root / name).mkdir()
        pq.write_table(pa.table({"target": pa.array(rows, kind)}), str(root / name / "p.parquet"), row_group_size=9)
        data[name] = [
            None
            if r is None
            else np.array([[np.nan if v is None else v for v in ch] for ch in (r if nested else [r])])
            if len(r)
            else np.zeros((1, 0))
            for r in rows
        ]
        paths[name] = str(root / name)
    return paths, data


def _open(paths, rank=None, world_size=None, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeftOutSeriesWarning)
        members = {n: dw.CorpusDataset(p, freq="D", **{**KW, **kw}) for n, p in paths.items()}
    return dw.mix(members, rank=rank, world_size=world_size)


def _served(batches, patch):
    """Per data set id: observations (time steps x channels, missing ones too) the batches serve."""
    out: dict[int, int] = {}
    for b in batches:
        real = b["sample_id"].numpy() > 0
        inside = (b["step"].numpy()[..., None] + np.arange(patch)) >= 0  # left padding has negative steps
        for d in np.unique(b["dataset_id"].numpy()[real]):
            at = real & (b["dataset_id"].numpy() == d)
            out[int(d)] = out.get(int(d), 0) + int(inside[at].sum())
    return out


@pytest.mark.parametrize(
    "kw",
    [
        dict(min_length=6),
        dict(min_length=1, pack=False, context_length=(4, 12)),
        dict(min_length=3, channels="multivariate", sequence_tokens=1),  # 2 channels: too wide
    ],
)
def test_report_counts_every_observation_against_the_oracle_and_the_batches(corpus, kw):
    paths, data = corpus
    world = 3
    ds = _open(paths, **kw)
    ds.set_epoch(1)
    report = ds.report(values=True, world_size=world)
    independent = kw.get("channels", "independent") == "independent"
    tokens = kw.get("sequence_tokens", 4)
    for name, series in data.items():
        d = report["datasets"][name]
        empty = [s is None or s.shape[1] == 0 for s in series]
        length = np.array([0 if s is None else s.shape[1] for s in series])
        channels = np.array([0 if s is None else s.shape[0] for s in series])
        short = ~np.array(empty) & (length < kw["min_length"])
        wide = ~np.array(empty) & ~short & (channels > tokens) if not independent else np.zeros(len(series), bool)
        gone = np.array(empty) | short | wide
        assert d["series"] == len(series)
        assert d["observations"] == int((length * channels).sum())
        assert d["left_out"]["empty_rows"] == sum(empty)
        assert d["left_out"]["short_series"] == int(short.sum())
        assert d["left_out"]["wide_series"] == int(wide.sum())
        assert d["left_out"]["series"] == int(gone.sum()) == d["series"] - d["served_series"]
        assert d["left_out"]["observations"] == int((length * channels)[gone].sum())
        missing = [np.isnan(s) for s in series if s is not None and s.size]
        assert d["missing"] == {
            "missing_observations": int(sum(m.sum() for m in missing)),
            "series_with_missing": sum(bool(m.any()) for m in missing),
            "series_all_missing": sum(bool(m.all()) for m in missing),
            "channels_all_missing": sum(int(m.all(axis=1).sum()) for m in missing),
            "infinite_observations": 0,
        }
        assert d["left_out"]["series"] > 0 and d["missing"]["series_all_missing"] > 0  # the cases are there
        assert independent or name == "uni" or d["left_out"]["wide_series"] > 0

    # the epoch: what the ranks yield plus what the report says they do not is every kept observation
    served: dict[int, int] = {}
    for rank in range(world):
        part = _open(paths, rank=rank, world_size=world, **kw)
        part.set_epoch(1)
        for d, n in _served(list(part), KW["patch_size"]).items():
            served[d] = served.get(d, 0) + n
    for k, name in enumerate(ds.names):
        d = report["datasets"][name]
        lost = d["epoch_not_served"]
        assert served.get(k, 0) + lost["observations"] + lost["observations_cut_by_context"] == (
            d["observations"] - d["left_out"]["observations"]
        )
        assert lost["items_not_drawn"] == lost["items_repeated"] == 0
    not_served = report["epoch"]["sequences_not_served"]
    assert not_served == report["epoch"]["sequences"] % world  # no drop_last: the equal shares' remainder
    assert sum(d["epoch_not_served"]["items"] for d in report["datasets"].values()) >= not_served
    if "context_length" in kw:
        assert sum(d["epoch_not_served"]["observations_cut_by_context"] for d in report["datasets"].values()) > 0


def test_quota_and_the_command_line_report(corpus, capsys):
    from dask_windows.cli import main

    paths, _ = corpus
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeftOutSeriesWarning)
        members = {n: dw.CorpusDataset(p, freq="D", min_length=6, **KW) for n, p in paths.items()}
    total = sum(m.num_items for m in members.values())
    mixed = dw.mix(members, weights={"uni": 5.0, "multi": 1.0}, items_per_epoch=2 * total)
    report = mixed.report()
    for name, count in zip(mixed.names, mixed.counts):
        lost, items = report["datasets"][name]["epoch_not_served"], members[name].num_items
        assert lost["items_repeated"] == max(int(count) - items, 0)
        assert lost["items_not_drawn"] == max(items - int(count), 0)
    assert report["datasets"]["uni"]["epoch_not_served"]["items_repeated"] > 0
    assert report["datasets"]["multi"]["epoch_not_served"]["items_not_drawn"] > 0

    args = ["inspect", "--corpus", "--patch-size", "4", "--max-length", "16", "--min-length", "6", "--freq", "D"]
    args += ["--batch-size", "3", "--world-size", "2", "--values"]
    assert main([*args, *(f"{n}={p}" for n, p in paths.items()), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    want = _open(paths, min_length=6, pack_window=4096, return_index=False).report(values=True, world_size=2)
    assert got["datasets"] == json.loads(json.dumps(want["datasets"]))
    assert main([*args, paths["uni"]]) == 0
    text = capsys.readouterr().out
    short = want["datasets"]["uni"]["left_out"]["short_series"]
    assert f"{short:,} shorter than min_length" in text and "served fully masked" in text
    assert main(["inspect", paths["uni"], paths["multi"]]) == 1
    assert "several are data sets of --corpus" in capsys.readouterr().err


def test_missing_per_channel_equals_numpy():
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 9, 30)
    channels = rng.integers(0, 4, 30)
    sizes = lengths * channels
    starts = np.cumsum(sizes) - sizes
    values = rng.standard_normal(int(sizes.sum()))
    values[rng.random(len(values)) < 0.3] = np.nan
    want = [
        int(np.isnan(values[s + c * n : s + (c + 1) * n]).sum())
        for s, n, ch in zip(starts, lengths, channels)
        for c in range(ch)
    ]
    assert missing_per_channel(values, starts, lengths, channels).tolist() == want
