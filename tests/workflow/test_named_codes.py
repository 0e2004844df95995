"""The named batch's categorical codes, gathered as int64 from the rows' own int64 copy, against pandas.

With ``workflow=wf.named()`` the categories are the last feature channels
(``WindowSpec.code_features``): the pool casts each unit's rows once as the unit lands (rows
later overwritten by other units), a buffer of the piece order casts its rows once, and each
batch gathers the codes from there. Every window's codes and continuous values are checked
against the vocabulary applied with pandas, in both orders, with a lag's look-back rows,
batches cut across buffers, and DataLoader workers; ``named(code_dtype="int32")`` and
``named(code_dtype="narrow")`` against the default int64 batches.

The lag's values are checked where two row ranges transformed apart meet inside a series (a
small pool's units and the rows each keeps for the next, two pieces per partition): each range
is read with the look-back rows before it (``WorkflowSource.halo``); without them the lag's
first rows of a range were 0 in the yielded window.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from dask_windows import WindowDataset
from dask_windows.errors import ConfigError
from dask_windows.workflow import Categorify, FillMissing, Lag, Workflow

WINDOW = 12


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("namedcodes")
    rng = np.random.default_rng(7)
    lengths = [90, 140, 60, 200, 75, 130]
    sid = np.repeat(np.arange(len(lengths)), lengths)
    n = len(sid)
    store = np.array(["north", "south", "east", "west", "depot"], dtype=object)[rng.integers(0, 5, n)]
    store[rng.random(n) < 0.05] = None  # nulls: code 0
    kind = np.array(["a", "b", "c"], dtype=object)[sid % 3]
    df = pd.DataFrame({"series": sid, "value": rng.standard_normal(n).astype(np.float32), "store": store, "kind": kind})
    bounds = [0, 230, 490, n]  # series whole in each file
    for k in range(3):
        df.iloc[bounds[k] : bounds[k + 1]].to_parquet(root / f"part{k}.parquet", row_group_size=64, index=False)
    return str(root), df


def oracle(df: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per row: each category's code (0 null, then 2, 3, ... in sorted order) and the lag."""
    out = {}
    for col in ("store", "kind"):
        vocabulary = sorted(df[col].dropna().unique())
        out[col] = df[col].map({v: i + 2 for i, v in enumerate(vocabulary)}).fillna(0).to_numpy(np.int64)
    out["value"] = df["value"].to_numpy(np.float32)
    out["value_lag2"] = df.groupby("series")["value"].shift(2).to_numpy(np.float32)
    return out


def valid_starts(df: pd.DataFrame, lookback: int) -> np.ndarray:
    """Start rows of every yielded window: inside its series, after the look-back rows."""
    out = []
    for rows in df.groupby("series").indices.values():
        out += list(rows[lookback : len(rows) - WINDOW + 1])
    return np.array(sorted(out))


def workflow(df: pd.DataFrame, lag: bool) -> Workflow:
    ops = [FillMissing(["value"], value=0.0), Categorify(["store", "kind"])]
    cont = ["value"]
    if lag:
        ops.append(Lag("value", [2]))
        cont.append("value_lag2")
    return Workflow(ops, series="series", continuous=cont, categorical=["store", "kind"]).fit(df, scheduler="sync")


def check(batches: list, df: pd.DataFrame, wf: Workflow) -> None:
    want = oracle(df)
    index = np.concatenate([b["index"].numpy() for b in batches])
    np.testing.assert_array_equal(np.sort(index), valid_starts(df, wf.lookback(wf.continuous)))
    for b in batches:
        rows = b["index"].numpy()[:, None] + np.arange(WINDOW)  # (B, L) dataset rows of each window
        cat = b["past_cat"]
        assert cat.dtype == torch.int64 and cat.is_contiguous() and tuple(cat.shape) == (len(rows), 2, WINDOW)
        for j, col in enumerate(("store", "kind")):
            np.testing.assert_array_equal(cat.numpy()[:, j], want[col][rows], err_msg=col)
        for j, col in enumerate(wf.continuous):
            np.testing.assert_array_equal(b["past_cont"].numpy()[:, j], want[col][rows], err_msg=col)


@pytest.mark.parametrize(
    "order", [dict(buffer_bytes=8_000), dict(pieces_per_partition=1), dict(pieces_per_partition=2)]
)
@pytest.mark.parametrize("lag", [False, True])
def test_codes_equal_pandas_in_both_orders(data, order, lag):
    path, df = data
    wf = workflow(df, lag)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a pool of few units warns)
        ds = WindowDataset(path, workflow=wf.named(index=True), window=WINDOW, batch_size=37, seed=2, **order)
        check(list(ds), df, wf)


