"""Per-window statistics once per unit of the pool, for ``normalize="sample"`` at overlapping windows.

Every start row's mean and ``1 / max(std, eps)`` come once per unit from float64 prefix sums (over
blocks of ``_BLOCK`` rows shifted by about their mean); a batch then costs a lookup, a subtraction and a
scaling. A window whose rounding bound is not below ``_TOL`` of its std, a constant one, a non-finite
block's and one whose centring could overflow float32 are ``NaN``: standardised from their values.
Trade-offs: two float32 per start row and channel, a dozen passes to build (only where
``worth_building``), values within tolerance of the per-batch code; a function of the unit's rows alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["WindowTable", "apply_table", "build_table", "worth_building"]

_BLOCK = 4096  # start rows whose sums share one shift and one running sum
_TOL = 1e-6  # largest relative rounding of a window's std (and of its mean, over its std) taken from the table
_U = 2.0**-53  # float64 unit roundoff
_OVERLAP = 4  # windows read each row at least this often (on average) for the table to pay


def worth_building(windows: int, rows: int, window: int) -> bool:
    """Whether ``windows`` windows drawn from ``rows`` rows repay a table (at least ``_OVERLAP`` window
    values per row: the table costs about 12 passes, per-batch statistics two per window value)."""
    return rows > 0 and windows * window >= _OVERLAP * rows


def build_table(x: np.ndarray, window: int, channel_major: bool, eps: float = 1e-8) -> np.ndarray:
    """Every window's mean and ``1 / max(std, eps)`` per channel, for each start row of ``x``.

    ``x``: float32 ``(C, rows)`` when ``channel_major`` else ``(rows, C)``. Returns ``(rows - L + 1, 2 * C)``
    float32, the means then the inverse stds; ``NaN`` where a window must be standardised from its values.
    """
    channels = x.shape[0] if channel_major else x.shape[1]
    rows = x.shape[1] if channel_major else x.shape[0]
    count = max(rows - window + 1, 0)
    table = np.empty((count, 2 * channels), np.float32)
    if not count:
        return table
    block = min(_BLOCK, count)
    work = _Work(channels, block, window)
    with np.errstate(all="ignore"):  # non-finite values are marked, not warned about
        for first in range(0, count, block):
            k = min(block, count - first)
            span = slice(first, first + k + window - 1)
            values = x[:, span] if channel_major else x[span].T  # (C, k + L - 1)
            out = table[first : first + k].T  # (2C, k) view: written in place
            work.moments(values, eps, out[:channels], out[channels:])
    return table


class _Work:
    """The float64 arrays of one block's sums, reused from block to block (no allocation per block)."""

    def __init__(self, channels: int, block: int, window: int) -> None:
        import torch  # its running sum is 4x numpy's along rows

        self.window = window
        self.d = np.empty((channels, block + window - 1))
        self.sums = np.zeros((channels, block + window))
        self.squares = np.zeros((channels, block + window))
        self.mean = np.empty((channels, block))
        self.var = np.empty((channels, block))
        self._cumsum = torch.cumsum
        self._tensor = torch.from_numpy

    def moments(self, values: np.ndarray, eps: float, mean_out: np.ndarray, inv_out: np.ndarray) -> None:
        """Mean and inverse std (``NaN``: not vouched for) of the ``k`` windows of a ``(C, k + L - 1)`` block,
        into ``(C, k)`` float32 ``mean_out`` and ``inv_out``."""
        window, length = self.window, values.shape[1]
        k = length - window + 1
        d, sums, squares = self.d[:, :length], self.sums[:, : length + 1], self.squares[:, : length + 1]
        cumsum, tensor = self._cumsum, self._tensor
        mean, var = self.mean[:, :k], self.var[:, :k]
        # Any shift works; one near the values keeps the sums small: the mean of every 64th value.
        shift = values[:, ::64].mean(axis=1, keepdims=True, dtype=np.float64)
        np.subtract(values, shift, out=d)
        cumsum(tensor(d), dim=1, out=tensor(sums[:, 1:]))
        np.square(d, out=d)
        cumsum(tensor(d), dim=1, out=tensor(squares[:, 1:]))
        total = squares[:, -1:]  # sum d^2
        scale = 1.0 / window
        np.subtract(sums[:, window:], sums[:, :k], out=mean)
        mean *= scale
        np.subtract(squares[:, window:], squares[:, :k], out=var)
        var *= scale
        var -= np.square(mean)
        # Rounding of a running sum of n terms: at most n * u * sum |terms| (sum |d| <= sqrt(n * total));
        # a window's sum is a difference of two, then scaled. With the block's rms (at least every
        # window's |mean| and rms) the bounds of a window's mean and variance are one number per
        # channel and block; a window is vouched for when its variance is above ``floor``, which holds
        # both under _TOL of its variance and std, and below what float32 can centre without overflow.
        gain = 2.0 * (length + 1) * _U * scale
        level = np.sqrt(total * scale)
        mean_err = gain * np.sqrt(length * total) + 3 * _U * level
        var_err = gain * total + 2.0 * level * mean_err + mean_err * mean_err + 16 * _U * level * level
        floor = np.maximum(var_err / _TOL, (mean_err / _TOL) ** 2)  # (C, 1)
        np.copyto(var, np.nan, where=~((var > floor) & (var < 1e76 * scale)))  # NaN propagates below
        np.add(mean, shift, out=mean_out)
        np.sqrt(var, out=var)
        np.maximum(var, eps, out=var)
        np.divide(1.0, var, out=inv_out)


