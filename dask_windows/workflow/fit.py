"""Fitting a workflow's statistics in one Dask pass over the data.

Each partition is read once: the stateless operations run on it as the loader runs them, and each
fitted operation reduces it to a small partial (per-series count, mean and squared deviations merged
with Chan's formula; category counts; series ids), merged on the client. ``Normalize(method="robust")``
keeps the column's values (float64) for exact quantiles. Trade-off: a fitted operation cannot read a
column another fitted operation writes (that raises), and operations looking at earlier rows see each
partition alone. A spread-layout ``convert`` output is read a file at a time, each row counted once.
"""

from __future__ import annotations

import logging
import os
import resource
from collections.abc import Iterator
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError, DataError, SchemaError
from dask_windows.workflow.core import Workflow
from dask_windows.workflow.ops import Categorify, Normalize, Piece, TimeFeatures
from dask_windows.workflow.timesteps import check_timesteps, merge_timesteps, ticks, time_partial

__all__ = ["FitReport", "column_kind", "fit", "frame_columns"]

log = logging.getLogger(__name__)


@dataclass
class FitReport:
    """What a fit did: partitions and rows read, seconds, peak resident memory of this process."""

    partitions: int
    rows: int
    seconds: float
    peak_rss_bytes: int


def column_kind(dtype: Any) -> str:
    """``number``, ``bool``, ``datetime``, ``string`` or ``other`` for a pandas/numpy/Arrow dtype."""
    text = str(dtype).lower()
    if text.startswith(("datetime", "timestamp")):
        return "datetime"
    if text.startswith("bool"):
        return "bool"
    if text.startswith(("int", "uint", "float", "double", "decimal", "halffloat")):
        return "number"
    if text in ("object", "string", "str", "large_string", "category", "utf8", "large_utf8") or text.startswith(
        ("string", "dictionary", "category")
    ):
        return "string"
    return "other"


def frame_columns(frame: Any, columns: list[str]) -> dict:
    """A pandas frame's columns as the loader's sources give them: numbers as numpy (NaN for null),
    strings as objects (``None`` for null), zoned timestamps as naive UTC ``datetime64``."""
    import pandas as pd

    out = {}
    for col in columns:
        s = frame[col]
        if isinstance(s.dtype, pd.DatetimeTZDtype):
            out[col] = s.dt.tz_convert("UTC").dt.tz_localize(None).to_numpy()
        elif column_kind(s.dtype) == "number":
            out[col] = s.to_numpy(dtype=np.float64 if s.isna().any() else None, na_value=np.nan)
        elif column_kind(s.dtype) == "string":
            out[col] = s.astype(object).where(s.notna(), None).to_numpy()
        else:
            out[col] = s.to_numpy()
    return out


def _bound(at: Any, dtype: Any, column: str) -> Any:
    """``at`` as the values ``frame_columns`` gives of a column of ``dtype`` (naive UTC for a zoned one)."""
    import pandas as pd

    kind = column_kind(dtype)
    try:
        if kind == "datetime":
            stamp = pd.Timestamp(at)
            zoned = getattr(dtype, "tz", None) is not None
            if zoned and stamp.tz is None:
                stamp = stamp.tz_localize(dtype.tz)
            if stamp.tz is not None:
                stamp = stamp.tz_convert("UTC").tz_localize(None) if zoned else stamp.tz_localize(None)
            return stamp.to_datetime64()
        if kind in ("number", "bool"):
            return float(at)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"fit(at={at!r}) cannot be compared with the {dtype} column {column!r}: {exc}") from exc
    return at


