"""A unit's row ranges as a few row blocks, decoded and indexed in one pass.

A pool unit is decoded from up to three disjoint row ranges of its partition (the rows kept by the
unit before, its own, those kept by the unit after), laid end to end in one array with a constant
number of numpy calls per column (``decode_blocks``), and given their window starts for all
segments at once (``segment_starts``, ``segment_runs``). A float64 column with ``nan="raise"`` is
joined in its own dtype before the cast, so values beyond float32's range are seen as such.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dask_windows.opening.checks import FLOAT32_MAX

__all__ = ["decode_blocks", "segment_runs", "segment_starts"]


def segment_starts(
    run_first: np.ndarray, run_counts: np.ndarray, stride: int, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """Partition rows where windows ``lo[i] .. hi[i]-1`` start, for every ``i``, concatenated.

    The vectorised ``windows.window_starts`` of many ranges: ``run_first``, ``run_counts`` ``(R,)`` each
    run's first window row and windows; ``lo``, ``hi`` ``(n,)`` the ranges (windows numbered run by run,
    ``hi > lo``). Returns ``(sum(hi - lo),)`` int64 start rows, range by range.
    """
    row, take, _ = segment_runs(run_first, run_counts, stride, lo, hi)
    k = np.arange(int(take.sum()), dtype=np.int64) - np.repeat(np.cumsum(take) - take, take)  # within its run
    out = np.repeat(row, take)
    out += k * stride
    return out


def segment_runs(
    run_first: np.ndarray, run_counts: np.ndarray, stride: int, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The windows of ``segment_starts`` as progressions ``row[p] + stride * arange(count[p])``, one per
    (range, run) they share: ``(row, count, range)``, each ``(q,)`` int64, in range order, then row order."""
    counts = np.asarray(run_counts, np.int64)
    ends = np.cumsum(counts)  # (R,) window number just past each run
    begins = ends - counts
    lo, hi = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
    r0 = np.searchsorted(ends, lo, side="right")  # (n,) run of each range's first window
    r1 = np.searchsorted(ends, hi - 1, side="right")  # (n,) run of its last window
    per = r1 - r0 + 1  # (n,) runs each range touches
    pair = np.repeat(np.arange(len(lo)), per)  # (q,) range of each (range, run) pair
    run = np.arange(len(pair)) - np.repeat(np.cumsum(per) - per, per) + r0[pair]  # (q,) its run
    a = np.maximum(begins[run], lo[pair])  # (q,) first window of the pair
    take = np.maximum(np.minimum(ends[run], hi[pair]) - a, 0)  # (q,) its windows
    row = np.asarray(run_first, np.int64)[run] + (a - begins[run]) * stride
    keep = take > 0
    return row[keep], take[keep], pair[keep]


def _bad_mask(values: np.ndarray) -> np.ndarray | None:
    """``(rows,)`` True where ``values`` is NaN, ``±inf`` or beyond float32 (as ``checks.bad_value_rows``);
    ``None`` when no value is (``_all_finite``: two reductions, no mask)."""
    if values.dtype.kind == "f" and _all_finite(values):
        return None
    with np.errstate(invalid="ignore"):
        hit = ~np.isfinite(values)
        if values.dtype.itemsize > 4 and values.dtype.kind == "f":
            hit |= np.abs(values) > FLOAT32_MAX
    return hit


def _fill(out: np.ndarray, views: Sequence[np.ndarray], check: bool) -> np.ndarray | None:
    """Write ``views`` end to end into ``out`` (1-D, any stride); their bad-value mask when ``check``."""
    kind, size = views[0].dtype.kind, views[0].dtype.itemsize
    if check and kind in "fc" and not (kind == "f" and size <= 4 and out.dtype.kind == "f"):
        values = views[0] if len(views) == 1 else np.concatenate(views)  # in its own dtype: see beyond float32
        with np.errstate(invalid="ignore", over="ignore"):  # NaN rows of an int target, values beyond
            out[...] = values  # float32 (inf once cast): in no window (nan= policy)
        return _bad_mask(values)
    with np.errstate(invalid="ignore", over="ignore"):  # beyond float32: left out by nan="drop"'s scan
        if len(views) == 1:
            out[...] = views[0]
        else:
            np.concatenate(views, out=out, casting="unsafe")
    if check and kind == "f":  # float32 (or narrower) into float32: the cast keeps every NaN and inf, so
        # the views are checked (contiguous, as read) rather than ``out`` (strided in the NLC layout: about 15x slower)
        return None if all(_all_finite(v) for v in views) else ~np.isfinite(out)
    return None


def _all_finite(values: np.ndarray) -> bool:
    """Whether no value of ``values`` (a float array) is NaN, ``±inf`` or, in a type wider than float32,
    beyond float32's range: exactly when ``_bad_mask`` would find no row. From the minimum and maximum
    alone (NaN propagates through both; the extremes bound every value): reads only, no masks written."""
    if values.size == 0:
        return True
    with np.errstate(invalid="ignore"):
        low, high = values.min(), values.max()
    if values.dtype.itemsize > 4:  # NaN compares False: not all finite
        return bool(low >= -FLOAT32_MAX and high <= FLOAT32_MAX)
    return bool(np.isfinite(low) and np.isfinite(high))


def _rows_of(masks: list[np.ndarray | None]) -> np.ndarray:
    """Sorted rows where any mask is set."""
    bad = None
    for mask in masks:
        if mask is not None:
            bad = mask if bad is None else bad | mask
    return np.zeros(0, np.int64) if bad is None else np.flatnonzero(bad).astype(np.int64)


def decode_blocks(
    pieces: Sequence[dict],
    features: Sequence,
    targets: Sequence,
    channel_major: bool,
    check: bool,
    y_dtype: type,
    out: tuple[np.ndarray, np.ndarray | None] | None = None,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray, np.ndarray]:
    """Lay the columns of ``pieces`` end to end in the buffer layout, a few numpy calls per column.

    ``pieces``: per block, its columns as 1-D arrays; ``channel_major``: ``(C, rows)`` features, else
    ``(rows, C)``; ``check``: find the rows holding NaN, inf or values beyond float32; ``out``: ``(x, y)``
    to write into (ignored when their rows are not those of ``pieces``), or ``None``. Returns ``(x, y,
    nan_x, nan_y, offsets)``: features, targets or ``None``, their sorted bad rows, block starts and total.
    """
    lengths = [len(p[features[0]]) for p in pieces]
    offsets = np.cumsum([0, *lengths]).astype(np.int64)
    rows = int(offsets[-1])
    shape = (len(features), rows) if channel_major else (rows, len(features))
    if out is not None and out[0].shape != shape:
        out = None
    x = np.empty(shape, np.float32) if out is None else out[0]
    masks = [_fill(x[c] if channel_major else x[:, c], [p[f] for p in pieces], check) for c, f in enumerate(features)]
    nan_x = _rows_of(masks)
    y, nan_y = None, np.zeros(0, np.int64)
    if targets:
        y = np.empty((len(targets), rows), y_dtype) if out is None or out[1] is None else out[1]
        nan_y = _rows_of([_fill(y[t], [p[c] for p in pieces], check) for t, c in enumerate(targets)])
    return x, y, nan_x, nan_y, offsets
