"""One vectorised gather per batch, handed to torch without a copy.

A buffer's features are stored channel-major, ``(C, rows)`` float32, so that
every (window, channel) of an ``NCL`` batch is one contiguous run of memory:
a strided view ``(rows - L + 1, C, L)`` indexed by the batch's start rows
copies exactly the batch, once, into a fresh contiguous ``(B, C, L)`` array.
For ``NLC`` the buffer is row-major ``(rows, C)`` and the view is
``(rows - L + 1, L, C)``. No per-window Python work, no intermediate copies.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

__all__ = ["Gatherer", "normalize_per_sample"]


def _window_view(data: np.ndarray, window: int, channel_major: bool) -> np.ndarray:
    """Read-only view of every window start of ``data`` (no copy)."""
    if channel_major:
        channels, rows = data.shape
        s_c, s_r = data.strides
        count = max(rows - window + 1, 0)
        return as_strided(data, (count, channels, window), (s_r, s_c, s_r), writeable=False)
    rows, channels = data.shape
    s_r, s_c = data.strides
    count = max(rows - window + 1, 0)
    return as_strided(data, (count, window, channels), (s_r, s_r, s_c), writeable=False)


class Gatherer:
    """Gathers batches of windows from one buffer's arrays.

    Args:
        x: Features, ``(C, rows)`` for ``NCL`` or ``(rows, C)`` for ``NLC``.
        y: Targets ``(T, rows)``, or ``None``.
        window: Rows per window ``L``.
        horizon: ``0``: ``y`` at the last row, ``(B, T)``; ``H``: the next ``H`` rows, ``(B, T, H)``.
        layout: ``"NCL"`` or ``"NLC"``.
        mean: Optional ``(C,)`` subtracted from every feature value.
        std: Optional ``(C,)`` dividing every feature value after the mean.
    """

    def __init__(
        self,
        x: np.ndarray,
        y: np.ndarray | None,
        window: int,
        horizon: int,
        layout: str,
        mean: np.ndarray | None = None,
        std: np.ndarray | None = None,
    ) -> None:
        self.channel_major = layout == "NCL"
        self._x = _window_view(x, window, self.channel_major)
        self._y = y
        self._window = window
        self._horizon = horizon
        if horizon and y is not None:
            self._y_view = _window_view(y, horizon, channel_major=True)
        self._scale = None
        if mean is not None:
            shape = (1, -1, 1) if self.channel_major else (1, 1, -1)
            inv = 1.0 / np.asarray(std, np.float32)
            self._scale = (np.asarray(mean, np.float32).reshape(shape), inv.reshape(shape))

    def features(self, starts: np.ndarray) -> np.ndarray:
        """``(B, C, L)`` (or ``(B, L, C)``) float32, C-contiguous, for windows at ``starts``."""
        out = self._x[starts]
        if self._scale is not None:
            mean, inv = self._scale
            out -= mean
            out *= inv
        return out

    def targets(self, starts: np.ndarray) -> np.ndarray:
        """``(B, T)`` at each window's last row, or ``(B, T, H)`` for the ``H`` rows after it."""
        assert self._y is not None
        if self._horizon:
            return self._y_view[starts + self._window]
        return np.ascontiguousarray(self._y[:, starts + self._window - 1].T)


def normalize_per_sample(x: np.ndarray, channel_major: bool, eps: float = 1e-8) -> np.ndarray:
    """Standardise each window and channel in place: ``(x - mean) / std`` over its ``L`` values."""
    from dask_windows.normalize import standardize_windows

    return standardize_windows(x, channel_major, eps)
