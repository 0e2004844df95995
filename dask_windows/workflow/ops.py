"""Column operations of a workflow, each applied to the decoded columns of one piece: per row or per series
run, a few numpy calls per column, never one per window. Operations that look at earlier rows declare their
``lookback`` (rows read before every window: ``apply``); fitted ones (``Normalize``, ``Categorify``) keep
JSON-ready statistics learned by ``fit``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from dask_windows.errors import ConfigError, SchemaError

__all__ = [
    "Categorify",
    "Clip",
    "Difference",
    "FillMissing",
    "Function",
    "Lag",
    "Log1p",
    "Normalize",
    "Op",
    "Piece",
    "TimeFeatures",
    "op_from_json",
]

CALENDAR_PERIODS = {  # field -> (first value, period) for the sine/cosine encoding
    "month": (1, 12),
    "day": (1, 31),
    "dayofweek": (0, 7),
    "dayofyear": (1, 366),
    "hour": (0, 24),
    "minute": (0, 60),
    "quarter": (1, 4),
    "weekofyear": (1, 53),
    "year": (0, 0),
}
NULL_CODE, UNSEEN_CODE = 0, 1  # categorical codes; the vocabulary starts at 2


class Piece:
    """The series runs of one piece of ``num_rows`` rows (``series``: its ``(rows,)`` series column, ``None``:
    one series), what per-series operations need; ``codes`` maps run keys to series codes (``-1``: unseen)."""

    def __init__(self, num_rows: int, series: np.ndarray | None, codes: Callable | None = None) -> None:
        from dask_windows.planning.windows import find_runs

        self.num_rows = num_rows
        if series is None or num_rows == 0:
            self.starts = np.zeros(1 if num_rows else 0, np.int64)
            self.lengths = np.array([num_rows] if num_rows else [], np.int64)
            self.keys = np.array([None] * len(self.starts), dtype=object)
        else:
            self.starts, self.lengths = find_runs(series)
            self.keys = np.asarray(series)[self.starts]
        self.run_codes = codes(self.keys) if codes is not None else np.full(len(self.starts), -1, np.int64)
        self._first: np.ndarray | None = None

    def run_first_row(self) -> np.ndarray:
        """``(rows,)`` the piece row where each row's run begins."""
        if self._first is None:
            self._first = np.repeat(self.starts, self.lengths)
        return self._first

    def per_row(self, per_run: np.ndarray) -> np.ndarray:
        """``(rows,)`` a per-run value repeated over each run's rows."""
        return np.repeat(per_run, self.lengths)

    def shifted(self, values: np.ndarray, k: int) -> np.ndarray:
        """``values`` ``k`` rows earlier in the same run (NaN where that row is before the run), float64."""
        out = np.full(len(values), np.nan)
        if k < len(values):
            out[k:] = values[: len(values) - k]
        out[np.arange(len(values)) - k < self.run_first_row()] = np.nan
        return out


def _names(what: str, value: Any) -> tuple[str, ...]:
    names = (value,) if isinstance(value, str) else tuple(value)
    if not names or not all(isinstance(c, str) for c in names):
        raise ConfigError(f"{what}={value!r} must be a column name or a non-empty list of them")
    return names


def _float(cols: dict, col: str, op: str) -> np.ndarray:
    values = cols[col]
    if values.dtype.kind not in "fiub":
        raise SchemaError(
            f"{op} needs a numeric column but {col!r} is {values.dtype}; encode it first "
            f"(Categorify for categories, TimeFeatures for timestamps) or leave it out of {op}"
        )
    return values.astype(np.float64, copy=False)