def _partial(frame: Any, wf: Workflow, runs: list | None = None, index: int = 0, train: tuple | None = None) -> dict:
    """One partition's partials: series ids, and per fitted operation what its statistics need.

    ``runs``: the file's runs from a spread-layout manifest (``[start, rows, value, origin, owned]``), each
    a series stretch of its own whose ``owned`` rows alone count; ``index``: the partition's position;
    ``train``: ``(time column, bound)``: only the rows before the bound count (``fit(at=...)``).
    """
    import pandas as pd

    cols = frame_columns(frame, wf.inputs)
    n = len(frame)
    series = cols.get(wf.series) if wf.series is not None else None
    stored_once = keep = None
    if runs is None:
        piece = Piece(n, series)
    else:
        lengths = np.array([r[1] for r in runs], np.int64)
        piece = Piece(n, np.repeat(np.arange(len(runs)), lengths))  # (rows,) run of each row
        owned = np.array([r[4] for r in runs], np.int64)
        stored_once = keep = np.arange(n) - piece.run_first_row() < np.repeat(owned, lengths)  # (rows,)
    if train is not None:
        before = np.asarray(frame_columns(frame, [train[0]])[train[0]] < train[1], bool)  # (rows,) in training
        keep = before if keep is None else keep & before
    kept = series if series is None or keep is None else series[keep]
    rows = n if keep is None else int(keep.sum())
    counts = pd.Series(kept).value_counts() if kept is not None else pd.Series([rows], dtype=np.int64)
    out: dict = {"rows": rows, "series": set(_keys(counts.index)) if kept is not None else set(), "lengths": counts}
    if wf.time is not None:
        out["time"] = _time_partial(frame, wf, piece, runs, stored_once, index)
    tainted: set[str] = set()
    for i, op in enumerate(wf.ops):
        if op.fitted:
            if set(op.inputs) & tainted:
                col = sorted(set(op.inputs) & tainted)[0]
                raise ConfigError(
                    f"{op!r} reads {col!r}, which an earlier fitted operation writes: one pass cannot fit both; "
                    "fit them as two workflows, or reorder the operations"
                )
            out[i] = _op_partial(op, cols if keep is None else {c: cols[c][keep] for c in op.inputs}, kept)
            tainted |= set(op.outputs())
        elif set(op.inputs) & tainted:
            tainted |= set(op.outputs())
        else:
            op.apply(cols, piece)
    return out


def _time_partial(frame: Any, wf: Workflow, piece: Piece, runs: list | None, keep: Any, index: int) -> dict:
    """The steps of the time column inside this partition's runs (``timesteps.time_partial``)."""
    column = str(wf.time)
    raw = frame_columns(frame, [column])[column]
    times, step = ticks(raw, wf.freq)
    if runs is None:  # runs of one series in the order of the partitions, then of their rows
        order = index * 2.0**40 + piece.starts
        out = time_partial(times, step, piece.keys, piece.starts, piece.lengths, order)
    else:
        owned = np.array([r[4] for r in runs], np.int64)
        starts = np.cumsum(owned) - owned  # (runs,) first row of each run among the owned rows
        origin = np.array([r[3] for r in runs], np.float64)  # where each run lies in its whole series
        out = time_partial(times[keep], step, [r[2] for r in runs], starts, owned, origin)
    return {**out, "datetime": raw.dtype.kind in "MO"}


def _keys(values: Any) -> list:
    return [v.item() if isinstance(v, np.generic) else v for v in values if v is not None and v == v]


def _op_partial(op: Any, cols: dict, series: np.ndarray | None) -> dict:
    import pandas as pd

    out = {}
    for col in op.columns:
        if isinstance(op, Categorify):
            values = pd.Series(cols[col])
            out[col] = values[values.notna()].value_counts()
            continue
        values = np.asarray(cols[col], np.float64)
        frame = pd.DataFrame({"v": values, "k": series if op.per_series else 0})
        frame = frame[~np.isnan(values)]
        if op.method == "robust":
            groups = {k: g.to_numpy() for k, g in frame.groupby("k")["v"]} if op.per_series else {}
            out[col] = (frame["v"].to_numpy(), groups)
            continue
        out[col] = (
            _moments(frame["v"]),
            frame.groupby("k")["v"].agg(["count", "mean", "var"]) if op.per_series else None,
        )
    return out


def _moments(values: Any) -> Any:
    import pandas as pd

    n = len(values)
    return pd.DataFrame({"count": [n], "mean": [values.mean() if n else 0.0], "var": [values.var() if n > 1 else 0.0]})


def _merge_moments(frames: list) -> Any:
    """Chan's merge of ``(count, mean, var)`` rows that share an index (a series id), ``ddof=1``."""
    import pandas as pd

    both = pd.concat(frames)
    both = both[both["count"] > 0]
    m2 = both["var"].fillna(0.0) * (both["count"] - 1)
    both = both.assign(sum=both["count"] * both["mean"], m2=m2)
    g = both.groupby(level=0)
    count, total = g["count"].sum(), g["sum"].sum()
    mean = total / count
    spread = (both["count"] * (both["mean"] - mean.reindex(both.index).to_numpy()) ** 2).groupby(level=0).sum()
    m2 = g["m2"].sum() + spread
    return pd.DataFrame({"count": count, "mean": mean, "var": m2 / (count - 1).where(count > 1)})


