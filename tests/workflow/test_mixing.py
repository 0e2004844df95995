"""Named batches in a mixture: against each member's own named batches, a pandas reference and exact quotas.

Two members read statsmodels' co2 (one series per decade) through one fitted workflow, at
strides 1 and 13 with other seeds. The mixture's epoch must hold, for each member, exactly its
quota of windows, in every batch the members a brute-force schedule puts there, and each of them
equal, field by field, to the window the member yields alone at that position of its own stream;
the codes and units are checked against pandas too. Members whose fields differ are refused,
naming the member and the field.
"""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
import statsmodels.datasets as smd
import torch

import dask_windows as dw
from dask_windows.errors import ConfigError
from dask_windows.workflow import Categorify, FillMissing, Normalize, Statics, TimeFeatures, Workflow, invert_target

SEASONS = np.array(["winter", "spring", "summer", "autumn"])
WINDOW, HORIZON, BATCH = 12, 3, 40
WEIGHTS = {"dense": 0.7, "sparse": 0.3}
PER_EPOCH = 330


def frame() -> pd.DataFrame:
    df = smd.co2.load_pandas().data.rename_axis("date").reset_index()
    df["decade"] = (df["date"].dt.year // 10 * 10).astype(str) + "s"
    df["season"] = SEASONS[(df["date"].dt.month.to_numpy() % 12) // 3]
    return df


def workflow(df: pd.DataFrame, continuous=("co2", "date_month_sin", "date_month_cos"), min_frequency=1) -> Workflow:
    table = pd.DataFrame({"decade": sorted(df["decade"].unique())})
    table["era"] = np.where(table["decade"] < "1980s", "early", "late")
    table["rank"] = np.arange(len(table), dtype=float)
    return Workflow(
        [FillMissing(["co2"], method="ffill", limit=2), Normalize(["co2"], per_series=True),
         Categorify(["season"], min_frequency=min_frequency), TimeFeatures("date", ["month"], cyclic=True)],
        series="decade", continuous=list(continuous), categorical=["season"], target=["co2"],
        known=["date_month_sin", "date_month_cos", "season"],
        statics=Statics(table, numeric=["rank"], categorical=["era"]),
    )  # fmt: skip


@pytest.fixture(scope="module")
def co2(tmp_path_factory):
    root = tmp_path_factory.mktemp("co2mix")
    df = frame()
    df.to_parquet(root / "co2.parquet", row_group_size=256, index=False)
    wf = workflow(df).fit(str(root), scheduler="sync")
    return str(root), df, wf


def members(root: str, wf: Workflow, **kw) -> dict:
    named = wf.named(index=True)
    common = dict(window=WINDOW, horizon=HORIZON, nan="drop", **kw)
    return {
        "dense": dw.WindowDataset(root, workflow=named, batch_size=64, seed=1, **common),
        "sparse": dw.WindowDataset(root, workflow=named, stride=13, batch_size=16, seed=2, **common),
    }


def joined(batches: list[dict]) -> dict:
    return {k: np.concatenate([b[k].numpy() for b in batches]) for k in batches[0]}


def own_stream(ds: dw.WindowDataset, epochs: int) -> dict:
    """A member's named batches alone (one reader), its epochs laid end to end."""
    out = []
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        out += list(ds)
    return joined(out)


def brute_schedule(counts: list[int]) -> np.ndarray:
    """The member of each position: every (member, k) sorted by (2k + 1) / (2 n), ties by member."""
    keys = sorted((Fraction(2 * k + 1, 2 * n), m) for m, n in enumerate(counts) for k in range(n))
    return np.array([m for _, m in keys])


def test_a_mixture_of_named_batches_is_each_members_own_at_its_exact_quota(co2):
    root, df, wf = co2
    parts = members(root, wf)
    mixture = dw.mix(parts, WEIGHTS, windows_per_epoch=PER_EPOCH, batch_size=BATCH, return_source=True)
    assert mixture.keys == [*next(iter(parts["dense"])).keys()]
    counts = [int(c) for c in mixture.counts]
    assert counts == [231, 99] and parts["sparse"].num_windows < 2 * 99  # the sparse member wraps in epoch 1
    streams = {name: own_stream(ds, 2) for name, ds in parts.items()}
    for epoch in range(2):
        mixture.set_epoch(epoch)
        batches = list(mixture)
        assert all(set(b) == {*mixture.keys, "source"} for b in batches)
        assert [len(b["source"]) for b in batches] == [BATCH] * (PER_EPOCH // BATCH) + [PER_EPOCH % BATCH]
        got = joined(batches)
        np.testing.assert_array_equal(got["source"], brute_schedule(counts))  # every batch: the exact quotas
        for m, name in enumerate(parts):
            mine = got["source"] == m
            assert mine.sum() == counts[m]
            want = {k: v[epoch * counts[m] : (epoch + 1) * counts[m]] for k, v in streams[name].items()}
            for key in mixture.keys:
                assert got[key].dtype == want[key].dtype, key
                np.testing.assert_array_equal(got[key][mine], want[key], err_msg=f"{name} {key}")
    # and against pandas: the codes, the statics, and the target back in units
    index, vocab = got["index"], {v: i + 2 for i, v in enumerate(sorted(SEASONS))}
    rows = index[:, None] + np.arange(WINDOW)
    np.testing.assert_array_equal(got["past_cat"][:, 0], df["season"].map(vocab).to_numpy()[rows])
    ahead = index[:, None] + WINDOW + np.arange(HORIZON)
    np.testing.assert_array_equal(got["future_cat"][:, 0], df["season"].map(vocab).to_numpy()[ahead])
    decade = df["decade"].to_numpy()[index]
    np.testing.assert_array_equal(np.array(wf.series_keys)[got["series"]], decade)
    np.testing.assert_array_equal(got["static_cat"][:, 0], np.where(decade < "1980s", 2, 3))  # early, late
    filled = df.groupby("decade")["co2"].ffill(limit=2).to_numpy()
    units = invert_target(torch.from_numpy(got["target"]), {k: torch.from_numpy(v) for k, v in got.items()})
    np.testing.assert_allclose(units.numpy()[:, 0], filled[ahead], rtol=1e-6)


def test_named_mixture_through_two_workers_and_a_resume(co2):
    root, _, wf = co2
    kw = dict(windows_per_epoch=PER_EPOCH, batch_size=BATCH, return_source=True)
    whole = joined(list(dw.mix(members(root, wf), WEIGHTS, **kw)))
    loader = torch.utils.data.DataLoader(dw.mix(members(root, wf), WEIGHTS, **kw), batch_size=None, num_workers=2)
    got = list(loader)
    assert all(isinstance(b, dict) for b in got)
    by_workers = joined(got)
    order = np.lexsort((by_workers["index"], by_workers["source"]))
    want = np.lexsort((whole["index"], whole["source"]))
    for key in whole:
        np.testing.assert_array_equal(by_workers[key][order], whole[key][want], err_msg=key)
    first = dw.mix(members(root, wf), WEIGHTS, **kw)
    it = iter(first)
    taken = [next(it) for _ in range(3)]
    state = first.state_dict()
    del it
    again = dw.mix(members(root, wf), WEIGHTS, **kw)
    again.load_state_dict(state)
    resumed = joined(taken + list(again))
    for key in whole:
        np.testing.assert_array_equal(resumed[key], whole[key], err_msg=key)


def test_members_that_differ_are_refused_naming_the_member_and_the_field(co2):
    root, df, wf = co2
    parts = members(root, wf)
    common = dict(window=WINDOW, horizon=HORIZON, nan="drop")
    plain = dw.WindowDataset(root, workflow=wf, **common)
    with pytest.raises(ConfigError, match="member 'plain' yields tuples but 'dense' yields named"):
        dw.mix({"dense": parts["dense"], "plain": plain})
    with pytest.raises(ConfigError, match="member 'dense' yields named batches.*'plain' yields tuples"):
        dw.mix({"plain": plain, "dense": parts["dense"]})
    no_index = dw.WindowDataset(root, workflow=wf.named(), **common)
    with pytest.raises(ConfigError, match=r"member 'b' yields the fields \[.*'series'\] but 'dense'"):
        dw.mix({"dense": parts["dense"], "b": no_index})
    longer = dw.WindowDataset(root, workflow=wf.named(index=True), **{**common, "window": WINDOW + 1})
    with pytest.raises(ConfigError, match=r"member 'long' yields 'past_cont' of shape \(B, 3, 13\) float32 where"):
        dw.mix({"dense": parts["dense"], "long": longer})
    reordered = workflow(df, continuous=("date_month_sin", "co2", "date_month_cos")).fit(root, scheduler="sync")
    other = dw.WindowDataset(root, workflow=reordered.named(index=True), **common)
    with pytest.raises(ConfigError, match=r"member 'r' yields 'past_cont' of the columns \['date_month_sin', 'co2'"):
        dw.mix({"dense": parts["dense"], "r": other})
    # fitted apart with another vocabulary: mixed, with a warning naming the column
    rare = workflow(df, min_frequency=600).fit(root, scheduler="sync")  # summer, autumn: rarer than 600 weeks
    apart = dw.WindowDataset(root, workflow=rare.named(index=True), **common)
    with pytest.warns(UserWarning, match=r"'dense' and 'apart' were fitted apart.*\['season'\]"):
        mixture = dw.mix({"dense": parts["dense"], "apart": apart})
    assert set(next(iter(mixture))) == set(mixture.keys)


def test_tuple_members_whose_lookbacks_differ_mix_by_the_window_they_yield(co2):
    root, df, wf = co2
    deeper = workflow(df)
    deeper.ops[0] = FillMissing(["co2"], method="ffill", limit=5)  # lookback 5 rows against 2
    deeper.fit(root, scheduler="sync")
    common = dict(window=WINDOW, nan="drop", return_index=True)
    a = dw.WindowDataset(root, workflow=wf, batch_size=32, **common)
    b = dw.WindowDataset(root, workflow=deeper, batch_size=32, **common)
    assert a.spec.window != b.spec.window
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the tuple has no check of the two fits' vocabularies)
        mixture = dw.mix({"a": a, "b": b}, windows_per_epoch=100, batch_size=25)
    x, y, index = next(iter(mixture))
    assert x.shape == (25, 4, WINDOW)


def test_two_ranks_take_equal_disjoint_slices_of_the_named_epoch(co2):
    root, _, wf = co2
    kw = dict(windows_per_epoch=PER_EPOCH, batch_size=BATCH, return_source=True)
    whole = joined(list(dw.mix(members(root, wf), WEIGHTS, **kw)))
    ranks = [joined(list(dw.mix(members(root, wf), WEIGHTS, rank=r, world_size=2, **kw))) for r in range(2)]
    assert len(ranks[0]["index"]) == len(ranks[1]["index"]) == PER_EPOCH // 2
    for key in whole:  # rank 0 the first half of the epoch, rank 1 the second, field by field
        np.testing.assert_array_equal(np.concatenate([ranks[0][key], ranks[1][key]]), whole[key], err_msg=key)
