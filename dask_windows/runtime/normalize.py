"""Standardisation: statistics for ``normalize=`` and the two ways of applying them.

The file is written by ``dask-windows stats`` (``cli.summary.compute_stats``):
per-feature count, mean, population std, min, max and NaN count. The loader
only needs mean and std per channel, as float32, in channel order.

Global statistics are applied once per decoded partition (``standardize``,
called by ``buffer.decode`` on the prefetch thread), not on every batch: a
value is read by many overlapping windows at stride 1, so standardising each
batch did the same arithmetic up to ``window`` times and halved throughput.
The float32 operations are the ones the per-batch path did (subtract the
mean, multiply by ``1 / std``), so the values are bit-identical; the cost is
that rows no window uses are standardised too.

Per-window standardisation (``normalize="sample"``) depends on the window, so
it stays per batch (``standardize_windows``), chunk by chunk of about 1 MiB so
that a chunk stays in the L2 cache, the last-gathered chunk first (it is the one
still in the cache). For the channel-major layout that is four passes: row sums
(a dot product per row, not BLAS's matrix-vector product, whose threads cost
3-10x on a busy machine), centring of the *halved* values ``0.5 * x - 0.5 *
mean`` (which cannot overflow, so no pass checks for huge values first), sums
of their squares and one scaling, in place (no temporary the size of the
batch), on one torch thread: waking a second thread for each operation of a
chunk cost more than it saved, up to 20x more when the other core is busy.
Values whose sums or squares overflow float32 are standardised in float64. For
the time-major layout the sums are matrix products, where numpy's reductions
over a middle axis of a few channels are slow. A window's statistics are not
shared with the overlapping windows.

Evaluated and not taken: each window's mean and variance from float64 prefix
sums over the buffer (kept every 8 rows, restarted every 1,024 rows, with a
rounding bound per window and the exact code for windows it cannot vouch
for). It leaves two passes per batch, but the statistics cost more than the
two passes they save: about 30 numpy calls per batch (0.26 ms of CPU against
0.18 ms for the two passes, at (256, 4, 512)), or, computed for thousands of
windows at once, 0.56 ms per batch for the first and last rows of each window
read from the buffer; and the sums take half the buffer's memory again. What
is taken instead, where windows overlap (``window_table``, used by the
pipeline): every window's mean and ``1 / std`` once per buffer, for the cost of
a table twice the size of the buffer's features; a batch then costs a lookup
and two passes. This module's per-batch code still serves the first positions
of each buffer, the windows the table does not vouch for, batches that straddle
two buffers, and strides of a quarter of the window or more.

Constant windows: only windows whose std is below ``2**-12`` of their mean are
checked, and of those only the ones whose first, middle and last values agree
are compared value by value (with a large offset every window is checked, and
reading all of them was a whole extra pass).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence

import fsspec
import numpy as np

from dask_windows.errors import DataError, SchemaError

__all__ = ["STATS_FORMAT", "STATS_VERSION", "load_stats", "standardize", "standardize_windows"]

logger = logging.getLogger(__name__)

STATS_FORMAT = "dask_windows.stats"
STATS_VERSION = 1


def load_stats(
    path_or_dict: str | os.PathLike | dict, features: Sequence[str], storage_options: dict | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std of ``features`` from a stats file or dict, for standardising.

    Args:
        path_or_dict: a ``dask-windows stats`` JSON file (fsspec URL allowed)
            or its decoded dict, or ``{feature: {"mean": .., "std": ..}}``.
        features: the columns, in channel order.
        storage_options: passed to fsspec when reading a file.

    Returns:
        ``(mean, std)``, float32 arrays of shape ``(len(features),)``. ``std``
        is the population std and may hold zeros for constant features.

    Raises:
        SchemaError: a feature is missing or has no mean/std (all NaN).
        DataError: the file is not a stats document, or a mean is not finite, or a std is
            negative, infinite or NaN (checked like the ``{"mean": .., "std": ..}`` dict form), or positive
            but below ``TINY_STD`` or float64's resolution of the mean,
            naming the file, the feature and the remedy.
    """
    where = "the stats dict"
    doc = path_or_dict
    if not isinstance(doc, dict):
        where = os.fspath(doc)
        with fsspec.open(where, "r", **(storage_options or {})) as src:
            try:
                doc = json.load(src)
            except json.JSONDecodeError as exc:
                raise DataError(
                    f"{where} is not JSON ({exc}); create it with `dask-windows stats PATH --out {where}`"
                ) from exc
    if "format" in doc:
        if doc["format"] != STATS_FORMAT or doc.get("version") != STATS_VERSION:
            raise DataError(
                f"{where} is not a dask_windows stats file version "
                f"{STATS_VERSION} (format {doc.get('format')!r}, version "
                f"{doc.get('version')!r}); recreate it with `dask-windows stats`"
            )
        doc = doc["features"]
    mean = np.empty(len(features), dtype=np.float32)
    std = np.empty(len(features), dtype=np.float32)
    for i, name in enumerate(features):
        entry = doc.get(name)
        if not isinstance(entry, dict) or entry.get("mean") is None or entry.get("std") is None:
            known = sorted(doc)
            raise SchemaError(
                f"{where} has no mean/std for feature {name!r} (it has {known}); "
                f"rerun `dask-windows stats PATH --features ...` including it"
            )
        mean[i], std[i] = _number(entry["mean"], where, name, "mean"), _number(entry["std"], where, name, "std")
        if not np.isfinite(mean[i]):
            raise DataError(
                f"{where} gives feature {name!r} the mean {entry['mean']!r}, which is not a finite "
                f"float32 (a NaN, inf or out-of-range value in the data it was computed from); "
                f"clean the data and rerun `dask-windows stats`, or fix the file"
            )
        if not np.isfinite(std[i]) or std[i] < 0:
            raise DataError(
                f"{where} gives feature {name!r} the std {entry['std']!r}; a std must be a finite "
                f"number >= 0 (0 for a constant feature); rerun `dask-windows stats`, or fix the file"
            )
        if 0 < float(entry["std"]) < max(TINY_STD, float(np.finfo(np.float64).eps) * abs(float(entry["mean"]))):
            raise DataError(
                f"{where} gives feature {name!r} the std {entry['std']!r} (mean {entry['mean']!r}): below "
                f"{TINY_STD:g} or below float64's resolution of the mean, so standardising would multiply "
                f"rounding noise by {1 / float(entry['std']):.3g}; if the feature is constant write std 0 (it is then "
                f"only centred), else rescale it, rerun `dask-windows stats`, or fix the file"
            )
    if (std == 0).any():
        logger.warning("features %s are constant in %s (std 0)", [f for f, s in zip(features, std) if s == 0], where)
    return mean, std