def _merge(a: dict, b: dict, wf: Workflow) -> dict:
    out: dict[Any, Any] = {"rows": a["rows"] + b["rows"], "series": a["series"] | b["series"],
                           "lengths": a["lengths"].add(b["lengths"], fill_value=0)}  # fmt: skip
    if "time" in a:
        out["time"] = merge_timesteps(a["time"], b["time"])
    for i, op in enumerate(wf.ops):
        if not op.fitted:
            continue
        out[i] = {}
        for col in op.columns:
            x, y = a[i][col], b[i][col]
            if isinstance(op, Categorify):
                out[i][col] = x.add(y, fill_value=0)
            elif getattr(op, "method", None) == "robust":
                groups = dict(x[1])
                for k, v in y[1].items():
                    groups[k] = np.concatenate([groups[k], v]) if k in groups else v
                out[i][col] = (np.concatenate([x[0], y[0]]), groups)
            else:
                per = None if x[1] is None else _merge_moments([x[1], y[1]])
                out[i][col] = (_merge_moments([x[0], y[0]]), per)
    return out


def _scale(value: float) -> float:
    return float(value) if np.isfinite(value) and value > 0 else 1.0


def _finish(wf: Workflow, merged: dict, what: Any = "the data") -> None:
    """Turn merged partials into each operation's JSON-ready state."""
    wf.series_keys = sorted(merged["series"]) if wf.series is not None else []
    if wf.time is not None:
        wf.timesteps = check_timesteps(wf, merged["time"], what)
    longest = int(merged["lengths"].max()) if len(merged["lengths"]) else 0
    for op in wf.ops:
        if op.lookback() >= longest:
            raise ConfigError(
                f"{op!r} looks back {op.lookback()} rows: as long as or longer than every series of the data "
                f"(longest: {longest:,} rows), so no window could be yielded; use shorter lags or a smaller limit"
            )
    for i, op in enumerate(wf.ops):
        if isinstance(op, Categorify):
            op.state = {}
            for col in op.columns:
                counts = merged[i][col]
                kept = counts[counts >= op.min_frequency].index
                op.state[col] = sorted(_keys(kept))
        elif isinstance(op, Normalize):
            op.state = {col: _normalize_state(op, col, merged[i][col], wf.series_keys, what) for col in op.columns}


def _normalize_state(op: Normalize, col: str, partial: tuple, keys: list, what: Any) -> dict:
    """``{"global": [loc, scale], "series": [[loc, scale], ...] or None}``; a series without a value in
    ``col`` takes the global statistics (as a series the fit did not see); a column without one raises."""
    if op.method == "robust":
        values, groups = partial
        count = len(values)

        def loc_scale(v: np.ndarray) -> list:
            q25, q50, q75 = np.quantile(v, [0.25, 0.5, 0.75])
            return [float(q50), _scale(q75 - q25)]

        glob = loc_scale(values) if count else []
        per = [loc_scale(groups[k]) if len(groups.get(k, ())) else glob for k in keys] if op.per_series else None
    else:
        total, by_series = partial
        row = total.iloc[0]
        count = int(row["count"])
        glob = [float(row["mean"]), _scale(np.sqrt(row["var"]))] if count else []
        per = None
        if op.per_series:
            table = by_series.reindex(keys)
            per = [[float(m), _scale(np.sqrt(v))] if n > 0 else glob
                   for m, v, n in zip(table["mean"], table["var"], table["count"].fillna(0))]  # fmt: skip
    if not count:
        raise DataError(
            f"{op!r}: column {col!r} of {what} holds no value (every row is null or NaN), so it has no mean or "
            "scale to fit; fill it first (FillMissing(value=...) before Normalize), or leave the column out"
        )
    return {"global": glob, "series": per}


