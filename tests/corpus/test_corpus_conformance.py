"""Conformance matrix of corpora: every format x every hostile value, against one oracle.

Each cell writes a few short series with one format's own writer (pyarrow, pandas, Polars,
Hugging Face ``datasets`` folders and objects, GluonTS's ``ArrowWriter`` where it installs
(its layout by hand with pyarrow where it does not), uni2ts' LOTSA ``fixed_size_list`` through
``datasets`` features), the values cut from a real packaged series (statsmodels' weekly CO2,
which has gaps of its own) with one hostile value planted. ``oracle`` says, from the input
alone with numpy, what must come out:

* refused (``SchemaError`` at open, the message matched): ragged channels, a null channel;
* otherwise every step of every kept series served exactly once, its value as float32 where it
  is finite and within float32's range, else masked (``observed_mask`` 0, target 0): NaN, null,
  ``±inf`` and float64 beyond float32 alike; null rows and empty series left out and counted;
  the report's missing and infinite counts equal numpy's.

``compare`` checks what ``CorpusDataset`` served against it; ``test_oracle_catches_wrong_answers``
shows that it fails on deliberately wrong answers.
"""

from __future__ import annotations

import copy
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dask_windows as dw
from dask_windows.corpus import LeftOutSeriesWarning
from dask_windows.errors import SchemaError

KW = dict(patch_size=4, max_length=16, min_length=1, batch_size=4, shuffle=False, return_index=True)
F32_MAX = float(np.finfo(np.float32).max)
LENGTHS = (7, 12, 5)  # steps of the three series of every cell


@pytest.fixture(scope="module")
def co2():
    datasets = pytest.importorskip("statsmodels.datasets")  # not statsmodels.api: seconds of imports less
    values = datasets.co2.load_pandas().data["co2"].to_numpy(np.float64)
    assert np.isnan(values[:40]).any()  # the real series' own gaps are in every cell
    return values


# -- the inputs: series as nested Python lists (None for null), one hostile value planted ----------


def base_series(values: np.ndarray, channels: int) -> list:
    """Three series of ``LENGTHS`` steps and ``channels`` channels cut from the real series."""
    out, at = [], 0
    for n in LENGTHS:
        block = values[at : at + channels * n].reshape(channels, n)
        out.append([[None if np.isnan(v) else float(v) for v in row] for row in block])
        at += channels * n
    return out


def plant(series: list, hostile: str) -> list:
    """``series`` with ``hostile`` planted (a deep copy)."""
    s = copy.deepcopy(series)
    last = len(s[1]) - 1
    if hostile == "nan":
        s[1][0][2] = float("nan")
    elif hostile == "null":
        s[1][last][3] = None
    elif hostile == "inf":
        s[1][last][1], s[0][0][0] = float("inf"), float("-inf")
    elif hostile == "overflow":  # float64 beyond float32: the cast makes it inf
        s[1][0][4], s[2][last][0] = 1e39, -1e39
    elif hostile == "empty":
        s[1] = [[] for _ in s[1]]
    elif hostile == "all_null":
        s[1] = [[None] * len(c) for c in s[1]]
    elif hostile == "null_row":
        s[1] = None
    elif hostile == "nested_null":  # a null channel
        s[1][last] = None
    elif hostile == "ragged":
        s[1][last] = s[1][last][:-1]
    return s


HOSTILE = ["clean", "nan", "null", "inf", "overflow", "empty", "all_null", "null_row", "nested_null", "ragged"]
MULTIVARIATE_ONLY = {"nested_null", "ragged"}

# -- the oracle ---------------------------------------------------------------------------------


@dataclass
class Expected:
    """What must come out of one cell."""

    refused: str | None = None  # a regex of the message, or None: served
    values: dict = field(default_factory=dict)  # {(series, channel): (T,) float32, NaN where masked}
    missing: int = 0
    infinite: int = 0
    series_all_missing: int = 0
    empty_rows: int = 0


def oracle(series: list) -> Expected:
    """What ``CorpusDataset`` must do with ``series`` (see the module docstring), by numpy from the input."""
    for r, s in enumerate(series):
        if s is None:
            continue
        if any(c is None for c in s):
            return Expected(refused=rf"row {r} of .*channel \d+ of column 'target' is null")
        if len({len(c) for c in s}) > 1:
            return Expected(refused=rf"row {r} of .*channels of column 'target' differ in length")
    out = Expected()
    for r, s in enumerate(series):
        if s is None or not len(s[0]):
            out.empty_rows += 1
            continue
        raw = np.array([[np.nan if v is None else v for v in c] for c in s], np.float64)  # (C, T)
        with np.errstate(invalid="ignore"):
            infinite = np.isinf(raw) | (np.abs(raw) > F32_MAX)
        bad = np.isnan(raw) | infinite
        out.missing += int(bad.sum())
        out.infinite += int(infinite.sum())
        out.series_all_missing += int(bad.all())
        for c, row in enumerate(np.where(bad, np.nan, raw).astype(np.float32)):
            out.values[(r, c)] = row
    return out


