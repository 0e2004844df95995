"""A conformance matrix for ``WindowDataset``'s sources: every format x every hostile value, one oracle.

Each case is a small long-format frame (``sid``, a time column ``t``, a feature ``x`` whose values are
distinct per row, so a window read from the wrong rows cannot pass for the right one), written by the
ecosystem's own writers (pandas and Polars to Parquet, pyarrow to Arrow IPC and CSV) or handed over in
memory (pandas, Polars, Dask frames; numpy arrays, one per series). One oracle, written with numpy and
pandas alone, says what must come out for each: the exact multiset of windows served, or a refusal
whose message names the column and the remedy. ``nan="raise"`` and ``nan="drop"`` both run.

The oracle's conventions are the loader's documented ones: values are float32 (a float64 beyond its
range is inf); NaN, null and +-inf count as missing; windows follow the rows in the order given
(time steps are not checked: duplicates, gaps and an unsorted time column are windowed as rows), and
never cross a series change or a Dask partition (each partition is read alone).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pytest

import dask_windows as dw

WINDOW = 3
ROWS = 12  # per series


# -- the oracle -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """What must come out: ``windows`` served (each ``(window, C)`` float32), or a refusal."""

    windows: list[tuple] | None = None
    error: str | None = None  # the exception's type name
    column: object = None  # the column its message names
    remedy: str = ""  # a regular expression its message matches


def _key(window: np.ndarray) -> tuple:
    return tuple(np.asarray(window, np.float32).reshape(-1).tolist())


def oracle(frame: pd.DataFrame, features: list, window: int, nan: str, cuts: tuple[int, ...] = ()) -> Expected:
    """What ``WindowDataset(frame, features, series="sid", window=window, nan=nan)`` must give.

    ``cuts``: rows where a partition of the source begins (windows never cross one).
    """
    for col in features:
        if not (pd.api.types.is_numeric_dtype(frame[col]) or pd.api.types.is_bool_dtype(frame[col])):
            return Expected(error="SchemaError", column=col, remedy=r"not a number.*convert it to numbers")
    values = frame[features].astype("float64").to_numpy(np.float64, na_value=np.nan)
    with np.errstate(over="ignore"):
        values = values.astype(np.float32)  # (rows, C): what the loader serves, 1e39 -> inf
    bad = ~np.isfinite(values)  # (rows, C)
    sid = frame["sid"].to_numpy()
    begins = np.ones(len(frame), bool)  # where a run begins: a series change or a partition cut
    begins[1:] = sid[1:] != sid[:-1]
    begins[[c for c in cuts if 0 < c < len(frame)]] = True
    run = np.cumsum(begins)  # (rows,) run number of each row
    starts = [s for s in range(len(frame) - window + 1) if run[s] == run[s + window - 1]]
    flagged = [s for s in starts if bad[s : s + window].any()]
    if nan == "raise" and flagged:
        column = features[int(np.flatnonzero(bad[flagged[0] : flagged[0] + window].any(0))[0])]
        return Expected(error="DataError", column=column, remedy=r"nan='drop'")
    kept = [s for s in starts if s not in set(flagged)]
    if not kept:
        remedy = r"no windows.*sort the rows" if not starts else r"no windows|NaN|inf"
        return Expected(error="DataError", column="sid" if not starts else None, remedy=remedy)
    return Expected(windows=sorted(_key(values[s : s + window]) for s in kept))


def judge(expected: Expected, outcome: tuple, column_name: Callable[[object], str] = repr) -> list[str]:
    """What is wrong with ``outcome`` (``("served", windows)`` or ``("refused", type name, message)``)."""
    if expected.windows is not None:
        if outcome[0] != "served":
            return [f"refused ({outcome[1]}: {outcome[2][:300]}) where {len(expected.windows)} windows must be served"]
        got = sorted(outcome[1])
        if got == expected.windows:
            return []
        extra = set(got) - set(expected.windows)
        missing = set(expected.windows) - set(got)
        return [
            f"served {len(got)} windows, {len(expected.windows)} expected: {len(extra)} wrong, {len(missing)} missing"
        ]
    if outcome[0] == "served":
        return [f"served {len(outcome[1])} windows where {expected.error} naming {expected.column!r} was due"]
    _, kind, message = outcome
    problems = []
    if kind != expected.error:
        problems.append(f"{kind} where {expected.error} was due: {message[:300]}")
    if expected.column is not None and column_name(expected.column) not in message:
        problems.append(f"the message does not name {column_name(expected.column)}: {message[:300]}")
    if not re.search(expected.remedy, message, re.S):
        problems.append(f"the message gives no remedy /{expected.remedy}/: {message[:300]}")
    return problems


# -- the cases: hostile values in a long frame ----------------------------------------------------------


def _frame(num_series: int = 2, rows: int = ROWS) -> pd.DataFrame:
    sid = np.repeat([f"s{i}" for i in range(num_series)], rows)
    t = np.tile(pd.date_range("2024-03-30", periods=rows, freq="h").to_numpy(), num_series)  # over a DST change
    x = np.arange(num_series * rows, dtype=np.float64) + 0.5
    return pd.DataFrame({"sid": sid, "t": t, "x": x})


def _set(frame: pd.DataFrame, row: int, value: float) -> pd.DataFrame:
    frame = frame.copy()
    frame.loc[row, "x"] = value
    return frame


def _null(frame: pd.DataFrame, rows: slice) -> pd.DataFrame:
    frame = frame.copy()
    frame["x"] = frame["x"].astype("Float64")  # a nullable column: written as Arrow nulls, not NaN
    frame.loc[rows, "x"] = pd.NA
    return frame


def _zoned(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(t=pd.to_datetime(frame["t"]).dt.tz_localize("Europe/Paris", nonexistent="shift_forward"))


CASES: dict[str, Callable[[], pd.DataFrame]] = {
    "clean": _frame,
    "nan": lambda: _set(_frame(), ROWS + 4, np.nan),
    "null": lambda: _null(_frame(), slice(ROWS + 4, ROWS + 4)),
    "+inf": lambda: _set(_frame(), 2, np.inf),
    "-inf": lambda: _set(_frame(), ROWS - 1, -np.inf),
    "float32-overflow": lambda: _set(_frame(), 5, 1e39),
    "all-null-series": lambda: _null(_frame(), slice(ROWS, 2 * ROWS - 1)),
    "time-zone": lambda: _zoned(_frame()),
    "duplicate-time-steps": lambda: _frame().assign(t=lambda f: f["t"].where(f.index % 4 != 1, f["t"].shift(1))),
    "missing-time-steps": lambda: _frame().drop(index=[3, 4, ROWS + 7]).reset_index(drop=True),
    "unsorted-time": lambda: (
        _frame().iloc[np.r_[np.random.default_rng(0).permutation(ROWS), ROWS : 2 * ROWS]].reset_index(drop=True)
    ),
    "split-series": lambda: (
        _frame(3).iloc[np.r_[0:6, ROWS : 2 * ROWS, 6:ROWS, 2 * ROWS : 3 * ROWS]].reset_index(drop=True)
    ),
    "interleaved-series": lambda: (
        _frame().iloc[np.argsort(np.tile(np.arange(ROWS), 2), kind="stable")].reset_index(drop=True)
    ),
}
NUMPY_CASES = ["clean", "nan", "+inf", "-inf", "float32-overflow", "all-null-series", "empty-series"]


# -- the formats ------------------------------------------------------------------------------------------


@dataclass
class Written:
    data: object
    features: list
    cuts: tuple[int, ...] = ()
    column_name: Callable[[object], str] = repr
    skip: str = ""
    frame: pd.DataFrame | None = field(default=None, repr=False)


def _pandas(frame, tmp):
    return Written(frame, ["x"])


def _polars(frame, tmp):
    pl = pytest.importorskip("polars")
    return Written(pl.from_pandas(frame), ["x"])


def _dask(frame, tmp):
    dd = pytest.importorskip("dask.dataframe")
    data = dd.from_pandas(frame, npartitions=3, sort=False)
    lengths = data.map_partitions(len).compute().tolist()
    return Written(data, ["x"], cuts=tuple(np.cumsum(lengths)[:-1].tolist()))


def _parquet_pandas(frame, tmp):
    frame.to_parquet(tmp / "part-0.parquet", index=False, row_group_size=5)  # row groups cut series
    return Written(str(tmp), ["x"])


def _parquet_polars(frame, tmp):
    pl = pytest.importorskip("polars")
    pl.from_pandas(frame).write_parquet(tmp / "part-0.parquet", row_group_size=5)
    return Written(str(tmp), ["x"])


def _arrow_ipc(frame, tmp):
    import pyarrow as pa
    import pyarrow.dataset as pads
    import pyarrow.feather as feather

    feather.write_feather(pa.Table.from_pandas(frame, preserve_index=False), tmp / "part-0.arrow")
    return Written(pads.dataset(str(tmp), format="ipc"), ["x"])


def _csv(frame, tmp):
    import pyarrow.dataset as pads

    frame.to_csv(tmp / "part-0.csv", index=False)
    return Written(pads.dataset(str(tmp), format="csv"), ["x"])


FORMATS: dict[str, Callable] = {
    "pandas": _pandas,
    "polars": _polars,
    "dask": _dask,
    "parquet-pandas": _parquet_pandas,
    "parquet-polars": _parquet_polars,
    "arrow-ipc": _arrow_ipc,
    "csv": _csv,
}


def _serve(written: Written, nan: str, features: list | None = None, series: object = "sid") -> tuple:
    """What the loader does: ``("served", windows as (window, C) keys)`` or ``("refused", type, message)``."""
    features = written.features if features is None else features
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # warnings are not what this matrix checks
            ds = dw.WindowDataset(written.data, features, series=series, window=WINDOW, batch_size=5,
                                  shuffle=False, nan=nan, layout="NLC", prefetch_partitions=0)  # fmt: skip
            windows = [_key(w) for batch in ds for w in batch.numpy()]
    except (dw.DataError, dw.SchemaError, ValueError, TypeError) as exc:
        return ("refused", type(exc).__name__, str(exc))
    return ("served", windows)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_format_serves_or_refuses_every_hostile_value_as_the_oracle_says(tmp_path, fmt):
    problems = []
    for case, make in CASES.items():
        frame = make()
        folder = tmp_path / case
        folder.mkdir()
        written = FORMATS[fmt](frame, folder)
        for nan in ("raise", "drop"):
            expected = oracle(frame, ["x"], WINDOW, nan, written.cuts)
            problems += [f"{case}, nan={nan}: {p}" for p in judge(expected, _serve(written, nan), written.column_name)]
        if case == "time-zone":  # a zoned time column as a feature: refused naming it
            expected = oracle(frame, ["x", "t"], WINDOW, "raise")
            outcome = _serve(written, "raise", features=["x", "t"])
            problems += [f"{case} as a feature: {p}" for p in judge(expected, outcome, written.column_name)]
    assert not problems, f"{fmt}:\n" + "\n".join(problems)


def test_numpy_arrays_serve_or_refuse_every_hostile_value_as_the_oracle_says():
    """One ``(rows, 1)`` array per series; an empty array is a series of no rows."""
    problems = []
    for case in NUMPY_CASES:
        frame = _frame(3) if case == "empty-series" else CASES[case]()
        if case == "empty-series":
            frame = frame[frame["sid"] != "s1"].reset_index(drop=True)  # s1 has no rows
        arrays = [
            g["x"].astype("float64").to_numpy(np.float64, na_value=np.nan)[:, None] for _, g in frame.groupby("sid")
        ]
        if case == "empty-series":
            arrays.insert(1, np.zeros((0, 1)))
        written = Written(arrays, [0], column_name=lambda c: f"column {c}")
        numeric = frame[["sid", "x"]].rename(columns={"x": 0})
        for nan in ("raise", "drop"):
            expected = oracle(numeric, [0], WINDOW, nan)
            problems += [
                f"{case}, nan={nan}: {p}"
                for p in judge(expected, _serve(written, nan, series=None), written.column_name)
            ]
    assert not problems, "\n".join(problems)


def test_a_csv_file_given_as_a_path_is_refused_naming_convert(tmp_path):
    _frame().to_csv(tmp_path / "part-0.csv", index=False)
    with pytest.raises(dw.SourceReadError, match=r"is a CSV file, not Parquet.*dask-windows convert"):
        dw.WindowDataset(str(tmp_path / "part-0.csv"), ["x"], series="sid", window=WINDOW)


# -- the oracle itself catches wrong answers ------------------------------------------------------------


def test_the_oracle_catches_a_deliberately_wrong_answer():
    frame = CASES["nan"]()
    served = oracle(frame, ["x"], WINDOW, "drop")
    assert judge(served, ("served", list(served.windows))) == []  # the right answer passes
    values = frame["x"].to_numpy(np.float32)[:, None]
    crossing = _key(values[ROWS - 1 : ROWS - 1 + WINDOW])  # a window across the series change
    with_nan = _key(values[ROWS + 2 : ROWS + 2 + WINDOW])  # a window holding the NaN
    assert judge(served, ("served", [*served.windows, crossing]))
    assert judge(served, ("served", [*served.windows[1:], with_nan]))
    assert judge(served, ("served", served.windows[:-1]))  # one missing
    shifted = _key(values[1 : 1 + WINDOW] + 1)  # the right shape, values of other rows
    assert judge(served, ("served", [shifted, *served.windows[1:]]))
    assert judge(served, ("refused", "DataError", "NaN in feature column 'x'; pass nan='drop'"))
    refused = oracle(frame, ["x"], WINDOW, "raise")
    assert refused.error == "DataError" and refused.column == "x"
    assert judge(refused, ("served", list(served.windows)))  # NaN served silently
    assert judge(refused, ("refused", "DataError", "bad value somewhere"))  # no column, no remedy
    assert judge(refused, ("refused", "DataError", "NaN in feature column 'x'"))  # no remedy
    assert judge(refused, ("refused", "SchemaError", "column 'x': pass nan='drop'"))  # the wrong kind
    assert judge(refused, ("refused", "DataError", "NaN in column 'x'; pass nan='drop'")) == []