def _statics(wf: Workflow, storage_options: dict | None) -> None:
    """Check the static table against the series fitted on and keep its rows in ``series_keys`` order."""
    import pandas as pd

    st = wf.statics
    if st is None:
        return
    table = st.table
    where = "the static table"
    if isinstance(table, (str, os.PathLike)):
        where = str(table)
        reader = pd.read_csv if where.endswith(".csv") else pd.read_parquet
        table = reader(where, storage_options=storage_options)
    if not isinstance(table, pd.DataFrame):
        raise ConfigError(f"Statics(table=...) must be a pandas DataFrame or a Parquet/CSV path, got {type(table)}")
    for col in (st.key, *st.numeric, *st.categorical):
        if col not in table.columns:
            raise SchemaError(f"column {col!r} is not in {where}; columns: {list(table.columns)}")
    for col in st.numeric:
        if column_kind(table[col].dtype) not in ("number", "bool"):
            raise SchemaError(f"static numeric column {col!r} of {where} is {table[col].dtype}; list it as categorical")
    dup = table[st.key][table[st.key].duplicated()]
    if len(dup):
        raise DataError(
            f"{where} has {len(dup)} duplicate series ids in {st.key!r} (e.g. {_keys(dup.unique()[:3])}); "
            "keep one row per series"
        )
    keyed = table.set_index(st.key)
    missing = [k for k in wf.series_keys or [] if k not in keyed.index]
    if missing:
        raise DataError(
            f"{where} has no row for {len(missing)} series of the data (e.g. {missing[:3]}); add their rows "
            f"(column {st.key!r}) or drop those series"
        )
    keyed = keyed.reindex(wf.series_keys)
    vocab = {c: sorted(_keys(keyed[c].dropna().unique())) for c in st.categorical}
    codes = []
    for c in st.categorical:
        found = pd.Index(vocab[c]).get_indexer(keyed[c].astype(object).to_numpy())
        codes.append(np.where(keyed[c].isna().to_numpy(), 0, found + 2).tolist())
    st.state = {
        "numeric": [keyed[c].astype(np.float64).tolist() for c in st.numeric],
        "categorical": codes,
        "vocabulary": vocab,
    }


def _converted(data: Any, storage_options: dict | None) -> tuple[str, dict] | None:
    """``(root URL, manifest)`` of a spread-layout ``dask-windows convert`` output, else ``None``."""
    import fsspec

    from dask_windows.sources.manifest import read_manifest

    if not isinstance(data, (str, os.PathLike)):
        return None
    fs, root = fsspec.core.url_to_fs(str(data), **(storage_options or {}))
    root = root.rstrip("/")
    if not fs.isdir(root):
        return None
    manifest = read_manifest(root, fs)
    if manifest is None or manifest["version"] < 2:
        return None  # no overlap rows: every row is stored once
    return fs.unstrip_protocol(root), manifest


def _read_file(url: str, columns: list[str], storage_options: dict | None) -> Any:
    import fsspec
    import pyarrow.parquet as pq

    with fsspec.open(url, "rb", **(storage_options or {})) as src:
        return pq.read_table(src, columns=columns).to_pandas()


def _open(data: Any, columns: list[str], storage_options: dict | None, blocksize: Any) -> tuple[Any, list | None]:
    """A Dask DataFrame of ``columns``, and the files it reads (``None`` for in-memory data)."""
    import dask.dataframe as dd
    import pandas as pd

    if isinstance(data, pd.DataFrame):
        return dd.from_pandas(data[[c for c in columns if c in data.columns]], npartitions=1, sort=False), None
    if isinstance(data, dd.DataFrame):
        return data[[c for c in columns if c in data.columns]], None
    from dask_windows.workflow.artifact import list_files

    files = list_files(data, storage_options)
    frame = dd.read_parquet([f for f, _ in files], storage_options=storage_options, blocksize=blocksize)
    return frame[[c for c in columns if c in frame.columns]], files