class Op:
    """Base of the operations: inputs, outputs, lookback, JSON form and ``apply``."""

    kind: ClassVar[str] = ""
    fitted: ClassVar[bool] = False
    numeric: ClassVar[bool] = True  # reads numbers only
    per_series: bool = False
    #: Constructor arguments besides the columns, kept as attributes of the same name (``config``).
    arguments: ClassVar[tuple[str, ...]] = ()
    #: One input column, given as ``column=`` (``Lag``, ``Difference``, ``TimeFeatures``).
    one_column: ClassVar[bool] = False

    def __init__(self, columns: Any) -> None:
        self.columns = _names(f"{type(self).__name__} columns", columns)
        self.state: dict | None = None

    @property
    def inputs(self) -> tuple[str, ...]:
        """Columns read."""
        return self.columns

    def outputs(self) -> list[str]:
        """Columns written (an input written in place counts)."""
        return list(self.columns)

    def lookback(self, output: str | None = None) -> int:
        """Rows before a row that its output (default: any output) depends on, within its series."""
        return 0

    def depends(self, output: str) -> list[str]:
        """Inputs an output is computed from (in place: itself; else all inputs)."""
        if output in self.columns:
            return [output]
        if output.endswith("_observed") and output[: -len("_observed")] in self.columns:
            return [output[: -len("_observed")]]
        return list(self.columns)

    def config(self) -> dict:
        """Constructor arguments, JSON-ready."""
        head = {"column": self.columns[0]} if self.one_column else {"columns": list(self.columns)}
        return {**head, **{name: getattr(self, name) for name in self.arguments}}

    def apply(self, cols: dict, piece: Piece) -> None:
        """Write this operation's outputs into ``cols`` (a piece's columns)."""
        raise NotImplementedError

    def invert(self, values: Any, column: str) -> Any:
        """``values`` of the in-place output ``column`` (a prediction: numpy or torch) taken back through
        this operation, or ``NotImplemented`` where it cannot be undone (``Workflow.invert_target``)."""
        return NotImplemented

    def _fitted(self) -> dict:
        if self.state is None:
            raise ConfigError(f"{self!r} is not fitted; call Workflow.fit first")
        return self.state

    def check_state(self, num_series: int) -> None:
        """Raise ``ValueError`` naming what is wrong when ``state`` is not what a fit writes (a loaded file)."""
        if self.fitted and not (isinstance(self.state, dict) and set(self.state) == set(self.columns)):
            raise ValueError(f"{self!r} has no fitted state for each of its columns")

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({args})"


