"""One vectorised gather per batch, handed to torch without a copy.

Features are stored channel-major ``(C, rows)`` float32 (``NLC``: ``(rows, C)``), so every (window,
channel) of a batch is one contiguous run. numpy's fancy indexing of a 2-D view of every run (``_Runs``)
gathers a batch; a run of full batches may be split over two threads (``speedups.lanes``); into a
DataLoader worker's shared slot (``speedups.slots``) ``torch.index_select`` copies straight in.
A pooled array is reused only when nothing but the pool references it (a tensor, its views and storage
keep the ndarray alive), so a batch the caller holds is never overwritten.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Generator, Iterator
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from dask_windows.settings.tuning import LANE_RATIO as _LANE_RATIO

__all__ = ["Gatherer", "OutputPool", "normalize_per_sample"]


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


_RUN_INDEX = 8192  # runs indexed per chunk of a run of batches (``_Runs.batches``: 64 KiB of int64)


class _Runs:
    """numpy's gather of whole runs: one contiguous source run per output row.

    ``data``: features, C-contiguous ``(C, rows)`` (``channel_major``: batches ``(B, C, L)``) or ``(rows, C)``
    (``(B, L, C)``), ``rows >= window``. Each copy is one contiguous step, cheaper than indexing the
    ``(windows, C, L)`` view; the values are the same bits.
    """

    def __init__(self, data: np.ndarray, window: int, channel_major: bool) -> None:
        self.channel_major, self.window = channel_major, window
        item = data.itemsize
        if channel_major:
            self.channels, rows = data.shape
            flat = data.reshape(-1)
            # (C * rows - L + 1, L): the run of L values from every flat position
            self.runs = as_strided(flat, (flat.size - window + 1, window), (item, item), writeable=False)
            self.offsets = np.arange(self.channels, dtype=np.int64) * rows  # (C,) flat position of row 0
        else:
            rows, self.channels = data.shape
            # (rows - L + 1, L * C): the window starting at every row, flattened
            shape = (rows - window + 1, window * self.channels)
            self.runs = as_strided(data, shape, (data.strides[0], item), writeable=False)
            self.offsets = None

    def __call__(self, starts: np.ndarray) -> np.ndarray:
        """The batch of windows at ``starts``: a fresh C-contiguous array."""
        if self.offsets is None:
            return self.runs[starts].reshape(len(starts), self.window, self.channels)
        # (B, C) -> (B * C,): flat position of each window's run of each channel
        index = (np.asarray(starts)[:, None] + self.offsets).reshape(-1)
        return self.runs[index].reshape(len(index) // self.channels, self.channels, self.window)

    def batches(self, run: np.ndarray, size: int) -> Iterator[np.ndarray]:
        """``self(run[a : a + size])`` for each batch of ``run`` (``len(run)`` a multiple of ``size``), the
        runs' flat positions computed for many batches at once."""
        per = max(1, _RUN_INDEX // (size * self.channels)) * size  # windows per chunk of the index
        shape = (size, self.channels, self.window) if self.offsets is not None else (size, self.window, self.channels)
        runs = self.runs
        for lo in range(0, len(run), per):
            if self.offsets is None:
                index = run[lo : lo + per].reshape(-1, size)  # (batches, B)
            else:
                # (windows, C) -> (batches, B * C): each batch's runs, channel by channel per window
                index = (run[lo : lo + per, None] + self.offsets).reshape(-1, size * self.channels)
            for row in index:
                yield runs[row].reshape(shape)


def _run_gather(data: np.ndarray, window: int, channel_major: bool) -> _Runs | None:
    """``_Runs`` over ``data``, or ``None`` where it cannot view it (not one C-contiguous array, too short)."""
    if not (data.flags.c_contiguous and data.size and data.ndim == 2):
        return None
    if data.shape[1 if channel_major else 0] < window:
        return None
    return _Runs(data, window, channel_major)


def _refs(arrays: list[np.ndarray], i: int) -> int:
    """References to ``arrays[i]`` as counted here (compared with the pool's calibration)."""
    return sys.getrefcount(arrays[i])


class OutputPool:
    """A few output arrays, reused once nothing but the pool references them.

    Args:
        capacity: Arrays kept per shape and dtype; when all are in use a fresh one is returned.
    """

    def __init__(self, capacity: int = 3) -> None:
        self.capacity = capacity
        self.lanes: Any = None  # a stream's ``lanes.LaneChoice``, made by its first run on two lanes
        self._arrays: dict[tuple, list[np.ndarray]] = {}
        probe = [np.empty(1, np.float32)]
        self._idle = _refs(probe, 0)  # the count of an array held by a list only, in this interpreter

    def take(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An array of ``shape`` and ``dtype`` that no caller references (contents undefined)."""
        key = (tuple(shape), np.dtype(dtype).str)
        arrays = self._arrays.setdefault(key, [])
        for i in range(len(arrays)):
            if _refs(arrays, i) <= self._idle:
                return arrays[i]
        out = np.empty(shape, dtype)
        if len(arrays) < self.capacity:
            arrays.append(out)
        return out


class Gatherer:
    """Gathers batches of windows from one buffer's arrays.

    ``x``: features, ``(C, rows)`` for ``layout="NCL"``, ``(rows, C)`` for ``"NLC"``; ``y``: targets ``(T, rows)``
    or ``None``, batched at each window's last row (``horizon=0``: ``(B, T)``) or over the ``H`` rows after
    it (``(B, T, H)``); ``mean``, ``std``: optional ``(C,)`` scaling of every feature value; ``codes``:
    optional ``(K, rows)`` integer copy of the last ``K`` channels of ``x`` (``NCL``,
    ``WindowSpec.code_features``): features are then the first ``C - K`` channels, codes from :meth:`codes_at`.
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
        codes: np.ndarray | None = None,
    ) -> None:
        self.channel_major = layout == "NCL"
        self.source = x  # the buffer's features as given, (C, rows) or (rows, C)
        self.codes = codes  # (K, rows) int64 or None
        self._codes: Any = None  # numpy's gather of the codes' runs, made on first use
        if codes is not None:
            if not self.channel_major:
                raise ValueError("integer code channels need the NCL layout")
            x = x[: len(x) - len(codes)]  # (C - K, rows): the channels gathered as float32
        self._x = _window_view(x, window, self.channel_major)
        self._numpy = _run_gather(x, window, self.channel_major) or self._x.__getitem__
        self._source = x
        self._runs: Any = None  # torch view of every run a batch copies, made on first use
        self._y = y
        self.target_source = y  # the buffer's targets as given, (T, rows) or None
        self._window = window
        self._horizon = horizon
        if horizon and y is not None:
            self._y_view = _window_view(y, horizon, channel_major=True)
            # one run of H values per target and window (``_Runs``: 40% less than indexing the strided view)
            self._y_runs = _run_gather(y, horizon, True) or self._y_view.__getitem__
        self._scale = None
        if mean is not None:
            shape = (1, -1, 1) if self.channel_major else (1, 1, -1)
            inv = 1.0 / np.asarray(std, np.float32)
            self._scale = (np.asarray(mean, np.float32).reshape(shape), inv.reshape(shape))

    def gather_for(self, size: int, pool: OutputPool | None) -> Callable[[np.ndarray], np.ndarray]:
        """The gather of full batches of ``size`` windows, chosen once for a run of them: what
        :meth:`features` returns, as numpy's gather itself where there is no scaling nor slots."""
        if self._scale is None and getattr(pool, "direct_bytes", None) is None:  # no scaling, no slots
            return self._numpy
        return lambda starts: self.features(starts, pool)

    def gather_run(self, run: np.ndarray, size: int, pool: OutputPool | None) -> Generator[np.ndarray, None, None]:
        """What ``gather_for(size, pool)`` gives for each batch of ``run``, ``len(run)`` a multiple of
        ``size``; on two lanes where ``lanes`` allows (the same batches, in order)."""
        from dask_windows.speedups import lanes

        choice = self._lanes(run, size, pool, made=False)
        if choice is not None:
            yield from lanes.lane_batches(
                self._numpy, run, size, choice, alone=lambda part: self._alone(part, size, pool)
            )
            return
        yield from self._alone(run, size, pool)

    def made_run(
        self, run: np.ndarray, size: int, pool: OutputPool | None, make: Callable[[np.ndarray], Any]
    ) -> Iterator[Any]:
        """``make(starts)`` for each batch of ``run`` in order, ``len(run)`` a multiple of ``size``; ``make``
        (a batch's gathers) runs on both lanes where ``lanes`` allows (``lanes.made_batches``)."""
        from dask_windows.speedups import lanes

        choice = self._lanes(run, size, pool, made=True)
        if choice is not None:
            return lanes.made_batches(make, self._numpy, run, size, choice)
        return (make(run[a : a + size]) for a in range(0, len(run), size))

    def _lanes(self, run: np.ndarray, size: int, pool: OutputPool | None, made: bool) -> Any:
        """The stream's ``lanes.LaneChoice`` where a run of ``size`` batches may go on two lanes, else ``None``
        (``made``: batches of several arrays, ``made_run``'s; else features alone)."""
        from dask_windows.speedups import lanes

        plain = self._scale is None and getattr(pool, "direct_bytes", None) is None  # no scaling, no slots
        rows = self._source.shape[1 if self.channel_major else 0]
        dense = len(run) * self._window >= _LANE_RATIO * rows  # stride near the window: the readers need the core
        if not (plain and dense and isinstance(self._numpy, _Runs) and lanes.worth(self._numpy, len(run), size, made)):
            return None
        choice = getattr(pool, "lanes", None)
        if choice is None:
            choice = lanes.LaneChoice()
            if pool is not None:
                pool.lanes = choice  # kept by the stream's pool: one choice for its runs
        return choice

    def _alone(self, run: np.ndarray, size: int, pool: OutputPool | None) -> Iterator[np.ndarray]:
        """``gather_run`` without lanes: numpy's run gather, or batch by batch with scaling or slots."""
        gather = self.gather_for(size, pool)
        if isinstance(gather, _Runs):
            yield from gather.batches(run, size)
            return
        for a in range(0, len(run), size):
            yield gather(run[a : a + size])

    def features(self, starts: np.ndarray, pool: OutputPool | None = None) -> np.ndarray:
        """``(B, C, L)`` (or ``(B, L, C)``) float32, C-contiguous, for windows at buffer rows ``starts``;
        gathered into a slot pool's array (``pool.direct_bytes``), else a new array."""
        shape = (len(starts), *self._x.shape[1:])
        nbytes = math.prod(shape) * self._x.itemsize
        direct = getattr(pool, "direct_bytes", None)  # a pool of shared slots: gather into it from this size
        if pool is not None and direct is not None and nbytes >= direct and len(starts) and self._torch_ready():
            out = pool.take(shape, self._x.dtype)  # a DataLoader worker's slot: no copy after this one
            self._torch_gather(starts, out)
        else:
            out = self._numpy(starts)
        if self._scale is not None:
            mean, inv = self._scale
            out -= mean
            out *= inv
        return out

    def codes_at(self, starts: np.ndarray) -> np.ndarray:
        """``(B, K, L)`` of the codes' dtype, C-contiguous: the codes of the windows at ``starts`` (a fresh array)."""
        if self._codes is None:
            assert self.codes is not None
            self._codes = (
                _run_gather(self.codes, self._window, True) or _window_view(self.codes, self._window, True).__getitem__
            )
        return self._codes(starts)

    def targets(self, starts: np.ndarray) -> np.ndarray:
        """``(B, T)`` at each window's last row, or ``(B, T, H)`` for the ``H`` rows after it."""
        assert self._y is not None
        if self._horizon:
            return self._y_runs(starts + self._window)
        return np.ascontiguousarray(self._y[:, starts + self._window - 1].T)

    def _torch_ready(self) -> bool:
        """Build the torch view of the buffer's runs once; ``False`` where torch cannot view it."""
        if self._runs is None:
            x = self._source
            if not (x.flags.c_contiguous and x.flags.writeable and len(self._x) and x.size and x.dtype == np.float32):
                self._runs = False
                return False
            import torch  # only here: `import dask_windows` does not import torch

            flat = torch.from_numpy(x).view(-1)
            if self.channel_major:
                # (C * rows - L + 1, L): the run of L values from every flat position
                self._runs = torch.as_strided(flat, (flat.numel() - self._window + 1, self._window), (1, 1))
            else:
                channels = x.shape[1]
                # (rows - L + 1, L * C): the window starting at every row, flattened
                self._runs = torch.as_strided(flat, (len(self._x), self._window * channels), (channels, 1))
        return self._runs is not False

    def _torch_gather(self, starts: np.ndarray, out: np.ndarray) -> None:
        import torch

        if self.channel_major:
            channels, rows = self._source.shape
            # (B, C) -> (B * C,): flat position of each window's run of each channel
            index = (np.asarray(starts, np.int64)[:, None] + np.arange(channels, dtype=np.int64) * rows).reshape(-1)
            target = torch.from_numpy(out).view(len(index), self._window)
        else:
            index = np.ascontiguousarray(starts, np.int64)
            target = torch.from_numpy(out).view(len(index), self._runs.shape[1])
        torch.index_select(self._runs, 0, torch.from_numpy(index), out=target)


def normalize_per_sample(x: np.ndarray, channel_major: bool, eps: float = 1e-8) -> np.ndarray:
    """Standardise each window and channel in place: ``(x - mean) / std`` over its ``L`` values."""
    from dask_windows.runtime.normalize import standardize_windows

    return standardize_windows(x, channel_major, eps)