#: A std below this (or below float64's resolution of the mean) is refused: it can only be rounding noise.
TINY_STD = 1e-20


def _number(value: object, where: str, feature: str, field: str) -> float:
    """``value`` as a float, or a ``DataError`` naming the file, feature and field."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DataError(
            f"{where} gives feature {feature!r} the {field} {value!r}, which is not a number; "
            f"rerun `dask-windows stats`, or fix the file"
        )
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def standardize(x: np.ndarray, mean: np.ndarray, std: np.ndarray, channel_major: bool) -> np.ndarray:
    """Standardise a decoded partition in place: ``(x - mean) * (1 / std)`` per feature.

    Args:
        x: Features, ``(C, rows)`` when ``channel_major`` else ``(rows, C)``, float32.
        mean: ``(C,)`` per-feature mean.
        std: ``(C,)`` per-feature std.
        channel_major: The layout of ``x``.

    Returns:
        ``x``.
    """
    shape = (-1, 1) if channel_major else (1, -1)
    inv = (1.0 / np.asarray(std, np.float32)).reshape(shape)
    x -= np.asarray(mean, np.float32).reshape(shape)
    x *= inv
    return x


def standardize_windows(x: np.ndarray, channel_major: bool, eps: float = 1e-8) -> np.ndarray:
    """Standardise each window and channel of a batch in place over its ``L`` values.

    Args:
        x: ``(B, C, L)`` when ``channel_major`` else ``(B, L, C)``, float32, C-contiguous.
        channel_major: The layout of ``x``.
        eps: Floor of the std (a constant window becomes zeros).

    Returns:
        ``x``: ``(x - mean) / max(std, eps)`` with the population std of each window and channel.
        Never NaN from finite input: a constant window and channel becomes zeros, and values
        whose squares would overflow float32 are standardised in float64. Non-finite values
        never get here: ``nan=`` raises on them or drops their windows.
    """
    if x.size == 0:
        return x
    batch = x.shape[0]
    step = max(1, _CHUNK_VALUES // (x[0].size or 1))
    if channel_major:
        import torch  # the loader's batches are torch tensors already; numpy's broadcasts here are slower

        ones = np.ones(x.shape[2], x.dtype)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # small chunks: a second thread's wake-ups cost more than it does
        try:
            with np.errstate(over="ignore", invalid="ignore"):  # an overflow is the answer, not a problem
                # Last chunk first: the gather wrote it last, so it is the part still in the cache.
                for first in reversed(range(0, batch, step)):  # a chunk's passes run while it is in the cache
                    _standardize_channel_major(x[first : first + step], ones, eps)
        finally:
            torch.set_num_threads(threads)
        return x
    for first in range(0, batch, step):  # a chunk's passes run while it is in the cache
        part = x[first : first + step]
        if _squares_safe(part) and _standardize_time_major(part, eps):
            continue
        # Squares overflow float32: in float64 (from the values as given, or centred in float32 when
        # only the centred sums overflowed, at the edge of float32's range: centring lost nothing).
        _standardize_float64(part, 1, eps)
    return x


def _squares_safe(x: np.ndarray) -> bool:
    """Whether the sum of the squares of all of ``x`` is finite in float32: one BLAS pass.

    Then every window's sum of squares is finite, and so is that of its centred values (never
    larger, short of rounding at the edge of float32's range, which the callers check for).
    """
    flat = x.reshape(-1)
    with np.errstate(over="ignore"):  # an overflow is the answer, not a problem
        return bool(np.isfinite(np.dot(flat, flat)))


#: Values per chunk of windows (1 MiB of float32): the chunk stays in the L2 cache across the
#: four passes (sum, subtract, sum of squares, scale), so the batch leaves memory once. Two
#: chunks of a (256, 4, 512) batch cost 7-13% less than four of 512 KiB (fewer calls per batch).
_CHUNK_VALUES = 1 << 18


def _standardize_float64(x: np.ndarray, axis: int, eps: float, x64: np.ndarray | None = None) -> None:
    """The float64 path, for values whose squares would overflow float32 (``x64``: them, if known)."""
    x64 = x.astype(np.float64) if x64 is None else x64
    mean = x64.mean(axis=axis, keepdims=True)
    x64 -= mean
    std = np.sqrt(np.mean(np.square(x64), axis=axis, keepdims=True))
    _zero_constant(x64, axis, std, mean, 2.0**-30)
    x64 /= np.maximum(std, eps)
    x[...] = x64


def _zero_constant(centred: np.ndarray, axis: int, std: np.ndarray, mean: np.ndarray, rel: float) -> None:
    """Set to zero, in place, the windows of ``centred`` whose values were all equal.

    A constant window's computed mean can be a rounding step off its value (0.1, 123.456), and
    that step would then be its std: every value +-1 instead of 0. A window is checked only when
    its std is below ``rel`` of its mean (``std``, ``mean``: per window, ``keepdims`` shapes), so
    batches of ordinary windows pay nothing; a checked window is zeroed only if its centred values
    are all equal, which only a constant window's are.
    """
    candidates = std <= np.abs(mean) * rel
    if not candidates.any():
        return
    # A constant window's centred values are bit-identical, so its first, middle and last agree:
    # three values per window sort out the windows of a large offset (std below ``rel`` of the
    # mean) that vary, and only the rest are compared value by value (a pass over the whole
    # batch cost a third of the time of a batch of such windows).
    length = centred.shape[axis]
    first = np.take(centred, [0], axis=axis)
    candidates = candidates & (np.take(centred, [length // 2, length - 1], axis=axis) == first).all(
        axis=axis, keepdims=True
    )
    which = np.nonzero(np.moveaxis(candidates, axis, -1)[..., 0])
    if not len(which[0]):
        return
    rows = np.moveaxis(centred, axis, -1)  # a view: (..., L)
    checked = rows[which]  # (k, L): the candidates' values
    constant = (checked == checked[:, :1]).all(axis=1)
    if constant.any():
        picked = tuple(index[constant] for index in which)
        rows[picked] *= 0  # zeros with the sign of each value, as a multiplication by False gave


def _standardize_channel_major(x: np.ndarray, ones: np.ndarray, eps: float) -> None:
    """``(B, C, L)`` in place, four passes over rows of ``L`` contiguous values, no temporaries.

    The row sums are a matrix-vector product (no overflow check needed before it: a sum that
    overflows sends the untouched values to float64). The values are then centred *halved*,
    ``0.5 * x - 0.5 * mean`` in one rounding (one torch pass), which cannot overflow even at the
    edge of float32's range, so no check of the squares is needed before centring (the 0.2 code
    spent a whole pass on it). The squares of the halved centred values are summed per row (one
    pass); when such a sum overflows, the values are recovered as ``2 * v + mean`` and
    standardised in float64. The last pass scales by ``2 / max(std, eps)``.
    """
    import torch

    length = x.shape[2]
    rows = x.reshape(-1, length)  # a view: x is C-contiguous
    # Row sums, a dot product per row: not BLAS's matrix-vector product, which wakes its own threads
    # for a chunk this size (3-4x slower on a busy machine; 10x for a whole batch). The caller
    # ignores overflow: a sum that overflows is checked.
    half_mean = _VECDOT(rows, ones)
    half_mean *= np.float32(-0.5 / length)  # exactly -0.5 * (sum * float32(1 / L))
    if not np.isfinite(half_mean.sum()):  # a row sum overflowed (or, harmlessly, their total did)
        _standardize_float64(x, 2, eps)
        return
    values = torch.from_numpy(rows)
    torch.add(torch.from_numpy(half_mean[:, None]), values, alpha=0.5, out=values)  # (x - mean) / 2
    factor = _VECDOT(rows, rows)
    if not np.isfinite(factor.sum()):  # squares beyond float32: back to the values, in float64
        x64 = rows.astype(np.float64)
        x64 *= 2.0
        x64 -= 2.0 * half_mean[:, None].astype(np.float64)
        _standardize_float64(rows, 1, eps, x64)
        return
    factor *= np.float32(1.0 / length)  # a quarter of the variance
    np.sqrt(factor, out=factor)  # half the std
    _zero_constant(rows, 1, factor[:, None], half_mean[:, None], 2.0**-12)
    np.maximum(factor, np.float32(eps / 2), out=factor)
    np.reciprocal(factor, out=factor)  # 2 / max(std, eps): undoes the halving too
    values.mul_(torch.from_numpy(factor[:, None]))


def _vecdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A dot product per row (numpy < 2 has no ``np.vecdot``)."""
    return np.einsum("rl,rl->r", a, b)