def test_codes_through_dataloader_workers(data):
    path, df = data
    wf = workflow(df, lag=True)
    ds = WindowDataset(path, workflow=wf.named(index=True), window=WINDOW, batch_size=50, seed=4)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    check(list(loader), df, wf)


def _same_values_as_int64(data, code_dtype, want):
    """The int64 batches and those of ``code_dtype`` (and the workflow), checked to hold the same windows in
    the same order, every value equal, the categorical fields of dtype ``want``, the others unchanged."""
    path, df = data
    wf = workflow(df, lag=True)
    kw = dict(window=WINDOW, batch_size=37, seed=5, buffer_bytes=8_000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a pool of few units warns)
        wide = list(WindowDataset(path, workflow=wf.named(index=True), **kw))
        other = list(WindowDataset(path, workflow=wf.named(index=True, code_dtype=code_dtype), **kw))
    assert len(wide) == len(other)
    for a, b in zip(wide, other):
        assert list(a) == list(b)
        for key in a:
            dtype = want if key in ("past_cat", "static_cat", "future_cat") else a[key].dtype
            assert b[key].dtype == dtype, key
            np.testing.assert_array_equal(b[key].numpy(), a[key].numpy(), err_msg=key)
    return wide, other, wf


def test_int32_codes_hold_the_same_values(data):
    """``named(code_dtype="int32")``: the same windows in the same order, every value equal, the
    categorical fields int32 (what ``nn.Embedding`` takes), the other fields unchanged."""
    _, narrow, _ = _same_values_as_int64(data, "int32", torch.int32)
    embedded = torch.nn.Embedding(8, 3)(narrow[0]["past_cat"])
    assert tuple(embedded.shape) == (37, 2, WINDOW, 3)


def test_narrow_codes_hold_the_same_values_and_widen_to_the_int64_batch(data):
    """``named(code_dtype="narrow")``: the same windows in the same order, every value equal, the categorical
    fields int8 as the buffer keeps them (not widened on the host); ``widen_codes`` gives the int64 batch."""
    from dask_windows.workflow import widen_codes

    wide, narrow, wf = _same_values_as_int64(data, "narrow", torch.int8)
    for a, b in zip(wide, narrow):
        widened = widen_codes(b)
        assert widened["past_cat"].dtype == torch.int64 and widened["past_cont"] is b["past_cont"]
        assert all(torch.equal(widened[key], a[key]) for key in a)
    check([widen_codes(b) for b in narrow], data[1], wf)
    embedded = torch.nn.Embedding(8, 3)(widen_codes(narrow[0], torch.int32)["past_cat"])
    assert tuple(embedded.shape) == (37, 2, WINDOW, 3)


def test_code_dtype_refuses_other_dtypes(data):
    _, df = data
    with pytest.raises(ConfigError, match=re.escape("named(code_dtype='int16') must be 'int64', 'int32' or 'narrow'")):
        workflow(df, lag=False).named(code_dtype="int16")


def test_int32_members_mix_and_a_member_of_another_code_dtype_is_refused(data):
    import dask_windows as dw

    path, df = data
    wf = workflow(df, lag=False)
    kw = dict(window=WINDOW, batch_size=20, seed=1)
    a = WindowDataset(path, workflow=wf.named(code_dtype="int32"), **kw)
    b = WindowDataset(path, workflow=wf.named(code_dtype="int32"), stride=3, **kw)
    batch = next(iter(dw.mix({"a": a, "b": b}, windows_per_epoch=100, batch_size=20)))
    assert batch["past_cat"].dtype == torch.int32 and tuple(batch["past_cat"].shape) == (20, 2, WINDOW)
    wide = WindowDataset(path, workflow=wf.named(), **kw)
    with pytest.raises(ConfigError, match="'past_cat' .* int64 where 'a' yields .* int32.*code_dtype"):
        dw.mix({"a": a, "wide": wide})
    narrow = WindowDataset(path, workflow=wf.named(code_dtype="narrow"), **kw)
    with pytest.raises(ConfigError, match="'past_cat' .* int8 where 'a' yields .* int32.*code_dtype"):
        dw.mix({"a": a, "narrow": narrow})
    also = WindowDataset(path, workflow=wf.named(code_dtype="narrow"), stride=3, **kw)
    batch = next(iter(dw.mix({"narrow": narrow, "also": also}, windows_per_epoch=100, batch_size=20)))
    assert batch["past_cat"].dtype == torch.int8