def serve(data: Any) -> dict:
    """What ``CorpusDataset`` does with ``data``: ``{"refused": message}`` or the values served and the report."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LeftOutSeriesWarning)
            ds = dw.CorpusDataset(data, **KW)
    except SchemaError as exc:
        return {"refused": str(exc)}
    steps: dict = {}
    for b in ds:
        b = {k: v.numpy() for k, v in b.items()}
        real = b["sample_id"] > 0
        assert not b["observed_mask"][~real].any() and (b["target"][~b["observed_mask"]] == 0).all()
        for i, t in zip(*np.nonzero(real)):
            key = (int(b["series_id"][i, t]), int(b["variate_id"][i, t]))
            for k in range(b["target"].shape[-1]):
                if b["step"][i, t] + k >= 0:  # left padding of a short first patch: before step 0
                    observed = bool(b["observed_mask"][i, t, k])
                    value = b["target"][i, t, k] if observed else np.float32("nan")
                    steps.setdefault(key, []).append((int(b["step"][i, t] + k), value))
    values = {}
    for key, pairs in steps.items():
        at = np.array([p for p, _ in pairs])
        got = np.full(at.max() + 1, -7.0, np.float32)  # -7: a step never served
        got[at] = [v for _, v in pairs]
        assert len(np.unique(at)) == len(at), f"{key}: a step served twice"
        values[key] = got
    (entry,) = ds.report(values=True)["datasets"].values()
    return {"values": values, "report": entry}


def compare(expected: Expected, got: dict) -> None:
    """Assert that ``got`` (``serve``'s) is what ``expected`` (``oracle``'s) says."""
    if expected.refused is not None:
        assert "refused" in got, f"served where it must refuse ({expected.refused})"
        assert re.search(expected.refused, got["refused"]), got["refused"]
        return
    assert "refused" not in got, f"refused: {got.get('refused')}"
    values = got["values"]
    assert set(values) == set(expected.values), (sorted(values), sorted(expected.values))
    for key, want in expected.values.items():
        np.testing.assert_array_equal(values[key], want, err_msg=f"series {key[0]} channel {key[1]}")
        assert np.isfinite(values[key][~np.isnan(values[key])]).all()
    report = got["report"]
    assert report["missing"]["missing_observations"] == expected.missing
    assert report["missing"]["infinite_observations"] == expected.infinite
    assert report["missing"]["series_all_missing"] == expected.series_all_missing
    assert report["left_out"]["empty_rows"] == expected.empty_rows


# -- the formats: each writes series with its own writer and gives what CorpusDataset opens -------


def write_parquet_pyarrow(series, path, multivariate):
    kind = pa.list_(pa.list_(pa.float64())) if multivariate else pa.list_(pa.float64())
    rows = [s if multivariate or s is None else s[0] for s in series]
    pq.write_table(pa.table({"target": pa.array(rows, kind)}), str(path / "x.parquet"), row_group_size=2)
    return str(path / "x.parquet")


def write_arrow_ipc(series, path, multivariate):
    kind = pa.list_(pa.list_(pa.float64())) if multivariate else pa.large_list(pa.float64())
    table = pa.table({"target": pa.array([s if multivariate or s is None else s[0] for s in series], kind)})
    new = pa.ipc.new_file if multivariate else pa.ipc.new_stream  # the file and the stream format
    with pa.OSFile(str(path / "x.arrow"), "wb") as f, new(f, table.schema) as w:
        w.write_table(table, max_chunksize=2)
    return str(path / "x.arrow")


def write_pandas_nested(series, path, multivariate):
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"target": list(series)})  # an object column of lists of lists: pyarrow infers the type
    frame.to_parquet(str(path / "x.parquet"))
    return str(path / "x.parquet")


def write_polars(series, path, multivariate):
    pl = pytest.importorskip("polars")
    kind = pl.List(pl.List(pl.Float64)) if multivariate else pl.List(pl.Float64)
    rows = [s if multivariate or s is None else s[0] for s in series]
    pl.DataFrame({"target": rows}, schema={"target": kind}).write_parquet(str(path / "x.parquet"))
    return str(path / "x.parquet")


def _hf(series, multivariate, length=None, dtype="float64"):
    datasets = pytest.importorskip("datasets")
    value = datasets.Value(dtype)
    kind = (
        datasets.Sequence(datasets.Sequence(value), length=length or -1) if multivariate else datasets.Sequence(value)
    )
    rows = [s if multivariate or s is None else s[0] for s in series]
    return datasets.Dataset.from_dict({"target": rows}, features=datasets.Features({"target": kind}))


def write_hf_folder(series, path, multivariate):
    _hf(series, multivariate).save_to_disk(str(path / "hf"))
    return str(path / "hf")


def write_hf_object(series, path, multivariate):
    return _hf(series, multivariate)


def write_lotsa(series, path, multivariate):
    """uni2ts' builders: ``Sequence(Sequence(float32), length=C)``, a ``fixed_size_list`` column, saved to disk."""
    data = _hf(series, True, length=2, dtype="float32")
    assert pa.types.is_fixed_size_list(data.data.schema.field("target").type)
    data.save_to_disk(str(path / "lotsa"))
    return str(path / "lotsa")


