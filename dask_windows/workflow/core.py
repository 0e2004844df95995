"""``Workflow``: a chain of column operations, the roles of their outputs, and static covariates; declared
once, fitted in one Dask pass (``fit``), saved as a small JSON artifact (``artifact``) and applied to each
decoded piece while the loader streams (``apply``). Its state is O(series + vocabulary).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError, DataError, SchemaError
from dask_windows.settings.spec import CODE_DTYPES
from dask_windows.workflow.ops import Log1p, Normalize, Op, Piece

__all__ = ["CACHE_BYTES", "Statics", "Workflow"]

#: ``Workflow(cache_bytes=)``'s default: the transformed rows kept across epochs, per process.
CACHE_BYTES = 512 << 20


def _columns(what: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    names = (value,) if isinstance(value, str) else tuple(value)
    if not all(isinstance(c, str) for c in names) or len(set(names)) != len(names):
        raise ConfigError(f"{what}={value!r} must be distinct column names")
    return names


class Statics:
    """Static covariates: one row per series in a separate table, keyed by series id.

    Args:
        table: A pandas DataFrame, or a Parquet/CSV path or URL (read with fsspec at fit).
        key: The table's series id column (default: the workflow's series column name).
        numeric: Numeric columns, given as they are (float32).
        categorical: Columns encoded as codes of a vocabulary fitted on the table (0 null, 1 unseen, 2..).
    """

    def __init__(self, table: Any, key: str | None = None, numeric: Any = (), categorical: Any = ()) -> None:
        self.table, self.key = table, key
        self.numeric, self.categorical = _columns("numeric", numeric), _columns("categorical", categorical)
        if not self.numeric and not self.categorical:
            raise ConfigError("Statics needs numeric= or categorical= columns")
        self.state: dict | None = None

    def config(self) -> dict:
        return {"key": self.key, "numeric": list(self.numeric), "categorical": list(self.categorical)}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "table": None}  # fitted: the state holds what is needed


class Workflow:
    """Column operations fitted over a whole dataset and applied to each piece the loader decodes.

    Args:
        ops: The operations, applied in order to a piece's columns.
        series: The series id column (per-series statistics, lags, static covariates).
        continuous: Output columns stacked as continuous inputs (``x``'s channels, ``past_cont``).
        categorical: Output columns of int codes (``past_cat``); usually ``Categorify`` outputs.
        target: Columns predicted (``y``; ``target`` in the named batch).
        known: Columns of ``continuous`` / ``categorical`` known over the horizon (``future_*``).
        statics: Static covariates per series (``Statics``), or ``None``.
        time: The time column: the fit counts the time steps missing inside each series (and
            duplicate or decreasing ones) and refuses them, as PyTorch Forecasting does by default.
        freq: The step of ``time``: a pandas frequency (``"h"``, ``"D"``, ``"W-SAT"``, ``"MS"``) for
            timestamps, a number for a numeric time index (default 1, PyTorch Forecasting's
            ``time_idx``); ``None`` with timestamps: the smallest step in the data.
        missing_timesteps: ``"raise"`` (default), or ``"allow"``: window over the gaps as they are.
            To fill them instead, write the data with ``fill_timesteps`` first.
        cache_bytes: Memory per process for the transformed rows kept across epochs
            (``cache.TransformCache``), on top of ``buffer_bytes``. Default 512 MiB (``CACHE_BYTES``);
            0: off. A loader setting, not saved with the workflow (``wf.cache_bytes = ...``).
        cache_dir: A local folder for the transformed rows past ``cache_bytes`` (the disk tier);
            ``None`` (default): none. A loader setting like ``cache_bytes``.
        cache_disk_bytes: Most bytes of files in ``cache_dir`` per rank; ``None`` (default): half
            the space free there at open, never leaving less than ``cache.KEEP_FREE`` free.
    """

    def __init__(
        self,
        ops: Sequence[Op],
        *,
        series: str | None = None,
        continuous: Any = (),
        categorical: Any = (),
        target: Any = (),
        known: Any = (),
        statics: Statics | None = None,
        time: str | None = None,
        freq: Any = None,
        missing_timesteps: str = "raise",
        cache_bytes: int = CACHE_BYTES,
        cache_dir: str | os.PathLike | None = None,
        cache_disk_bytes: int | None = None,
    ) -> None:
        self.ops = list(ops)
        bad = [op for op in self.ops if not isinstance(op, Op)]
        if bad:
            raise ConfigError(f"Workflow ops must be operations of dask_windows.workflow, got {bad[0]!r}")
        self.series = series
        self.continuous = _columns("continuous", continuous)
        self.categorical = _columns("categorical", categorical)
        self.target = _columns("target", target)
        self.known = _columns("known", known)
        self.statics = statics
        if time is not None and not isinstance(time, str):
            raise ConfigError(f"time={time!r} must be a column name")
        if missing_timesteps not in ("raise", "allow"):
            raise ConfigError(f"missing_timesteps={missing_timesteps!r} must be 'raise' or 'allow'")
        if freq is not None and (isinstance(freq, bool) or not isinstance(freq, (str, int, float))):
            raise ConfigError(f"freq={freq!r} must be a pandas frequency string ('h', 'W-SAT') or a number")
        if freq is not None and time is None:
            raise ConfigError(f"freq={freq!r} is the step of the time column: pass time= too")
        self.time, self.freq, self.missing_timesteps = time, freq, missing_timesteps
        self.cache_bytes, self.cache_dir, self.cache_disk_bytes = cache_bytes, cache_dir, cache_disk_bytes
        self.timesteps: dict | None = None  # fitted: the step, and the steps missing ("allow") or backwards
        both = set(self.continuous) & set(self.categorical)
        if both:
            raise ConfigError(f"columns {sorted(both)} are both continuous and categorical; pick one role")
        stray = [c for c in self.known if c not in self.continuous + self.categorical]
        if stray:
            raise ConfigError(f"known={stray} must also be continuous or categorical inputs")
        if not (self.continuous or self.categorical or self.target):
            raise ConfigError("Workflow needs continuous=, categorical= or target= columns to yield")
        needs_series = [op for op in self.ops if op.per_series] + ([statics] if statics is not None else [])
        if needs_series and series is None:
            raise ConfigError(f"{needs_series[0]!r} works per series: pass Workflow(series='your id column')")
        if statics is not None and statics.key is None:
            statics.key = series
        self.series_keys: list | None = None  # fitted: every series id seen, sorted
        self.schema: dict[str, str] | None = None  # fitted: kind of each input column
        self.fingerprint: dict | None = None  # fitted: the files fitted on
        self._series_index: Any = None

    #: Fits of this object so far: a dataset built on it refuses to go on once it is refitted (``batch.Emitter``).
    _fits = 0

    @property
    def cache_bytes(self) -> int:
        """Bytes per process of transformed rows kept across epochs (the constructor's ``cache_bytes``)."""
        return self.__dict__.get("_cache_bytes", CACHE_BYTES)

    @cache_bytes.setter
    def cache_bytes(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"cache_bytes={value!r} must be a number of bytes >= 0 (0: keep nothing)")
        self._cache_bytes = value

    @property
    def cache_dir(self) -> str | None:
        """The local folder of transformed rows kept on disk across epochs (the constructor's ``cache_dir``)."""
        return self.__dict__.get("_cache_dir")

    @cache_dir.setter
    def cache_dir(self, value: str | os.PathLike | None) -> None:
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise ConfigError(f"cache_dir={value!r} must be a local folder's path, or None for no disk cache")
        path = None if value is None else os.fspath(value)
        if isinstance(path, str) and "://" in path:
            raise ConfigError(f"cache_dir={value!r} must be a local folder (the rows are written there); "
                              "pass a path on this machine's disk")  # fmt: skip
        self._cache_dir = path

    @property
    def cache_disk_bytes(self) -> int | None:
        """Most bytes of files in ``cache_dir`` per rank (``None``: half the space free there at open)."""
        return self.__dict__.get("_cache_disk_bytes")

    @cache_disk_bytes.setter
    def cache_disk_bytes(self, value: int | None) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ConfigError(f"cache_disk_bytes={value!r} must be a number of bytes >= 0, or None "
                              "(half the space free in cache_dir)")  # fmt: skip
        self._cache_disk_bytes = value

    # -- structure --------------------------------------------------------------------------------

    def produced(self) -> dict[str, int]:
        """Each column the operations write, with the rows before a row its value depends on."""
        depth: dict[str, int] = {}
        for op in self.ops:
            before = dict(depth)  # an in-place output must not count this operation's own look-back twice
            for out in op.outputs():
                depth[out] = max([before.get(c, 0) for c in op.depends(out)], default=0) + op.lookback(out)
        return depth

    @property
    def inputs(self) -> list[str]:
        """Columns of the data the workflow reads (not made by an operation), the series column last."""
        made: set[str] = set()
        needed: list[str] = []
        for op in self.ops:
            needed += [c for c in op.inputs if c not in made and c not in needed]
            made.update(op.outputs())
        for col in self.continuous + self.categorical + self.target:
            if col not in made and col not in needed:
                needed.append(col)
        if self.series is not None and self.series not in needed:
            needed.append(self.series)
        return needed

    @property
    def outputs(self) -> list[str]:
        """Every column the loader may yield, in role order."""
        return list(dict.fromkeys(self.continuous + self.categorical + self.target))

    def lookback(self, columns: Sequence[str] | None = None) -> int:
        """Rows read before each window so the values of ``columns`` (default: the outputs) are exact."""
        depth = self.produced()
        return max([depth.get(c, 0) for c in (columns or self.outputs)], default=0)

    @property
    def fitted(self) -> bool:
        return self.series_keys is not None

    def normalizer(self, column: str) -> Normalize | None:
        """The last ``Normalize`` writing ``column`` (its statistics invert the target), or ``None``."""
        found = None
        for op in self.ops:
            if isinstance(op, Normalize) and column in op.columns:
                found = op
            elif column in op.outputs():
                found = None if not isinstance(op, Normalize) else found
        return found

    def target_chain(self, column: str) -> list[Op]:
        """The operations that write ``column`` in place, in order (what ``invert_target`` undoes)."""
        return [op for op in self.ops if column in op.columns and column in op.outputs()]

    def target_transforms(self, column: str) -> list[Op]:
        """The transformations of ``column`` (``Log1p``, ``Transform``) before its scale, in order: what a
        model's output goes back through after ``target_loc`` / ``target_scale`` (PyTorch Forecasting's
        ``transformation=`` when there is one)."""
        from dask_windows.workflow.transforms import Transform

        return [op for op in self.target_chain(column) if isinstance(op, (Transform, Log1p))]

    def invert_target(self, prediction: Any, batch: dict) -> Any:
        """``prediction`` (shaped like ``batch["target"]``, numpy or torch) back in the target's units: the
        scale undone (``target_loc``, ``target_scale``), then every transformation of each target, last first.

        Raises:
            ConfigError: An operation on a target that cannot be undone (a ``Function`` writing it, or a
                ``Normalize`` before a transformation: put the transformation first).
        """
        loc, scale = batch["target_loc"], batch["target_scale"]
        if isinstance(prediction, np.ndarray):
            loc, scale = np.asarray(loc), np.asarray(scale)
        if prediction.ndim == 3:
            loc, scale = loc[..., None], scale[..., None]
        out = prediction * scale + loc
        for j, column in enumerate(self.target):
            last = self.normalizer(column)  # the scale the batch carries: the last operation writing it
            values = out[:, j]
            for op in reversed(self.target_chain(column)):
                if op is last:
                    continue
                values = op.invert(values, column)
                if values is NotImplemented:
                    raise ConfigError(
                        f"invert_target cannot undo {op!r} of the target {column!r}: only the last Normalize "
                        "(the batch's target_loc / target_scale), transformations (Log1p, Transform), fills and "
                        "clips are undone; apply transformations before the Normalize"
                    )
            out[:, j] = values
        return out

    def cardinality(self, column: str) -> int:
        """Codes a categorical output (or categorical static) takes: vocabulary + null + unseen."""
        from dask_windows.workflow.ops import Categorify

        for op in reversed(self.ops):
            if isinstance(op, Categorify) and column in op.columns:
                return op.cardinality(column)
        if self.statics is not None and self.statics.state and column in self.statics.categorical:
            return len(self.statics.state["vocabulary"][column]) + 2
        raise ConfigError(f"{column!r} is not a Categorify output or a categorical static of this workflow")

    # -- applying -----------------------------------------------------------------------------

    def series_codes(self, keys: np.ndarray) -> np.ndarray:
        """Codes of series ids (positions in ``series_keys``); ``-1`` for an id the fit did not see."""
        import pandas as pd

        if self.series_keys is None:
            raise ConfigError("the workflow is not fitted; call Workflow.fit(...) or Workflow.load(url)")
        if self._series_index is None:
            self._series_index = pd.Index(self.series_keys)
        return np.asarray(self._series_index.get_indexer(np.asarray(keys)), np.int64)

    def transform(self, columns: dict, lookback: int = 0) -> dict:
        """The operations applied to one piece's columns (1-D arrays of equal length); a new dict.

        ``lookback``: the rows read before each window (``apply``): NaN in the first ``lookback``
        rows of each run of the piece (lags reaching before it) become 0; no window yields them.
        Adds ``__series_code__`` (positions in ``series_keys``, ``-1`` unseen).
        """
        cols = dict(columns)
        n = len(next(iter(cols.values()))) if cols else 0
        series = cols.get(self.series) if self.series is not None else None
        piece = Piece(n, series, self.series_codes if self.fitted else None)
        for op in self.ops:
            missing = [c for c in op.inputs if c not in cols]
            if missing:
                raise SchemaError(f"{op!r} reads column {missing[0]!r}, which the data does not hold (and no earlier "
                                  f"operation writes); columns: {sorted(cols)}")  # fmt: skip
            op.apply(cols, piece)
        if self.statics is not None and self.fitted and (piece.run_codes < 0).any():
            key = piece.keys[int(np.flatnonzero(piece.run_codes < 0)[0])]
            raise DataError(
                f"series {key!r} has no static covariates: the workflow was not fitted on it; refit the workflow "
                "on data holding it (with its row in the static table)"
            )
        if lookback:
            head = np.arange(n) - piece.run_first_row() < lookback  # (rows,) rows no window yields
            for col, values in list(cols.items()):
                if values.dtype.kind == "f" and head.any():
                    hit = head & np.isnan(values)
                    if hit.any():
                        values = values.copy()
                        values[hit] = 0.0
                        cols[col] = values
        cols["__series_code__"] = piece.per_row(piece.run_codes).astype(np.float32)
        return cols

    def transform_frame(self, frame: Any) -> Any:
        """A pandas DataFrame transformed as the loader does it (one series after another, in row order)."""
        import pandas as pd

        from dask_windows.workflow.artifact import check_zones

        zones = {c: str(d.tz) if isinstance(d, pd.DatetimeTZDtype) else None
                 for c, d in frame.dtypes.items() if d.kind == "M" or isinstance(d, pd.DatetimeTZDtype)}  # fmt: skip
        check_zones(self, zones, "the frame")  # a naive column where the fit saw a zoned one would shift
        cols = {c: frame[c].to_numpy() for c in frame.columns}
        out = self.transform(cols)
        return pd.DataFrame({c: out[c] for c in out if c != "__series_code__"}, index=frame.index)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_series_index": None}

    # -- fitting and saving --------------------------------------------------------------------

    def fit(self, data: Any, **kwargs: Any) -> Workflow:
        """Fit the statistics in one Dask pass over ``data`` (see ``workflow.fit.fit``); returns ``self``.

        ``fit(data, at="2024-06-01", time="timestamp")`` fits on the training period only: the rows
        of ``WindowDataset.split(at=..., time=...)``'s train part."""
        from dask_windows.workflow.fit import fit

        self._fits += 1  # (first: a fit that fails half-way has changed the statistics too)
        return fit(self, data, **kwargs)

    def save(self, url: str, storage_options: dict | None = None) -> None:
        """Write the fitted workflow as JSON to a local path or fsspec URL (see ``artifact``)."""
        from dask_windows.workflow.artifact import save

        save(self, url, storage_options)

    @staticmethod
    def load(url: str, storage_options: dict | None = None) -> Workflow:
        """A fitted workflow read back from ``save``'s JSON."""
        from dask_windows.workflow.artifact import load

        return load(url, storage_options)

    def named(
        self, index: bool = False, series_id: bool = True, scale_target: bool = True, code_dtype: str = "int64"
    ) -> Any:
        """This workflow for ``WindowDataset(workflow=...)`` yielding named batches (``batch.NamedBatches``).

        Args:
            index: Add each window's global start row (``"index"``).
            series_id: Add each window's series code (``"series"``, positions in ``series_keys``).
            scale_target: Yield the target as the workflow scaled it (with ``target_loc`` /
                ``target_scale`` to invert); ``False``: in its units, before the ``Normalize``.
            code_dtype: The categorical fields' dtype: ``"int64"`` (PyTorch's index dtype), ``"int32"``,
                or ``"narrow"``: the narrowest integer holding every code (``apply.narrow_dtype``), not
                widened on the host (``widen_codes`` where they are used). See docs/workflows.md.
        """
        from dask_windows.workflow.batch import NamedBatches

        if code_dtype not in (*CODE_DTYPES, "narrow"):
            raise ConfigError(f"named(code_dtype={code_dtype!r}) must be 'int64', 'int32' or 'narrow'")
        return NamedBatches(self, index=index, series_id=series_id, scale_target=scale_target, code_dtype=code_dtype)

    def __repr__(self) -> str:
        state = f"fitted on {len(self.series_keys or [])} series" if self.fitted else "not fitted"
        return f"Workflow({len(self.ops)} ops, series={self.series!r}, outputs={self.outputs}, {state})"