@pytest.fixture(scope="module")
def wide_vocabulary(tmp_path_factory):
    """A category of 300 distinct values (codes up to 301: past int8), one of 4, and an integer
    column declared categorical without ``Categorify`` (values up to 5,000: range unknown to the fit)."""
    root = tmp_path_factory.mktemp("widecodes")
    rng = np.random.default_rng(11)
    sid = np.repeat(np.arange(4), 80)
    n = len(sid)
    df = pd.DataFrame({
        "series": sid,
        "value": rng.standard_normal(n).astype(np.float32),
        "item": np.array([f"item{i:03d}" for i in range(300)], dtype=object)[rng.integers(0, 300, n)],
        "kind": np.array(["a", "b", "c", "d"], dtype=object)[rng.integers(0, 4, n)],
        "level": rng.integers(0, 5000, n).astype(np.float32),
    })  # fmt: skip
    df.to_parquet(root / "part0.parquet", index=False, row_group_size=64)
    return str(root), df


@pytest.mark.parametrize(
    ("categorical", "code_dtype", "copy"),
    [(["kind"], "int64", "int8"), (["item", "kind"], "int64", "int16"), (["kind"], "int32", "int8"),
     (["kind", "level"], "int64", "int64"), (["level"], "int32", "int32"), (["kind"], "narrow", "int8"),
     (["item", "kind"], "narrow", "int16"), (["kind", "level"], "narrow", "int64")],
)  # fmt: skip
def test_codes_kept_in_the_narrowest_dtype_hold_every_value(wide_vocabulary, categorical, code_dtype, copy):
    """The buffer keeps the codes in the narrowest integer holding every ``Categorify`` code (``int8``
    up to 128 codes, ``int16`` beyond), or as the batch holds them where a categorical is not written
    by ``Categorify``; each batch widens them (``"narrow"``: yields them as kept): every code equals pandas'
    (codes past 127 included)."""
    path, df = wide_vocabulary
    coded = [c for c in categorical if c != "level"]
    ops = [Categorify(coded)] if coded else []
    wf = Workflow(ops, series="series", continuous=["value"], categorical=categorical).fit(df, scheduler="sync")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a pool of few units warns)
        ds = WindowDataset(path, workflow=wf.named(index=True, code_dtype=code_dtype), window=WINDOW, batch_size=29,
                           seed=3, buffer_bytes=6_000)  # fmt: skip
        batches = list(ds)
    assert ds.spec.code_dtype == copy
    want = {}
    for col in categorical:
        if col == "level":
            want[col] = df[col].to_numpy(np.int64)
        else:
            vocabulary = sorted(df[col].unique())
            want[col] = df[col].map({v: i + 2 for i, v in enumerate(vocabulary)}).to_numpy(np.int64)
    assert max(w.max() for w in want.values()) > 127 or copy == "int8"
    starts = np.concatenate([b["index"].numpy() for b in batches])
    assert len(starts) == len(valid_starts(df, 0))
    for b in batches:
        rows = b["index"].numpy()[:, None] + np.arange(WINDOW)  # (B, L) dataset rows of each window
        cat = b["past_cat"]
        assert cat.dtype == getattr(torch, copy if code_dtype == "narrow" else code_dtype) and cat.is_contiguous()
        for j, col in enumerate(categorical):
            np.testing.assert_array_equal(cat.numpy()[:, j], want[col][rows], err_msg=col)


def test_narrow_codes_widen_to_the_statics_vocabulary(tmp_path):
    """A categorical static of 150 values needs int16 where the categorical over the window fits int8: with
    ``code_dtype="narrow"`` all three fields are int16 (the buffer's int8 copy widened), values as int64's."""
    from dask_windows.workflow import Statics
    from dask_windows.workflow.apply import narrow_dtype

    rng = np.random.default_rng(3)
    sid = np.repeat(np.arange(150), 4)
    df = pd.DataFrame({"series": sid, "value": rng.standard_normal(len(sid)).astype(np.float32),
                       "kind": np.array(["a", "b", "c"], dtype=object)[rng.integers(0, 3, len(sid))]})  # fmt: skip
    df.to_parquet(tmp_path / "part0.parquet", index=False)
    table = pd.DataFrame({"series": np.arange(150), "label": [f"label{i:03d}" for i in range(150)]})
    wf = Workflow([Categorify(["kind"])], series="series", continuous=["value"], categorical=["kind"],
                  statics=Statics(table, categorical=["label"])).fit(df, scheduler="sync")  # fmt: skip
    assert narrow_dtype(wf) == "int16"
    kw = dict(window=3, batch_size=64, seed=1)
    wide = list(WindowDataset(str(tmp_path), workflow=wf.named(index=True), **kw))
    narrow = list(WindowDataset(str(tmp_path), workflow=wf.named(index=True, code_dtype="narrow"), **kw))
    assert max(int(b["static_cat"].max()) for b in narrow) > 127
    for a, b in zip(wide, narrow, strict=True):
        assert {b[k].dtype for k in ("past_cat", "static_cat", "future_cat")} == {torch.int16}
        for key in a:
            np.testing.assert_array_equal(b[key].numpy(), a[key].numpy(), err_msg=key)
