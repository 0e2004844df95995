"""Standardisation: statistics for ``normalize=`` and the two ways of applying them.

``load_stats`` reads what ``dask-windows stats`` writes (per feature mean and population std, used
as float32 in channel order). Global statistics are applied once per decoded partition
(``standardize``, on the prefetch thread), not per batch, where overlapping windows would repeat
the arithmetic up to ``window`` times; the values are bit-identical, at the cost of standardising
rows no window uses. ``normalize="sample"`` depends on the window, so it stays per batch
(``standardize_windows``), in chunks of about 1 MiB that stay in the L2 cache, on one torch
thread; values whose sums or squares overflow float32 are standardised in float64. Where windows
overlap, ``window_table`` computes every window's statistics once per buffer; this module serves
the rest (the first positions of a buffer, batches across two buffers, long strides)."""

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
    """Mean and std of ``features`` (in channel order) from a stats file or dict, for standardising.

    Args:
        path_or_dict: A ``dask-windows stats`` JSON file (fsspec URL allowed), its decoded dict, or
            ``{feature: {"mean": .., "std": ..}}``.
        storage_options: Passed to fsspec when reading a file.

    Returns:
        ``(mean, std)``, float32 ``(len(features),)``; ``std`` is the population std, 0 for a constant feature.

    Raises:
        SchemaError: A feature is missing or has no mean/std.
        DataError: Not a stats document; a mean not finite; a std negative, not finite, or positive but
            below ``TINY_STD`` or float64's resolution of the mean (naming the file, feature and remedy)."""
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
    """Standardise a decoded partition ``x`` in place and return it: ``(x - mean) * (1 / std)`` per feature;
    ``x`` is float32, ``(C, rows)`` when ``channel_major`` else ``(rows, C)``."""
    shape = (-1, 1) if channel_major else (1, -1)
    inv = (1.0 / np.asarray(std, np.float32)).reshape(shape)
    x -= np.asarray(mean, np.float32).reshape(shape)
    x *= inv
    return x


def standardize_windows(x: np.ndarray, channel_major: bool, eps: float = 1e-8) -> np.ndarray:
    """Standardise each window and channel of a batch in place over its ``L`` values, and return it.

    ``x`` is float32, C-contiguous, ``(B, C, L)`` when ``channel_major`` else ``(B, L, C)``; each becomes
    ``(x - mean) / max(std, eps)`` (population std). Never NaN from finite input: a constant window
    becomes zeros, values whose squares overflow float32 are standardised in float64."""
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
    """Whether the sum of the squares of all of ``x`` is finite in float32 (one BLAS pass): then so is
    every window's, centred or not."""
    flat = x.reshape(-1)
    with np.errstate(over="ignore"):  # an overflow is the answer, not a problem
        return bool(np.isfinite(np.dot(flat, flat)))


#: Values per chunk of windows (1 MiB of float32): the chunk stays in the L2 cache across the four passes.
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
    """Zero, in place, the windows of ``centred`` whose values were all equal (a constant window's mean can
    be a rounding step off, which would become its std); only windows whose ``std`` is below ``rel`` of
    their ``mean`` (per window, ``keepdims`` shapes) are checked."""
    candidates = std <= np.abs(mean) * rel
    if not candidates.any():
        return
    # a constant window's first, middle and last centred values agree: only those windows are compared in full
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
    """``(B, C, L)`` in place in four passes over rows of ``L`` values, no temporaries: row sums, centring of
    the halved values (``0.5 * x - 0.5 * mean``, which cannot overflow), sums of their squares (where one
    overflows, the values go to float64), and scaling by ``2 / max(std, eps)``."""
    import torch

    length = x.shape[2]
    rows = x.reshape(-1, length)  # a view: x is C-contiguous
    # row sums, a dot product per row (BLAS's matrix-vector product wakes threads: 3-10x slower when busy)
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
    """``(B, L, C)`` in place, the sums as matrix products; ``False``, with ``x`` centred but not scaled, when
    a sum of squares overflowed."""
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
    var *= scale
    np.sqrt(var, out=var)
    np.maximum(var, np.float32(eps), out=var)
    inv = np.reciprocal(var, out=var)  # 1 / max(std, eps)
    # inv is 1 / std (or 1 / eps): a window is checked when std <= |mean| * rel, i.e. |mean| * inv >= 1 / rel.
    _zero_constant(x, 1, np.float32(1.0), (mean[:, 0, :] * inv)[:, None, :], 2.0**-12)
    wide *= np.tile(inv[:, None, :], (1, 1, repeat))
    return True


def _wide_rows(x: np.ndarray) -> tuple[np.ndarray, int]:
    """``(B, L, C)`` viewed as ``(B, L / k, k * C)`` for the largest ``k`` dividing ``L`` with ``k * C <= 256``:
    numpy broadcasts a ``(B, 1, C)`` operand tiled ``k`` times over such rows at memory speed."""
    batch, length, channels = x.shape
    for repeat in range(min(length, max(1, 256 // channels)), 0, -1):
        if length % repeat == 0:
            return x.reshape(batch, length // repeat, repeat * channels), repeat
    return x, 1  # pragma: no cover - repeat 1 always divides
