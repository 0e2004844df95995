"""Missing time steps inside a series: counted by the fit and refused, or filled before streaming.

A window is ``window`` consecutive stored rows, so a gap would be spanned as if absent. With
``Workflow(time=..., freq=...)`` the fit counts the gaps (and steps of zero or less) and refuses them
with the count, an example and the remedies (``fill_timesteps``, or ``missing_timesteps="allow"``). One
pass: each partition reduces each run to value counts of its steps and its ends (``time_partial``); the
client joins a series' runs in order. Steps are in ``freq`` (calendar ones as period ordinals; none:
the smallest step seen).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dask_windows.errors import ConfigError, DataError

__all__ = ["check_timesteps", "fill_timesteps", "merge_timesteps", "ticks", "time_partial"]


def ticks(values: np.ndarray, freq: Any) -> tuple[np.ndarray, float | None]:
    """``(values as numbers, the step in them)``: the step is ``None`` where it is to be inferred."""
    import pandas as pd

    if values.dtype.kind == "M" or values.dtype.kind == "O":
        stamps = pd.DatetimeIndex(values)
        nanos = stamps.as_unit("ns").asi8.astype(np.float64)
        if freq is None:
            return nanos, None
        try:
            return nanos, float(pd.tseries.frequencies.to_offset(freq).nanos)  # a fixed frequency
        except ValueError:
            pass
        try:
            periods = stamps.tz_localize(None) if stamps.tz is not None else stamps
            alias = {"MS": "M", "QS": "Q", "YS": "Y", "AS": "Y"}.get(str(freq), freq)
            return periods.to_period(alias).asi8.astype(np.float64), 1.0
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                f"Workflow(freq={freq!r}) is not a pandas frequency of the time column ({exc}); use one such as "
                "'h', 'D', 'W-SAT' or 'MS'"
            ) from exc
    if values.dtype.kind not in "iuf":
        raise ConfigError(f"the time column holds {values.dtype} values: it must hold timestamps or numbers")
    if freq is not None and not isinstance(freq, (int, float)):
        raise ConfigError(f"Workflow(freq={freq!r}): a numeric time column takes a numeric step (default 1)")
    return values.astype(np.float64), float(freq or 1)


def time_partial(
    times: np.ndarray, step: float | None, keys: Any, starts: np.ndarray, lengths: np.ndarray, order: np.ndarray
) -> dict:
    """One partition's steps: value counts of the steps inside each run, and each run's ends.

    ``times``: ``(rows,)`` the owned rows' time column as numbers, ``step`` (both from ``ticks``); per run
    ``(runs,)``: its series id (``keys``), first row in ``times`` (``starts``), rows (``lengths``) and a
    sortable place in its series (``order``: runs of a series are joined in it).
    """
    import pandas as pd

    steps = np.diff(times)  # (rows - 1,) a step inside a run, except where a run begins
    inside = np.ones(len(steps), bool)
    inside[(starts[1:] - 1)[starts[1:] > 0]] = False
    steps = steps[inside]
    last = starts + np.maximum(lengths, 1) - 1
    ends = pd.DataFrame({"key": list(keys), "order": order, "first": times[starts], "last": times[last]})
    return {"steps": pd.Series(steps).value_counts(), "ends": ends[lengths > 0], "step": step}


def merge_timesteps(a: dict, b: dict) -> dict:
    import pandas as pd

    steps = a["steps"].add(b["steps"], fill_value=0)
    return {**a, "steps": steps, "ends": pd.concat([a["ends"], b["ends"]])}


def check_timesteps(wf: Any, merged: dict, what: Any) -> dict:
    """Raise ``DataError`` on missing, duplicate or decreasing time steps (unless ``wf`` allows gaps).

    Returns:
        ``{"step", "missing", "backwards"}``: the step, the steps missing and those of zero or less.
    """
    import pandas as pd

    ends = merged["ends"].sort_values(["key", "order"], kind="stable")
    same = ends["key"].to_numpy()[1:] == ends["key"].to_numpy()[:-1]  # (runs - 1,) the next run continues it
    across = ends["first"].to_numpy()[1:][same] - ends["last"].to_numpy()[:-1][same]
    steps = merged["steps"].add(pd.Series(across).value_counts(), fill_value=0)
    values, counts = steps.index.to_numpy(np.float64), steps.to_numpy(np.float64)
    step = merged["step"]
    if step is None:
        positive = values[values > 0]
        step = float(positive.min()) if len(positive) else 1.0
    backwards = int(counts[values <= 0].sum())
    gaps = values > step * 1.5
    missing = int((np.round(values[gaps] / step) - 1) @ counts[gaps])
    if backwards:
        raise DataError(
            f"{what} has {backwards:,} time steps of zero or less inside series (column {wf.time!r}): duplicate "
            "times, or rows not in time order; keep one row per time and sort each series by time "
            "(dask-windows convert sorts)"
        )
    if missing and wf.missing_timesteps == "raise":
        raise DataError(
            f"{what} has {missing:,} missing time steps inside its series (column {wf.time!r}, a step of "
            f"{_step_text(step, wf, merged.get('datetime', False))}): windows would span the gaps as if they were not there; add the missing "
            "rows with dask_windows.workflow.fill_timesteps (their values null, then FillMissing), or pass "
            "Workflow(missing_timesteps='allow') to window over them as they are"
        )
    return {"step": step, "missing": missing, "backwards": backwards}


def _step_text(step: float, wf: Any, datetime: bool) -> str:
    import pandas as pd

    if wf.freq is not None:
        return f"freq={wf.freq!r}"
    if datetime:
        return str(pd.Timedelta(int(step), "ns"))
    return f"{step:g}"


def fill_timesteps(frame: Any, series: str | None, time: str, freq: Any = None) -> Any:
    """``frame`` with a row for every missing time step inside each series (values null), sorted by (series, time).

    Args:
        frame: A pandas or Dask DataFrame.
        series: The series id column (``None``: one series).
        time: The time column (timestamps, or integers with ``freq`` their step, default 1).
        freq: A pandas frequency for timestamps; required for them.

    Returns:
        The same kind of frame. A Dask frame is grouped by series (a shuffle): each series must fit
        in one worker's memory.
    """
    import pandas as pd

    def fill(part: pd.DataFrame) -> pd.DataFrame:
        if not len(part):
            return part
        part = part.sort_values(time, kind="stable")
        values = part[time]
        if isinstance(values.dtype, pd.DatetimeTZDtype) or values.dtype.kind == "M":
            if freq is None:
                raise ConfigError("fill_timesteps needs freq= (a pandas frequency) for a timestamp column")
            grid = pd.date_range(values.iloc[0], values.iloc[-1], freq=freq)
        else:
            grid = np.arange(values.iloc[0], values.iloc[-1] + 1e-9 * abs(freq or 1), freq or 1)
        out = part.set_index(time).reindex(grid).rename_axis(time).reset_index()
        if series is not None:
            out[series] = part[series].iloc[0]
        return out[list(part.columns)]

    def fill_all(part: pd.DataFrame) -> pd.DataFrame:
        if series is None:
            return fill(part).reset_index(drop=True)
        parts = [fill(g) for _, g in part.groupby(series, sort=True)]
        return pd.concat(parts, ignore_index=True) if parts else part

    if isinstance(frame, pd.DataFrame):
        return fill_all(frame)
    if series is None:
        raise ConfigError("fill_timesteps of a Dask frame needs series= (each series is filled on one worker)")
    return frame.shuffle(on=series).map_partitions(fill_all, meta=frame._meta)