def fit(
    wf: Workflow,
    data: Any,
    *,
    client: Any = None,
    scheduler: str | None = None,
    storage_options: dict | None = None,
    blocksize: Any = None,
    at: Any = None,
    time: str | None = None,
) -> Workflow:
    """Fit ``wf``'s statistics in one pass over ``data`` with Dask; returns ``wf``.

    Args:
        data: Parquet path(s), folder, glob or fsspec URL; a Dask or pandas DataFrame.
        client: A ``distributed.Client`` to compute on.
        scheduler: A scheduler address (``tcp://host:8786``), or ``"threads"`` / ``"sync"`` for
            Dask's local schedulers. Neither given: a ``LocalCluster``, closed after the fit.
        storage_options: fsspec options for ``data`` and a static table given by path.
        blocksize: Passed to ``dask.dataframe.read_parquet``.
        at: Fit on the rows whose ``time`` is before ``at`` (the train part of
            ``WindowDataset.split(at=at, time=time)``); the operations still see every row, the
            series ids, statistics and vocabularies count only those.
        time: The time column ``at`` is compared with (default: the workflow's ``time``).

    Raises:
        SchemaError: A column the workflow reads is not in the data.
    """
    import dask

    started = perf_counter()
    time = time or (wf.time if at is not None else None)
    if at is not None and time is None:
        raise ConfigError(f"fit(at={at!r}) needs time= (the time column), or a workflow made with time=")
    if time is not None and at is None:
        raise ConfigError(f"fit(time={time!r}) is the column that at= is compared with: pass at= too")
    extra = [c for c in dict.fromkeys([wf.time, time]) if c is not None and c not in wf.inputs]
    columns = [*wf.inputs, *extra]
    frame, files = _open(data, columns, storage_options, blocksize)
    what = data if isinstance(data, (str, os.PathLike)) else type(data).__name__
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise SchemaError(
            f"column {missing[0]!r}, read by the workflow, is not in {what}; columns: {list(frame.columns)}; "
            "check the spelling or the operations' columns"
        )
    wf.schema = {c: column_kind(frame.dtypes[c]) for c in wf.inputs}
    made: set[str] = set()
    for op in wf.ops:
        for col in op.inputs:
            if op.numeric and col not in made and wf.schema[col] not in ("number", "bool"):
                raise SchemaError(
                    f"{type(op).__name__} needs numbers but column {col!r} of {what} holds {frame.dtypes[col]} "
                    "values; encode it first (Categorify for categories, TimeFeatures for timestamps) or leave it out"
                )
        made.update(op.outputs())
    for op in wf.ops:
        if isinstance(op, TimeFeatures):
            dtype = frame.dtypes[op.columns[0]]
            if wf.schema.get(op.columns[0], "datetime") != "datetime":
                raise SchemaError(f"TimeFeatures column {op.columns[0]!r} of {what} is {dtype}, not a timestamp")
            op.state = {"stored_tz": str(getattr(dtype, "tz", None) or "") or None}
    train = None if at is None or time is None else (time, _bound(at, frame.dtypes[time], time))
    converted = _converted(data, storage_options)
    if converted is None:
        parts = frame.to_delayed()
        partials = [dask.delayed(_partial)(part, wf, None, k, train) for k, part in enumerate(parts)]
    else:  # one partition per file, its overlap rows (stored twice by the spread layout) counted once
        root, manifest = converted
        read = dask.delayed(_read_file)
        parts = [read(f"{root}/{e['path']}", columns, storage_options) for e in manifest["files"]]
        partials = [dask.delayed(_partial)(part, wf, e["runs"], 0, train) for part, e in zip(parts, manifest["files"])]
    merged, peaks = _compute(partials, wf, client, scheduler)
    _finish(wf, merged, what)
    _statics(wf, storage_options)
    from dask_windows.workflow.artifact import digest

    wf.fingerprint = None if files is None else {"files": len(files), "digest": digest(files)}
    seconds = perf_counter() - started
    peaks[os.getpid()] = _peak_rss()
    peak = sum(peaks.values())  # this process and the cluster's worker processes
    wf.fit_report = FitReport(len(parts), int(merged["rows"]), seconds, peak)  # type: ignore[attr-defined]
    log.info("fitted %s on %d partitions, %d rows in %.1f s", wf, len(parts), merged["rows"], seconds)
    return wf


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _pid_peak() -> tuple[int, int]:
    return os.getpid(), _peak_rss()


def _compute(partials: list, wf: Workflow, client: Any, scheduler: str | None) -> tuple[dict, dict]:
    """Each partition's partial computed on the cluster, merged here as they finish (progress logged);
    and the peak resident bytes of each process that computed them, by pid."""
    if scheduler in ("threads", "sync", "synchronous", "processes"):
        import dask

        return _merged((dask.compute(part, scheduler=scheduler)[0] for part in partials), len(partials), wf), {}
    from distributed import Client, LocalCluster, as_completed

    owned = []
    if client is None:
        if scheduler is not None:
            client = Client(scheduler)
        else:
            cluster = LocalCluster(n_workers=1, threads_per_worker=min(4, os.cpu_count() or 1), processes=False)
            owned.append(cluster)
            client = Client(cluster)
        owned.insert(0, client)
    try:
        futures = client.compute(partials)
        merged = _merged((future.result() for future in as_completed(futures)), len(partials), wf)
        return merged, dict(client.run(_pid_peak).values())
    finally:
        for thing in owned:
            thing.close()


def _merged(partials: Iterator[dict], total: int, wf: Workflow) -> dict:
    """The partials merged as they come (progress logged)."""
    merged: dict | None = None
    for k, got in enumerate(partials):
        merged = got if merged is None else _merge(merged, got, wf)
        log.info("fit: %d/%d partitions", k + 1, total)
    if merged is None:
        raise DataError(f"the data holds no partition to fit {wf!r} on")
    return merged