def apply_table(x: np.ndarray, starts: np.ndarray, table: np.ndarray, channel_major: bool) -> np.ndarray:
    """Standardise ``x`` (float32 ``(B, C, L)`` when ``channel_major`` else ``(B, L, C)``, the windows at
    rows ``starts``) in place with ``table`` and return it; the rest by ``standardize_windows``."""
    return WindowTable(table, channel_major).apply(x, starts)


class WindowTable:
    """A pool's ``build_table`` and, per batch size, one array (and torch views) its statistics land in."""

    def __init__(self, table: np.ndarray, channel_major: bool) -> None:
        self.table = table
        self.channel_major = channel_major
        self.nbytes = table.nbytes
        self._scratch: dict[tuple[int, ...], tuple] = {}

    def apply(self, x: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Standardise ``x``, the windows at ``starts``, in place (see ``apply_table``)."""
        import torch

        from dask_windows.runtime.normalize import standardize_windows

        if not len(x):
            return x
        channels = self.table.shape[1] // 2
        scratch = self._scratch.get(x.shape)
        if scratch is None:
            scratch = self._scratch[x.shape] = self._views(x.shape, torch)
        stats, wide_stats, mean, scale = scratch
        np.take(self.table, starts, axis=0, out=stats)  # (B, 2C)
        redo = None
        if np.isnan(stats[:, channels:].sum()):  # some window is not vouched for (one sum when none is)
            redo = np.flatnonzero(np.isnan(stats[:, channels:]).any(axis=1))
            own = standardize_windows(np.ascontiguousarray(x[redo]), self.channel_major)
            stats[redo, :channels], stats[redo, channels:] = 0.0, 1.0  # left as they are, then replaced
        if self.channel_major:
            values = torch.from_numpy(x)
        else:  # rows of k * C values, the statistics tiled k times: a broadcast over C values is slow
            wide_stats[...] = stats.reshape(len(x), 2, 1, channels)  # each (mean, scale) k times
            values = torch.from_numpy(x).view(len(x), -1, wide_stats.shape[2] * channels)  # a view, or an error
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # two passes over a batch: a second thread's wake-ups cost more than it does
        try:
            values.sub_(mean).mul_(scale)
        finally:
            torch.set_num_threads(threads)
        if redo is not None:
            x[redo] = own
        return x

    def _views(self, shape: tuple[int, ...], torch: Any) -> tuple:
        """The lookup array of batches of ``shape`` and the torch views the two passes broadcast."""
        from dask_windows.runtime.normalize import _wide_rows

        channels = self.table.shape[1] // 2
        stats = np.empty((shape[0], 2 * channels), np.float32)
        if self.channel_major:
            both = torch.from_numpy(stats)
            return stats, None, both[:, :channels, None], both[:, channels:, None]  # (B, C, 1) views
        _wide, repeat = _wide_rows(np.empty(shape, np.float32))
        wide_stats = np.empty((shape[0], 2, repeat, channels), np.float32)  # (B, [mean, scale], k, C)
        tiled = torch.from_numpy(wide_stats).view(shape[0], 2, 1, repeat * channels)
        return stats, wide_stats, tiled[:, 0], tiled[:, 1]