class FillMissing(Op):
    """Fill NaN: forward within a series (at most ``limit`` rows), then a constant; optionally an observed mask.

    Args:
        columns: Columns to fill (in place).
        value: Constant for the NaN left after the forward fill; ``None`` keeps them.
        method: ``None`` or ``"ffill"``: carry the last observed value of the series forward.
        limit: Most consecutive rows a forward fill covers (required with ``"ffill"``: it is the
            rows read before each window, so the fill is exact inside it).
        mask: Also write ``{column}_observed``: 1.0 where the value was observed, 0.0 where missing.
    """

    kind = "fill"
    arguments = ("value", "method", "limit", "mask")

    def __init__(
        self, columns: Any, value: float | None = None, method: str | None = None, limit: int | None = None,
        mask: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(columns)
        if method not in (None, "ffill"):
            raise ConfigError(f"FillMissing(method={method!r}) must be None or 'ffill'")
        if method == "ffill" and (not isinstance(limit, int) or limit < 1):
            raise ConfigError(
                f"FillMissing(method='ffill', limit={limit!r}): give limit= as an int >= 1, the most rows a value is "
                "carried forward; the loader reads that many rows before each window, so the fill is exact"
            )
        if method is None and value is None and not mask:
            raise ConfigError("FillMissing does nothing: give value=, method='ffill' or mask=True")
        self.value, self.method, self.limit, self.mask = value, method, limit, mask
        self.per_series = method == "ffill"

    def outputs(self) -> list[str]:
        return list(self.columns) + ([f"{c}_observed" for c in self.columns] if self.mask else [])

    def lookback(self, output: str | None = None) -> int:
        if output is not None and output not in self.columns:
            return 0  # the observed mask looks at its own row only
        return (self.limit or 0) if self.method else 0

    def invert(self, values: Any, column: str) -> Any:
        return values  # a prediction has no missing value to unfill

    def apply(self, cols: dict, piece: Piece) -> None:
        for col in self.columns:
            values = _float(cols, col, "FillMissing")
            missing = np.isnan(values)
            if self.mask:
                cols[f"{col}_observed"] = (~missing).astype(np.float32)
            if not missing.any():
                cols[col] = values
                continue
            values = values.copy()
            if self.method == "ffill":
                rows = np.arange(len(values))
                last = np.maximum.accumulate(np.where(missing, -1, rows))  # (rows,) last observed row so far
                ok = missing & (last >= piece.run_first_row()) & (rows - last <= (self.limit or 0))
                values[ok] = values[last[ok]]
            if self.value is not None:
                values[np.isnan(values)] = self.value
            cols[col] = values


class Log1p(Op):
    """``log(1 + x)`` in place (``Transform(columns, "log1p")``); ``invert_target`` undoes it (``expm1``)."""

    kind = "log1p"
    name: str = "log1p"  # as ``Transform.name`` (PyTorch Forecasting's ``transformation``)
    lmbda: float | None = None

    def apply(self, cols: dict, piece: Piece) -> None:
        for col in self.columns:
            with np.errstate(invalid="ignore", divide="ignore"):
                cols[col] = np.log1p(_float(cols, col, "Log1p"))

    def invert(self, values: Any, column: str) -> Any:
        return values.expm1() if hasattr(values, "expm1") else np.expm1(values)


class Clip(Op):
    """Values limited to ``[lower, upper]`` in place (``None``: no bound on that side)."""

    kind = "clip"
    arguments = ("lower", "upper")

    def __init__(self, columns: Any, lower: float | None = None, upper: float | None = None) -> None:
        super().__init__(columns)
        if lower is None and upper is None:
            raise ConfigError("Clip needs lower= or upper=")
        self.lower, self.upper = lower, upper

    def invert(self, values: Any, column: str) -> Any:
        return values  # inside the bounds clipping is the identity; a value clipped is not recovered

    def apply(self, cols: dict, piece: Piece) -> None:
        for col in self.columns:
            cols[col] = np.clip(_float(cols, col, "Clip"), self.lower, self.upper)


class Normalize(Op):
    """``(x - loc) / scale`` in place, with statistics fitted globally or per series.

    Args:
        columns: Columns to normalise.
        per_series: Statistics per series (looked up by series id), else over all rows.
        method: ``"standard"``: mean and standard deviation (``ddof=1``); ``"robust"``: median
            and interquartile range (linear quantiles). A scale that is 0 or undefined is 1.
        unseen: A series the fit did not see: ``"global"`` statistics, or ``"raise"``.
    """

    kind = "normalize"
    fitted = True
    arguments = ("per_series", "method", "unseen")

    def __init__(
        self, columns: Any, per_series: bool = False, method: str = "standard", unseen: str = "global"
    ) -> None:
        super().__init__(columns)
        if method not in ("standard", "robust"):
            raise ConfigError(f"Normalize(method={method!r}) must be 'standard' or 'robust'")
        if unseen not in ("global", "raise"):
            raise ConfigError(f"Normalize(unseen={unseen!r}) must be 'global' or 'raise'")
        self.per_series, self.method, self.unseen = bool(per_series), method, unseen

    def loc_scale(self, col: str, codes: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """``loc`` and ``scale`` of ``col`` for series ``codes`` (``-1``: unseen), or global (``None``)."""
        stats = self._fitted()[col]
        glob = np.array(stats["global"], np.float64)
        if codes is None or not self.per_series:
            n = 1 if codes is None else len(codes)
            return np.full(n, glob[0]), np.full(n, glob[1])
        table = np.asarray(stats["series"], np.float64).reshape(-1, 2)  # (series, 2) loc, scale
        unseen = codes < 0
        if unseen.any() and self.unseen == "raise":
            raise SchemaError(
                f"Normalize of {col!r} per series: a series the workflow was not fitted on appears; refit on data "
                "holding it, or pass unseen='global' to use the global statistics for it"
            )
        picked = table[np.maximum(codes, 0)]
        picked[unseen] = glob
        return picked[:, 0], picked[:, 1]

    def check_state(self, num_series: int) -> None:
        super().check_state(num_series)
        for col, stats in (self.state or {}).items():
            rows = [stats["global"]] + (list(stats["series"]) if self.per_series else [])
            if self.per_series and len(rows) != num_series + 1:
                raise ValueError(f"{self!r} has statistics of {col!r} for {len(rows) - 1} series, not {num_series}")
            for loc, scale in rows:
                if not (np.isfinite(scale) and scale > 0) or np.isinf(loc):
                    raise ValueError(f"{self!r} has a location {loc!r} or scale {scale!r} of {col!r} a fit never gives")

    def apply(self, cols: dict, piece: Piece) -> None:
        for col in self.columns:
            values = _float(cols, col, "Normalize")
            loc, scale = self.loc_scale(col, piece.run_codes if self.per_series else None)
            if self.per_series:
                loc, scale = piece.per_row(loc), piece.per_row(scale)
            cols[col] = (values - loc) / scale


class Categorify(Op):
    """Values mapped to int codes of a fitted vocabulary, in place.

    Codes: 0 for null, 1 for a value not in the vocabulary (unseen, or rarer than
    ``min_frequency`` in the fit), then 2, 3, ... for the vocabulary in sorted order (stable:
    the same data give the same codes whatever its partitioning).
    """

    kind = "categorify"
    numeric = False
    fitted = True
    arguments = ("min_frequency",)

    def __init__(self, columns: Any, min_frequency: int = 1) -> None:
        super().__init__(columns)
        if not isinstance(min_frequency, int) or min_frequency < 1:
            raise ConfigError(f"Categorify(min_frequency={min_frequency!r}) must be an int >= 1")
        self.min_frequency = min_frequency
        self._index: dict = {}

    def vocabulary(self, col: str) -> list:
        """The fitted values of ``col``, in code order from 2."""
        return list(self._fitted()[col])

    def cardinality(self, col: str) -> int:
        """Codes ``col`` takes: the vocabulary plus null and unseen (an embedding's size)."""
        return len(self.vocabulary(col)) + 2

    def check_state(self, num_series: int) -> None:
        super().check_state(num_series)
        for col, vocabulary in (self.state or {}).items():
            if not isinstance(vocabulary, list) or len(set(map(repr, vocabulary))) != len(vocabulary):
                raise ValueError(f"{self!r} has a vocabulary of {col!r} that is not a list of distinct values")

    def apply(self, cols: dict, piece: Piece) -> None:
        import pandas as pd

        for col in self.columns:
            index = self._index.get(col)
            if index is None:
                index = self._index[col] = pd.Index(self.vocabulary(col), dtype=object)
            values = cols[col]
            if not isinstance(values, np.ndarray) and hasattr(values, "unify_dictionaries"):
                cols[col] = _dictionary_codes(values, index)  # read as an Arrow dictionary (ParquetSource)
                continue
            # Hash the piece's values once, then look up only its distinct values (a null factorizes to -1).
            rows, distinct = pd.factorize(values, use_na_sentinel=True)
            cols[col] = _code_table(index, distinct)[rows]  # (rows,) -1 (null) picks the last entry

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_index": {}}


def _code_table(index: Any, distinct: Any) -> np.ndarray:
    """``(len(distinct) + 1,)`` float32 code of each distinct value (``index``: the vocabulary), null last."""
    import pandas as pd

    values = np.asarray(distinct, dtype=object)
    found = index.get_indexer(values)
    codes = np.where(found >= 0, found + 2, UNSEEN_CODE)
    codes[pd.isna(values)] = NULL_CODE  # (a null among a dictionary's values)
    return np.append(codes, NULL_CODE).astype(np.float32)


def _dictionary_codes(column: Any, index: Any) -> np.ndarray:
    """``(rows,)`` float32 codes of an Arrow dictionary column: its few distinct values looked up, then its
    indices mapped through them (no Python string per row)."""
    import pyarrow as pa

    chunks = column.unify_dictionaries().chunks  # one dictionary for every chunk
    if not chunks:
        return np.zeros(0, np.float32)
    dictionary = chunks[0].dictionary
    table = _code_table(index, dictionary.to_numpy(zero_copy_only=False))
    indices = pa.chunked_array([c.indices for c in chunks])
    if indices.null_count:
        import pyarrow.compute as pc

        indices = pc.fill_null(indices, len(dictionary))  # a null row picks the last entry (NULL_CODE)
    return table[np.asarray(indices.to_numpy())]


class Lag(Op):
    """``{column}_lag{k}``: the value ``k`` rows earlier in the same series, for each ``k`` of ``lags``."""

    kind = "lag"
    per_series = True
    one_column = True
    arguments = ("lags",)

    def __init__(self, column: str, lags: Sequence[int]) -> None:
        super().__init__(column)
        lags = [lags] if isinstance(lags, int) else list(lags)
        if not lags or not all(isinstance(k, int) and k >= 1 for k in lags):
            raise ConfigError(f"Lag(lags={lags!r}) must be ints >= 1")
        self.lags = lags

    def outputs(self) -> list[str]:
        return [f"{self.columns[0]}_lag{k}" for k in self.lags]

    def lookback(self, output: str | None = None) -> int:
        return max(self.lags) if output is None else self.lags[self.outputs().index(output)]

    def apply(self, cols: dict, piece: Piece) -> None:
        values = _float(cols, self.columns[0], "Lag")
        for k, name in zip(self.lags, self.outputs()):
            cols[name] = piece.shifted(values, k)


class Difference(Op):
    """``{column}_diff{k}``: the value minus the value ``k`` rows earlier in the same series."""

    kind = "diff"
    per_series = True
    one_column = True
    arguments = ("periods",)

    def __init__(self, column: str, periods: int = 1) -> None:
        super().__init__(column)
        if not isinstance(periods, int) or periods < 1:
            raise ConfigError(f"Difference(periods={periods!r}) must be an int >= 1")
        self.periods = periods

    def outputs(self) -> list[str]:
        return [f"{self.columns[0]}_diff{self.periods}"]

    def lookback(self, output: str | None = None) -> int:
        return self.periods

    def apply(self, cols: dict, piece: Piece) -> None:
        values = _float(cols, self.columns[0], "Difference")
        cols[self.outputs()[0]] = values - piece.shifted(values, self.periods)


class TimeFeatures(Op):
    """Calendar fields of a timestamp column: ``{column}_{field}``, or ``_sin`` / ``_cos`` of them.

    Args:
        column: The timestamp column.
        fields: Of ``month, day, dayofweek, dayofyear, hour, minute, quarter, weekofyear, year``.
        cyclic: Write ``sin`` and ``cos`` of ``2 pi (value - first) / period`` instead of the value
            (not for ``year``).
        tz: Time zone the fields are taken in. A column stored with a time zone is converted to it
            (default: the column's own zone, recorded by the fit); naive timestamps are taken as they are.
    """

    kind = "time"
    numeric = False
    one_column = True
    arguments = ("fields", "cyclic", "tz")

    def __init__(self, column: str, fields: Sequence[str], cyclic: bool = False, tz: str | None = None) -> None:
        super().__init__(column)
        fields = [fields] if isinstance(fields, str) else list(fields)
        bad = [f for f in fields if f not in CALENDAR_PERIODS]
        if not fields or bad:
            raise ConfigError(f"TimeFeatures fields {bad or fields!r}: use some of {sorted(CALENDAR_PERIODS)}")
        if cyclic and "year" in fields:
            raise ConfigError("TimeFeatures(cyclic=True) cannot encode 'year' (it has no period); leave it out")
        self.fields, self.cyclic, self.tz = fields, bool(cyclic), tz

    def outputs(self) -> list[str]:
        c = self.columns[0]
        if self.cyclic:
            return [f"{c}_{f}_{w}" for f in self.fields for w in ("sin", "cos")]
        return [f"{c}_{f}" for f in self.fields]

    def apply(self, cols: dict, piece: Piece) -> None:
        import pandas as pd

        col = self.columns[0]
        values = cols[col]
        stored_tz = (self.state or {}).get("stored_tz")
        if values.dtype.kind not in "MO":
            raise SchemaError(f"TimeFeatures needs a timestamp column but {col!r} is {values.dtype}; parse it first")
        stamps = pd.DatetimeIndex(values)
        if stamps.tz is not None and self.state is not None and not stored_tz and not self.tz:
            raise SchemaError(
                f"TimeFeatures column {col!r} holds timestamps with time zone {str(stamps.tz)!r}, but the workflow "
                f"was fitted on it naive (no time zone): its calendar fields would shift; drop the zone as the fit "
                f"saw it (pandas: .dt.tz_localize(None) on wall times), pass TimeFeatures(tz=...), or refit"
            )
        if stamps.tz is None and stored_tz:  # Arrow gives zoned timestamps as UTC instants
            stamps = stamps.tz_localize("UTC")
        zone = self.tz or stored_tz
        if zone and stamps.tz is not None:
            stamps = stamps.tz_convert(zone)
        if stamps.tz is not None:
            stamps = stamps.tz_localize(None)  # wall time in the zone
        fields = _calendar(stamps.values.astype("datetime64[s]").astype(np.int64), self.fields, np.float64)
        for field in self.fields:
            value = fields[field]
            if not self.cyclic:
                cols[f"{col}_{field}"] = value
                continue
            first, period = CALENDAR_PERIODS[field]
            angle = 2 * np.pi * (value - first) / period
            cols[f"{col}_{field}_sin"], cols[f"{col}_{field}_cos"] = np.sin(angle), np.cos(angle)


def _calendar(seconds: np.ndarray, fields: Sequence[str] = tuple(CALENDAR_PERIODS), dtype: Any = None) -> dict:
    """Calendar ``fields`` of wall-clock seconds since 1970 (proleptic Gregorian), in integer numpy.

    Civil-from-days arithmetic (Howard Hinnant's algorithm). When a piece spans fewer hours than
    it has rows, the fields but ``minute`` are worked out once per hour of its span and gathered.
    ``dtype``: of the values returned (default int64).
    """
    out: dict[str, np.ndarray] = {}
    if "minute" in fields:
        out["minute"] = seconds // 60 % 60
    hourly = [f for f in fields if f != "minute"]
    if hourly and len(seconds):
        hours = seconds // 3600
        first, last = int(hours.min()), int(hours.max())
        if last - first < len(hours):
            table = _calendar_rows(np.arange(first, last + 1, dtype=np.int64) * 3600, hourly)
            at = hours - first  # (rows,) each row's hour in the table
            out.update({f: table[f].astype(dtype or np.int64)[at] for f in hourly})
        else:
            out.update(_calendar_rows(seconds, hourly))
    if dtype is not None:
        out = {f: v.astype(dtype, copy=False) for f, v in out.items()}
    return out


def _calendar_rows(seconds: np.ndarray, fields: Sequence[str]) -> dict[str, np.ndarray]:
    """``_calendar``'s fields of each of ``seconds`` (days through a table when they are fewer than the rows)."""
    days = seconds // 86400
    out: dict[str, np.ndarray] = {}
    if "hour" in fields:
        out["hour"] = seconds // 3600 % 24
    if "dayofweek" in fields:
        out["dayofweek"] = (days + 3) % 7
    if "weekofyear" in fields:  # ISO week: pandas (per row here, per hour of the span through ``_calendar``)
        import pandas as pd

        stamps = pd.DatetimeIndex(seconds.astype("datetime64[s]"))
        out["weekofyear"] = stamps.isocalendar().week.to_numpy(np.int64)
    civil = [f for f in fields if f in ("year", "month", "day", "dayofyear", "quarter")]
    if civil and len(days):
        first, last = int(days.min()), int(days.max())
        if last - first < len(days):
            table = _civil(np.arange(first, last + 1, dtype=np.int64))
            out.update({f: table[f][days - first] for f in civil})
        else:
            table = _civil(days)
            out.update({f: table[f] for f in civil})
    return out


def _civil(days: np.ndarray) -> dict[str, np.ndarray]:
    """Year, month, day, day of year and quarter of days since 1970-01-01."""
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097  # day of the 400-year era
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy_march = doe - (365 * yoe + yoe // 4 - yoe // 100)  # day of the year starting in March
    mp = (5 * doy_march + 2) // 153
    month = np.where(mp < 10, mp + 3, mp - 9)
    year = yoe + era * 400 + (month <= 2)
    prior = year - 1  # days from 1970 to January 1st of ``year``
    era1 = prior // 400
    yoe1 = prior - era1 * 400
    jan1 = era1 * 146097 + yoe1 * 365 + yoe1 // 4 - yoe1 // 100 + 306 - 719468
    return {
        "year": year,
        "month": month,
        "day": doy_march - (153 * mp + 2) // 5 + 1,
        "dayofyear": days - jan1 + 1,
        "quarter": (month - 1) // 3 + 1,
    }


class Function(Op):
    """A user function on a block of columns: ``fn({column: array}) -> {output: array}``, vectorised.

    ``fn`` must be importable by name (a module-level function) so that the workflow can be
    saved and DataLoader workers can load it; it gets float64 (or the stored dtype) arrays of the
    piece's rows and returns one array of as many rows per declared output.
    """

    kind = "function"
    numeric = False

    def __init__(self, fn: Callable | str, inputs: Any, outputs: Any) -> None:
        super().__init__(inputs)
        self.name = fn if isinstance(fn, str) else _qualified(fn)
        self.fn = _resolve(self.name) if isinstance(fn, str) else fn
        self.output_names = list(_names("Function outputs", outputs))

    def outputs(self) -> list[str]:
        return list(self.output_names)

    def config(self) -> dict:
        return {"fn": self.name, "inputs": list(self.columns), "outputs": self.output_names}

    def apply(self, cols: dict, piece: Piece) -> None:
        result = self.fn({c: cols[c] for c in self.columns})
        if not isinstance(result, dict) or set(result) != set(self.output_names):
            got = sorted(result) if isinstance(result, dict) else type(result).__name__
            raise SchemaError(f"Function {self.name} returned {got}, not the declared outputs {self.output_names}")
        for name in self.output_names:
            out = np.asarray(result[name])
            if out.shape != (piece.num_rows,):
                raise SchemaError(
                    f"Function {self.name} output {name!r} has shape {out.shape}, expected ({piece.num_rows},)"
                )
            cols[name] = out

    def __getstate__(self) -> dict:
        return {**self.__dict__, "fn": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.fn = _resolve(self.name)


def _qualified(fn: Callable) -> str:
    name = f"{getattr(fn, '__module__', '')}:{getattr(fn, '__qualname__', '')}"
    if "<" in name or name.startswith(":") or name.startswith("__main__:"):
        raise ConfigError(
            f"Function {fn!r} cannot be found by name again ({name}); define it at module level in an importable "
            "module so the saved workflow and DataLoader workers can load it"
        )
    return name


def _resolve(name: str) -> Callable:
    module, _, qualname = name.partition(":")
    try:
        target: Any = importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"Function {name!r} of the workflow cannot be imported ({exc}); install its module") from exc
    return target


OPS: dict[str, type[Op]] = {  # by kind; ``transforms`` adds ``Transform`` when imported (the package does)
    cls.kind: cls for cls in (FillMissing, Log1p, Clip, Normalize, Categorify, Lag, Difference, TimeFeatures, Function)
}


def op_from_json(entry: dict) -> Op:
    """The operation an artifact's entry describes, with its fitted state."""
    cls = OPS.get(entry.get("kind", ""))
    if cls is None:
        raise ConfigError(f"unknown workflow operation {entry.get('kind')!r}; known: {sorted(OPS)}")
    op = cls(**entry["config"])
    op.state = entry.get("state")
    return op
