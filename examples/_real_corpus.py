"""A small real corpus: data sets shipped inside statsmodels, written as list-column files.

Every data set is one folder of one row per series (``item_id``, ``start``, ``freq``,
``target``): ``list<float>`` for one channel, ``list<list<float>>`` (channels x time)
for several. Yearly to weekly, 1 to 12 channels, 12 to 2,284 steps, with missing
values (``co2`` holds NaN, ``fertility`` nulls). Nothing is downloaded: statsmodels
ships these files.

    write_corpus(folder, kind="parquet")   # {name: path}, one folder per data set
    write_corpus(folder, kind="datasets")  # Hugging Face save_to_disk folders

``PACKAGE_FREQS`` lists data sets bundled with pmdarima (an optional install: every
one read from files inside the package, none of its loaders that download): half-hourly
electricity demand, heart rate every half second, Microsoft's daily prices and volume
(5 channels, 7,983 days), monthly to yearly series of 89 to 2,820 steps, one with a
missing value. ``write_corpus(folder, names=[...])`` writes any of both lists.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

__all__ = ["CORPUS_FREQS", "PACKAGE_FREQS", "load_corpus", "write_corpus"]

CORPUS_FREQS = {
    "sunspots": "Y",
    "nile": "Y",
    "co2": "W",
    "macrodata": "Q",
    "elnino": "M",
    "fertility": "Y",
    "danish": "Q",
    "interest": "Q",
    "copper": "Y",
    "longley": "Y",
    "grunfeld": "Y",
}


#: Data sets shipped inside pmdarima (``pmdarima.datasets``), by frequency.
PACKAGE_FREQS = {
    "airpassengers": "M",
    "ausbeer": "Q",
    "austres": "Q",
    "heartrate": "500ms",
    "lynx": "Y",
    "msft": "D",
    "pm_sunspots": "M",
    "taylor": "30min",
    "wineind": "M",
    "woolyrnq": "Q",
}

_PACKAGE_STARTS = {
    "airpassengers": "1949-01-01",
    "ausbeer": "1956-01-01",
    "austres": "1971-03-01",
    "heartrate": "2000-01-01",
    "lynx": "1821-01-01",
    "pm_sunspots": "1749-01-01",
    "taylor": "2000-06-05",
    "wineind": "1980-01-01",
    "woolyrnq": "1965-01-01",
}


def _package_rows(name: str) -> list[tuple[str, str, Any]]:
    """One pmdarima data set as ``[(item_id, start, values)]`` (files inside the package, nothing downloaded)."""
    import pmdarima.datasets as data

    if name == "msft":
        d = data.load_msft()
        values = d[["Open", "High", "Low", "Close", "Volume"]].to_numpy(float).T
        return [("MSFT", str(d["Date"].iloc[0])[:10], values)]
    loader = getattr(data, "load_" + name.removeprefix("pm_"))
    return [(name, _PACKAGE_STARTS[name], np.asarray(loader(as_series=False), float))]


def _rows(name: str) -> list[tuple[str, str, Any]]:
    """``[(item_id, start, values)]`` of one data set: values ``(T,)`` or ``(C, T)`` float64."""
    import statsmodels.datasets as data

    if name in PACKAGE_FREQS:
        return _package_rows(name)
    if name == "sunspots":
        d = data.sunspots.load_pandas().data
        return [("sunspots", "1700-01-01", d["SUNACTIVITY"].to_numpy(float))]
    if name == "nile":
        d = data.nile.load_pandas().data
        return [("nile", "1871-01-01", d["volume"].to_numpy(float))]
    if name == "co2":
        d = data.co2.load_pandas().data
        return [("co2", "1958-03-29", d["co2"].to_numpy(float))]
    if name == "macrodata":
        d = data.macrodata.load_pandas().data.drop(columns=["year", "quarter"])
        return [("us-macro", "1959-01-01", d.to_numpy(float).T)]
    if name == "elnino":
        d = data.elnino.load_pandas().data.drop(columns=["YEAR"])
        return [("elnino", "1950-01-01", d.to_numpy(float).reshape(-1))]
    if name == "fertility":
        d = data.fertility.load_pandas().data
        years = [c for c in d.columns if c.isdigit()]
        return [(code, "1960-01-01", row) for code, row in zip(d["Country Code"], d[years].to_numpy(float))]
    if name == "danish":
        d = data.danish_data.load_pandas().data
        return [("denmark", "1974-01-01", d.to_numpy(float).T)]
    if name == "interest":
        d = data.interest_inflation.load_pandas().data.drop(columns=["year", "quarter"])
        return [("germany", "1972-01-01", d.to_numpy(float).T)]
    if name == "copper":
        d = data.copper.load_pandas().data.drop(columns=["TIME"])
        return [("copper", "1951-01-01", d.to_numpy(float).T)]
    if name == "longley":
        d = data.longley.load_pandas().data.drop(columns=["YEAR"])
        return [("longley", "1947-01-01", d.to_numpy(float).T)]
    if name == "grunfeld":
        d = data.grunfeld.load_pandas().data
        out = []
        for firm, g in d.groupby("firm", sort=True):
            out.append(
                (str(firm), "1935-01-01", g.sort_values("year")[["invest", "value", "capital"]].to_numpy(float).T)
            )
        return out
    raise KeyError(name)


def load_corpus(names: list[str] | None = None) -> dict[str, list[tuple[str, str, np.ndarray]]]:
    """``{name: [(item_id, start, values)]}`` of the statsmodels data sets (or ``names``), values ``(T,)`` or ``(C, T)``."""
    return {name: _rows(name) for name in names or CORPUS_FREQS}


def _table(name: str, rows: list, nulls: bool) -> Any:
    import pyarrow as pa

    multivariate = rows[0][2].ndim == 2
    kind = pa.list_(pa.list_(pa.float64())) if multivariate else pa.list_(pa.float64())
    values = [v.tolist() for _, _, v in rows]
    return pa.table(
        {
            "item_id": pa.array([r[0] for r in rows], pa.string()),
            "start": pa.array(np.array([r[1] for r in rows], dtype="datetime64[s]")),
            "freq": pa.array([{**CORPUS_FREQS, **PACKAGE_FREQS}[name]] * len(rows), pa.string()),
            "target": pa.array(values, kind, from_pandas=nulls),  # from_pandas: NaN written as null
        }
    )


def write_corpus(
    folder: str, kind: str = "parquet", row_group_size: int = 64, names: list[str] | None = None
) -> dict[str, str]:
    """Write every data set (or those of ``names``) under ``folder``; ``{name: path}``.

    ``fertility``'s missing values are written as nulls, ``co2``'s stay NaN.
    """
    import pyarrow.parquet as pq

    paths = {}
    for name in names or list(CORPUS_FREQS):
        rows = _rows(name)
        table = _table(name, rows, nulls=name == "fertility")
        path = os.path.join(folder, name)
        if kind == "parquet":
            os.makedirs(path, exist_ok=True)
            pq.write_table(table, os.path.join(path, "part-0.parquet"), row_group_size=row_group_size)
        elif kind == "datasets":
            import datasets

            datasets.disable_progress_bars()
            datasets.Dataset(table).save_to_disk(path)
        else:
            raise ValueError(f"kind={kind!r} must be 'parquet' or 'datasets'")
        paths[name] = path
    return paths
