"""Corpora of list-column series (dask_windows.corpus) on a real corpus, against a numpy oracle.

The corpus is the statsmodels data sets of ``examples/_real_corpus.py`` (yearly to
weekly, 1 to 12 channels, 12 to 2,284 steps, NaN and null values), written as
list-column Parquet (and, once, as a Hugging Face ``datasets`` folder). The
oracle reads the original numpy arrays: every token's values and masks, every
observation exactly once per epoch, each packed item whole in one sequence.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dask_windows as dw
from dask_windows.corpus import LeftOutSeriesWarning, ListSource
from dask_windows.corpus.items import build_units, epoch_items
from dask_windows.corpus.packing import pack
from dask_windows.errors import ConfigError, SchemaError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "..", "examples"))
from _real_corpus import load_corpus, write_corpus

KW = dict(patch_size=8, max_length=64, min_length=4, batch_size=4, pack_window=64, return_index=True)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    paths = write_corpus(str(root / "parquet"), "parquet", row_group_size=16)
    raw = {name: [np.atleast_2d(v) for _, _, v in rows] for name, rows in load_corpus().items()}
    return paths, raw


def _open(paths, weights=None, items_per_epoch=None, **kw):
    settings_ = {**KW, **kw}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeftOutSeriesWarning)
        members = {name: dw.CorpusDataset(path, **settings_) for name, path in paths.items()}
    return dw.mix(members, weights, items_per_epoch=items_per_epoch)


def _numpy(batches):
    return [{k: v.numpy() for k, v in b.items()} for b in batches]


def check_tokens(batches, raw, names, patch, independent=True, packed=True, prediction=0):
    """Every token against the oracle; returns {(name, series): (C, T) times each step was served}."""
    served = {}
    for b in batches:
        rows, tokens = b["sample_id"].shape
        for i in range(rows):
            ids = b["sample_id"][i]
            used = int((ids > 0).sum())
            assert (ids[:used] > 0).all() if packed else (ids[tokens - used :] > 0).all()  # padding after / before
            for k in np.unique(ids[ids > 0]):
                at = np.flatnonzero(ids == k)
                assert np.array_equal(at, np.arange(at[0], at[-1] + 1))  # an item's tokens are contiguous
                d = b["dataset_id"][i, at]
                s = b["series_id"][i, at]
                assert (d == d[0]).all() and (s == s[0]).all()  # one series per item
                variates = b["variate_id"][i, at]
                if independent:
                    assert (variates == variates[0]).all()
                else:  # channel by channel, each with the same tokens
                    assert np.array_equal(
                        variates, np.repeat(np.arange(len(np.unique(variates))), len(at) // len(np.unique(variates)))
                    )
                for v in np.unique(variates):
                    vt = at[variates == v]
                    assert np.array_equal(b["time_id"][i, vt], np.arange(len(vt)))
                    hidden = min(prediction, len(vt) - 1)  # the last patches, one of context kept
                    assert np.array_equal(b["prediction_mask"][i, vt], np.arange(len(vt)) >= len(vt) - hidden)
                    assert np.array_equal(np.diff(b["step"][i, vt]), np.full(len(vt) - 1, patch))
            for t in np.flatnonzero(ids > 0):
                name, s = names[b["dataset_id"][i, t]], int(b["series_id"][i, t])
                c, first = int(b["variate_id"][i, t]), int(b["step"][i, t])
                values = raw[name][s]
                count = served.setdefault((name, s), np.zeros(values.shape, np.int64))
                steps = first + np.arange(patch)
                inside = steps >= 0
                expect = np.zeros(patch, np.float32)
                expect[inside] = values[c, steps[inside]]
                observed = inside & ~np.isnan(expect)
                assert np.array_equal(b["observed_mask"][i, t], observed)
                assert np.array_equal(b["target"][i, t], np.where(observed, expect, 0).astype(np.float32))
                count[c, steps[inside]] += 1
            assert (b["target"][i, ids == 0] == 0).all() and not b["observed_mask"][i, ids == 0].any()
    return served


def _coverage_once(served, raw, skip=()):
    for name, series in raw.items():
        for s, values in enumerate(series):
            if (name, s) in skip:
                assert (name, s) not in served
                continue
            assert (name, s) in served, (name, s)
            assert (served[(name, s)] == 1).all(), (name, s)


def test_real_corpus_every_observation_once_with_masks(corpus):
    paths, raw = corpus
    ds = _open(paths, prediction_length=12)
    assert ds.freqs == ["Y", "W", "Q", "M"]
    for epoch in (1,):
        ds.set_epoch(epoch)
        batches = _numpy(list(ds))
        assert len(batches) == len(ds)
        served = check_tokens(batches, raw, ds.names, 8, prediction=2)
        _coverage_once(served, raw)
        # the frequency of each token is its data set's
        for b in batches:
            real = b["sample_id"] > 0
            freq = np.array(
                [
                    ds.freqs.index(dict(zip(paths, ["Y", "Y", "W", "Q", "M", "Y", "Q", "Q", "Y", "Y", "Y"]))[n])
                    for n in ds.names
                ]
            )
            assert np.array_equal(b["freq_id"][real], freq[b["dataset_id"][real]])


def test_determinism_per_seed_and_epoch(corpus):
    paths, _ = corpus
    a, b = _open(paths), _open(paths)
    a.set_epoch(3)
    b.set_epoch(3)
    one, two = _numpy(list(a)), _numpy(list(b))
    assert all(all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(one, two)) and len(one) == len(two)
    a.set_epoch(4)
    other = _numpy(list(a))
    assert not all(np.array_equal(x["series_id"], y["series_id"]) for x, y in zip(one, other))


def test_short_series_left_out_counted_and_warned(corpus):
    paths, raw = corpus
    with pytest.warns(LeftOutSeriesWarning, match=r"1 of 1 series are shorter than min_length=20"):
        longley = dw.CorpusDataset(paths["longley"], **{**KW, "min_length": 20})
    assert longley.num_items == 0
    with pytest.raises(ConfigError, match="no series of at least min_length=20"):
        len(longley)
    ds = _open(paths, min_length=20)
    assert ds.left_out["longley"].short == 1 and ds.left_out["longley"].short_steps == 6 * 16
    assert ds.summary()["longley"]["left_out_short"] == 1
    served = check_tokens(_numpy(list(ds)), raw, ds.names, 8)
    _coverage_once(served, raw, skip={("longley", 0)})


def test_fixed_frequency_vocabulary(corpus):
    paths, _ = corpus
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeftOutSeriesWarning)
        members = {n: dw.CorpusDataset(paths[n], **KW) for n in ("co2", "nile")}
    ds = dw.mix(members, freqs=["H", "D", "W", "M", "Q", "Y"])
    assert ds.freqs == ["H", "D", "W", "M", "Q", "Y"]
    b = next(iter(ds))
    real = b["sample_id"] > 0
    assert set(b["freq_id"][real].tolist()) <= {2, 5}
    expect = torch.where(b["dataset_id"] == 0, 2, 5)
    assert torch.equal(b["freq_id"][real], expect[real])
    with pytest.raises(ConfigError, match=r"holds frequency 'W', which freqs=\['Y'\] does not list"):
        dw.mix(members, freqs=["Y"])


def test_weighted_mixture_exact_quotas(corpus):
    paths, raw = corpus
    weights = dict.fromkeys(paths, 1.0)
    weights["fertility"] = 0.25
    ds = _open(paths, weights=weights, pack_window=32)
    ds_counts = dict(zip(ds.names, ds.counts.tolist()))
    assert sum(ds_counts.values()) == ds.num_items
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        items = Counter()
        for b in _numpy(list(ds)):
            for i in range(len(b["sample_id"])):
                for k in np.unique(b["sample_id"][i][b["sample_id"][i] > 0]):
                    items[ds.names[int(b["dataset_id"][i][b["sample_id"][i] == k][0])]] += 1
        assert dict(items) == {n: c for n, c in ds_counts.items() if c}


def test_ranks_equal_and_disjoint_resume_and_workers(corpus):
    paths, raw = corpus
    full = _open(paths)
    full.set_epoch(2)
    q = full.num_sequences(2)
    per_rank = []
    for rank in range(2):
        ds = _open(paths)
        ds._explicit_world = (rank, 2)
        ds.set_epoch(2)
        per_rank.append(_numpy(list(ds)))
        assert len(per_rank[-1]) == len(ds) == -(-(q // 2) // 4)
    whole = _numpy(list(full))
    flat = lambda bs: [row for b in bs for row in b["series_id"]]
    assert sum(len(flat(r)) for r in per_rank) == 2 * (q // 2)
    assert all(np.array_equal(x, y) for x, y in zip(flat(per_rank[0]) + flat(per_rank[1]), flat(whole)))

    # mid-epoch resume in a fresh dataset: the rest, bit for bit
    ds = _open(paths)
    ds.set_epoch(2)
    it = iter(ds)
    head = [next(it) for _ in range(3)]
    state = ds.state_dict()
    it.close()
    resumed = _open(paths)
    resumed.load_state_dict(state)
    rest = _numpy(list(resumed))
    assert len(head) + len(rest) == len(whole)
    for x, y in zip(rest, whole[3:]):
        assert all(np.array_equal(x[k], y[k]) for k in x)

    # DataLoader worker processes: the same batches, each once; stopped after 5 and resumed in new workers
    key = lambda b: b["series_id"].tobytes() + b["step"].tobytes()
    full.set_epoch(2)
    loader = iter(torch.utils.data.DataLoader(full, batch_size=None, num_workers=2))
    got = _numpy([next(loader) for _ in range(5)])
    state = full.state_dict(batches=5, num_workers=2)
    del loader
    again = _open(paths)
    again.load_state_dict(state)
    got += _numpy(list(torch.utils.data.DataLoader(again, batch_size=None, num_workers=2)))
    assert sorted(map(key, got)) == sorted(map(key, whole)) and len(got) == len(whole)


def test_multivariate_view(corpus):
    paths, raw = corpus
    ds = _open(paths, channels="multivariate", sequence_tokens=32)
    batches = _numpy(list(ds))
    served = check_tokens(batches, raw, ds.names, 8, independent=False)
    _coverage_once(served, raw)
    # macrodata's 12 channels share a sequence of 32 tokens: 2 tokens (16 steps) per channel
    assert max(int(b["variate_id"].max()) for b in batches) == 11


def test_unpacked_variable_context(corpus):
    paths, raw = corpus
    ds = _open(paths, pack=False, context_length=(16, 64), batch_size=8)
    ds.set_epoch(1)
    batches = _numpy(list(ds))
    lengths = {b["target"].shape[1] for b in batches}
    assert len(lengths) > 1 and all(2 <= n <= 8 for n in lengths)
    served = check_tokens(batches, raw, ds.names, 8, packed=False)
    for b in batches:  # one item per row, right-aligned: its last token is the row's last
        assert (b["sample_id"][:, -1] == 1).all() and set(np.unique(b["sample_id"])) <= {0, 1}
    again = _open(paths, pack=False, context_length=(16, 64), batch_size=8)
    again.set_epoch(1)
    assert [b["target"].shape for b in _numpy(list(again))] == [b["target"].shape for b in batches]
    assert all((c <= 1).all() for c in served.values())


def test_datasets_folder_and_arrow_equal_parquet(corpus, tmp_path):
    paths, raw = corpus
    pytest.importorskip("datasets")
    hf = write_corpus(str(tmp_path / "hf"), "datasets", names=["co2", "macrodata", "fertility"])
    # unshuffled, the order does not depend on the partitions (row groups here, record batches there)
    a, b = _open({n: paths[n] for n in hf}, shuffle=False), _open(hf, shuffle=False)
    assert [m.source.kind for m in b.members] == ["arrow-stream"] * len(hf)
    one, two = _numpy(list(a)), _numpy(list(b))
    assert len(one) == len(two) and all(all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(one, two))
    served = check_tokens(_numpy(list(_open(hf))), raw, b.names, 8)
    _coverage_once(served, {n: raw[n] for n in hf})
    # An Arrow IPC file of one data set: the same series
    table = pq.read_table(os.path.join(paths["fertility"], "part-0.parquet")).combine_chunks()
    with pa.OSFile(str(tmp_path / "fertility.arrow"), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table, max_chunksize=50)
    src = ListSource(str(tmp_path / "fertility.arrow"))
    assert src.kind == "arrow" and src.num_partitions == 5
    assert np.array_equal(src.lengths, np.full(219, 54))


def test_lengths_from_offsets_and_bad_input(tmp_path):
    path = str(tmp_path / "x.parquet")
    pq.write_table(pa.table({"target": pa.array([[1.0, 2.0], None, [], [3.0] * 5], pa.list_(pa.float32()))}), path)
    src = ListSource(path)
    assert src.lengths.tolist() == [2, 0, 0, 5] and src.freqs == ["unknown"]
    pq.write_table(pa.table({"y": [1.0, 2.0]}), str(tmp_path / "flat.parquet"))
    with pytest.raises(SchemaError, match=r"flat.parquet.*not a list.*WindowDataset"):
        ListSource(str(tmp_path / "flat.parquet"), target="y")
    with pytest.raises(SchemaError, match=r"target 'target' is not a column of .*flat.parquet"):
        ListSource(str(tmp_path / "flat.parquet"))
    ragged = pa.array([[[1.0, 2.0], [3.0]]], pa.list_(pa.list_(pa.float64())))
    pq.write_table(pa.table({"target": ragged}), str(tmp_path / "ragged.parquet"))
    with pytest.raises(SchemaError, match=r"row 0 of .*ragged.parquet.*differ in length"):
        ListSource(str(tmp_path / "ragged.parquet"))
    with pytest.raises(ConfigError, match="context_length"):
        dw.CorpusDataset(path, context_length=(16, 32), patch_size=16, max_length=32, channels="multivariate")


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 300), min_size=1, max_size=40),
    channels=st.lists(st.integers(1, 5), min_size=40, max_size=40),
    independent=st.booleans(),
    patch=st.sampled_from([1, 4, 8]),
    per=st.integers(1, 7),
    seed=st.integers(0, 3),
)
def test_items_cover_each_step_once_and_packing_keeps_items(lengths, channels, independent, patch, per, seed):
    lengths = np.array(lengths)
    chans = np.array(channels[: len(lengths)])
    bounds = np.arange(0, len(lengths) + per, per).clip(max=len(lengths))
    partition_series = np.unique(np.append(bounds, len(lengths)))
    units, left = build_units(
        lengths,
        chans,
        partition_series,
        independent=independent,
        patch=patch,
        max_length=8 * patch,
        min_length=3,
        budget=8,
    )
    counts = np.zeros((len(lengths), 5, 301), np.int64)
    unit, start, stop = units.locate(np.arange(units.num_items))
    assert (stop - start <= units.segment[unit]).all() and (stop > start).all()
    for u, a, b in zip(unit, start, stop):
        s = units.series[u]
        cs = [units.channel[u]] if independent else range(chans[s])
        for c in cs:
            counts[s, c, a:b] += 1
    for s, (n, c) in enumerate(zip(lengths, chans)):
        kept = n >= 3 and (independent or c <= 8)
        assert (counts[s, :c, :n] == int(kept)).all() and counts[s, c:].sum() == 0
    assert left.short == int((lengths < 3).sum())
    member, item = epoch_items([units], np.array([units.num_items]), seed, 0, True, 2)
    assert np.array_equal(np.sort(item), np.arange(units.num_items))
    tokens = units.width[unit][item] * -(-(stop - start)[item] // patch)
    ptr, entries = pack(tokens, 8, np.arange(0, len(item) + 16, 16).clip(max=len(item)), seed, 0)
    assert np.array_equal(np.sort(entries), np.arange(len(item)))  # each item once, never split
    assert all(tokens[entries[a:b]].sum() <= 8 for a, b in zip(ptr[:-1], ptr[1:]))


def _best_fit_oracle(tokens, budget):
    """Best-fit decreasing one item at a time: the least room that holds it, lowest bin first."""
    bins, room = [], []
    for i in np.argsort(-np.asarray(tokens), kind="stable"):
        fits = [b for b in range(len(bins)) if room[b] >= tokens[i]]
        if fits:
            b = min(fits, key=lambda b: (room[b], b))
        else:
            bins.append([])
            room.append(budget)
            b = len(bins) - 1
        bins[b].append(i)
        room[b] -= tokens[i]
    return bins


@settings(max_examples=40, deadline=None)
@given(tokens=st.lists(st.integers(1, 12), min_size=1, max_size=120), budget=st.integers(12, 40))
def test_bulk_best_fit_is_best_fit_decreasing(tokens, budget):
    from dask_windows.corpus.packing import _best_fit

    tokens = np.array(tokens)
    bin_of = _best_fit(tokens, budget)
    loads = np.bincount(bin_of, weights=tokens)
    assert (loads <= budget).all() and (loads > 0).all()
    oracle = _best_fit_oracle(tokens, budget)
    assert len(loads) == len(oracle)
    assert sorted(loads.tolist()) == sorted(float(sum(tokens[b])) for b in oracle)


def test_s3_parquet_equals_local(corpus):
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from helpers import s3_endpoint

    paths, raw = corpus
    endpoint = s3_endpoint("corpus", [])
    try:
        for name in ("fertility", "macrodata"):
            with open(os.path.join(paths[name], "part-0.parquet"), "rb") as f:
                endpoint.fs.pipe(f"corpus/{name}/part-0.parquet", f.read())
        options = endpoint.storage_options()
        remote = _open({n: f"s3://corpus/{n}/" for n in ("fertility", "macrodata")}, storage_options=options)
        local = _open({n: paths[n] for n in ("fertility", "macrodata")})
        assert remote.members[0].source.files == ["s3://corpus/fertility/part-0.parquet"]
        one, two = _numpy(list(remote)), _numpy(list(local))
        assert len(one) == len(two) and all(all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(one, two))
        # DataLoader workers open the objects themselves
        loader = torch.utils.data.DataLoader(remote, batch_size=None, num_workers=1)
        remote.set_epoch(0)
        got = _numpy(list(loader))
        assert all(all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(got, two))
    finally:
        endpoint.close()


def test_one_data_set_with_items_per_epoch_repeats_without_repeats_inside_its_epochs(corpus):
    paths, _ = corpus
    ds = _open({"fertility": paths["fertility"]}, items_per_epoch=300)
    assert ds.counts.tolist() == [300]
    ds.set_epoch(0)
    seen = Counter()
    for b in _numpy(list(ds)):
        for i in range(len(b["sample_id"])):
            for k in np.unique(b["sample_id"][i][b["sample_id"][i] > 0]):
                seen[int(b["series_id"][i][b["sample_id"][i] == k][0])] += 1
    # 219 series, one item each: the first 219 of the stream are member epoch 0, the next 81 of epoch 1
    assert sum(seen.values()) == 300 and set(seen) == set(range(219)) and max(seen.values()) == 2


def test_one_three_and_321_channels_share_batches(tmp_path):
    rng = np.random.default_rng(5)
    raw, paths = {}, {}
    for name, channels, count in (("one", 1, 6), ("three", 3, 4), ("wide", 321, 2)):
        series = [rng.standard_normal((channels, int(n))).astype(np.float32) for n in rng.integers(5, 40, count)]
        kind = pa.list_(pa.list_(pa.float32())) if channels > 1 else pa.list_(pa.float32())
        values = [s.tolist() if channels > 1 else s[0].tolist() for s in series]
        os.makedirs(tmp_path / name)
        pq.write_table(pa.table({"target": pa.array(values, kind)}), str(tmp_path / name / "p.parquet"))
        raw[name], paths[name] = series, str(tmp_path / name)
    ds = _open(paths, batch_size=64, min_length=1)
    batches = _numpy(list(ds))
    _coverage_once(check_tokens(batches, raw, ds.names, 8), raw)
    mixed = [set(np.unique(b["dataset_id"][b["sample_id"] > 0]).tolist()) for b in batches]
    assert {0, 1, 2} in mixed and max(int(b["variate_id"].max()) for b in batches) == 320


def test_early_break_leaves_no_thread_and_read_errors_name_the_file(corpus, tmp_path):
    from helpers import threads_started_here

    paths, _ = corpus
    ds = _open({"fertility": paths["fertility"]}, read_ahead=2)
    it = iter(ds)
    next(it)
    assert threads_started_here("dask-windows-corpus")
    it.close()
    assert not threads_started_here("dask-windows-corpus")
    # a file rewritten after open: the read names it
    import shutil

    copy = tmp_path / "fertility"
    shutil.copytree(paths["fertility"], copy)
    ds = _open({"fertility": str(copy)}, shuffle=False)
    table = pq.read_table(copy / "part-0.parquet")
    shorter = pa.table(
        {"target": pa.array([v[:-1] for v in table.column("target").to_pylist()], pa.list_(pa.float64()))}
    )
    pq.write_table(shorter, copy / "part-0.parquet", row_group_size=16)
    with pytest.raises(dw.SourceReadError, match=r"part-0.parquet \(row group \d+\).*open the corpus again"):
        list(ds)


def test_packed_variable_context_every_step_once(corpus):
    paths, raw = corpus
    ds = _open(paths, context_length=(16, 48), pack_window=40)
    ds.set_epoch(1)
    batches = _numpy(list(ds))
    _coverage_once(check_tokens(batches, raw, ds.names, 8), raw)  # long items split into samples, no step lost
    sizes = Counter()
    for b in batches:
        for ids in b["sample_id"]:
            sizes.update(Counter(ids[ids > 0].tolist()).values())
    assert max(sizes) <= 6 and len(sizes) > 3  # at most 48 steps of 8 per sample; lengths vary
    plan = ds.plan(1)
    assert len(plan.item) > ds.num_items  # more samples than items: the long ones were cut
    same = _open(paths, context_length=(16, 48), pack_window=40)
    same.set_epoch(1)
    assert all(all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(_numpy(list(same)), batches))


def test_corpus_keywords_are_the_settings():
    """Every corpus setting is a keyword of ``CorpusDataset`` by name (no ``**settings``: an IDE follows it), with
    ``CorpusSettings``' default."""
    import dataclasses
    import inspect

    from dask_windows.corpus.dataset import CorpusDataset, CorpusSettings

    params = inspect.signature(CorpusDataset.__init__).parameters
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for field in dataclasses.fields(CorpusSettings):
        assert field.name in params, field.name
        assert params[field.name].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[field.name].default == field.default, field.name