_VECDOT = getattr(np, "vecdot", _vecdot)  # numpy >= 2: a dot product per row, no temporary


def _standardize_time_major(x: np.ndarray, eps: float) -> bool:
    """``(B, L, C)`` in place: the sums as matrix products, numpy's slow middle-axis reductions avoided.

    Returns ``False``, with ``x`` centred but not scaled, when a sum of squares overflowed.
    """
    length = x.shape[1]
    scale = np.float32(1.0 / length)
    ones = np.ones((1, length), x.dtype)
    mean = np.matmul(ones, x)  # (B, 1, C)
    mean *= scale
    wide, repeat = _wide_rows(x)
    wide -= np.tile(mean, (1, 1, repeat))
    if x.shape[2] <= 32:  # the diagonal of each window's (C, C) Gram matrix: fast for few channels
        var = np.einsum("bii->bi", np.matmul(x.transpose(0, 2, 1), x)).copy()  # (B, C)
    else:
        var = np.matmul(ones, np.square(x))[:, 0]
    if not np.isfinite(var).all():
        return False
    inv = _inverse_std(var, scale, eps)
    # inv is 1 / std (or 1 / eps): a window is checked when std <= |mean| * rel, i.e. |mean| * inv >= 1 / rel.
    _zero_constant(x, 1, np.float32(1.0), (mean[:, 0, :] * inv)[:, None, :], 2.0**-12)
    wide *= np.tile(inv[:, None, :], (1, 1, repeat))
    return True


def _inverse_std(sum_squares: np.ndarray, scale: np.float32, eps: float) -> np.ndarray:
    """``1 / max(sqrt(sum_squares * scale), eps)``, in place."""
    sum_squares *= scale
    np.sqrt(sum_squares, out=sum_squares)
    np.maximum(sum_squares, np.float32(eps), out=sum_squares)
    return np.reciprocal(sum_squares, out=sum_squares)


def _wide_rows(x: np.ndarray) -> tuple[np.ndarray, int]:
    """``(B, L, C)`` viewed as ``(B, L / k, k * C)`` for the largest ``k`` dividing ``L`` with ``k * C <= 256``.

    Broadcasting a ``(B, 1, C)`` operand over rows of a few channels is slow in numpy; over
    rows of ``k * C`` values (the operand tiled ``k`` times) it runs at memory speed.
    """
    batch, length, channels = x.shape
    for repeat in range(min(length, max(1, 256 // channels)), 0, -1):
        if length % repeat == 0:
            return x.reshape(batch, length // repeat, repeat * channels), repeat
    return x, 1  # pragma: no cover - repeat 1 always divides