def write_gluonts(series, path, multivariate):
    """GluonTS's ``ArrowWriter`` (numpy arrays: null is NaN); its layout by hand where GluonTS does not import."""
    pd = pytest.importorskip("pandas")
    arrays = [np.array([[np.nan if v is None else v for v in c] for c in s], np.float64) for s in series]
    arrays = [a if multivariate else a[0] for a in arrays]
    try:
        from gluonts.dataset.arrow import ArrowWriter
    except ImportError:
        table = {"target": pa.array([a.ravel() for a in arrays], pa.list_(pa.float64()))}
        if multivariate:
            table["target._np_shape"] = pa.array([list(a.shape) for a in arrays], pa.list_(pa.int64()))
        pq.write_table(pa.table(table), str(path / "x.parquet"))
        return str(path / "x.parquet")
    entries = [{"start": pd.Period("2000-01-01", "W"), "target": a} for a in arrays]
    ArrowWriter(compression=None).write_to_file(entries, path / "x.arrow")
    return str(path / "x.arrow")


# name: (writer, multivariate, hostile values it cannot express)
FORMATS = {
    "parquet-uni": (write_parquet_pyarrow, False, set()),
    "parquet-multi": (write_parquet_pyarrow, True, set()),
    "arrow-ipc-file": (write_arrow_ipc, True, set()),
    "arrow-ipc-stream-uni": (write_arrow_ipc, False, set()),
    "pandas-nested": (write_pandas_nested, True, set()),
    "polars-uni": (write_polars, False, set()),
    "polars-nested": (write_polars, True, set()),
    "hf-folder-multi": (write_hf_folder, True, set()),
    "hf-folder-uni": (write_hf_folder, False, set()),
    "hf-object": (write_hf_object, False, set()),
    "hf-object-multi": (write_hf_object, True, set()),
    "lotsa-fixed-size": (write_lotsa, True, {"overflow"}),  # float32 storage: 1e39 is written as inf
    "gluonts-uni": (write_gluonts, False, {"null_row"}),
    "gluonts-multi": (write_gluonts, True, {"null_row", "nested_null", "ragged"}),  # numpy: no ragged arrays
}

CELLS = [
    pytest.param(fmt, hostile, id=f"{fmt}-{hostile}")
    for fmt, (_, multi, cannot) in FORMATS.items()
    for hostile in HOSTILE
    if hostile not in cannot and (multi or hostile not in MULTIVARIATE_ONLY)
]


@pytest.mark.parametrize(("fmt", "hostile"), CELLS)
def test_conformance(fmt, hostile, co2, tmp_path):
    writer, multivariate, _ = FORMATS[fmt]
    series = plant(base_series(co2, 2 if multivariate else 1), hostile)
    compare(oracle(series), serve(writer(series, tmp_path, multivariate)))


def test_lotsa_float32_storage_serves_overflow_masked(co2, tmp_path):
    """The cell the matrix leaves out: float32 storage writes 1e39 as inf, which is served masked too."""
    series = plant(base_series(co2, 2), "overflow")
    compare(oracle(series), serve(write_lotsa(series, tmp_path, True)))


def test_oracle_catches_wrong_answers(co2, tmp_path):
    series = plant(base_series(co2, 1), "inf")
    expected = oracle(series)
    right = serve(write_parquet_pyarrow(series, tmp_path, False))
    compare(expected, right)
    wrong = copy.deepcopy(right)  # the old bug: inf served as an observation
    wrong["values"][(1, 0)][1] = np.inf
    with pytest.raises(AssertionError):
        compare(expected, wrong)
    wrong = copy.deepcopy(right)  # the report counting no infinite value
    wrong["report"]["missing"]["infinite_observations"] = 0
    with pytest.raises(AssertionError):
        compare(expected, wrong)
    wrong = copy.deepcopy(right)  # a step never served
    wrong["values"][(2, 0)] = wrong["values"][(2, 0)][:-1]
    with pytest.raises(AssertionError):
        compare(expected, wrong)
    with pytest.raises(AssertionError):  # served where the oracle refuses (ragged channels)
        compare(oracle(plant(base_series(co2, 2), "ragged")), right)
    with pytest.raises(AssertionError):  # refused where the oracle serves
        compare(expected, {"refused": "row 1: channels differ in length"})
