"""A pool's decoded rows on the training device, and batches gathered from them by index.

Features are ``(C, rows)`` (``NCL``) or ``(rows, C)`` (``NLC``) float32,
targets ``(T, rows)``. A batch is a ``(B,)`` vector of rows (the windows'
starts): the gather is one ``index_select`` over a strided view whose row
``s`` is the run of ``L`` rows starting at ``s`` (no copy), so the values are
the host gather's bits on any device.
"""

from __future__ import annotations

import torch

__all__ = ["DeviceRows", "standardize_windows"]


class DeviceRows:
    """A pool's rows on the device and the gathers of its batches.

    Args:
        x: Features ``(C, rows)`` when ``channel_major`` else ``(rows, C)``, float32, on the device.
        y: Targets ``(T, rows)`` on the device, or ``None``.
        horizon: ``0``: ``y`` at each window's last row, ``(B, T)``; ``H``: the next ``H`` rows, ``(B, T, H)``.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor | None, window: int, horizon: int, channel_major: bool) -> None:
        self.x, self.y, self.window, self.horizon, self.channel_major = x, y, window, horizon, channel_major
        self.nbytes = x.numel() * x.element_size() + (0 if y is None else y.numel() * y.element_size())
        flat = x.reshape(-1)
        if channel_major:
            channels, rows = x.shape
            # (C * rows - L + 1, L): the run of L values from every flat position
            self._runs = flat.as_strided((max(flat.numel() - window + 1, 0), window), (1, 1))
            self._offsets: torch.Tensor | None = None  # (C,) flat position of each channel's row 0, made by ready()
            self._rows = rows
        else:
            rows, channels = x.shape
            # (rows - L + 1, L * C): the window starting at every row, flattened
            self._runs = flat.as_strided((max(rows - window + 1, 0), window * channels), (channels, 1))
            self._offsets = None
        self._channels = channels

    def ready(self) -> None:
        """Before the first gather, on the consumer's thread (and its stream, as the gathers)."""
        if self.channel_major and self._offsets is None:
            self._offsets = torch.arange(self._channels, device=self.x.device, dtype=torch.int64) * self._rows

    def features(self, starts: torch.Tensor) -> torch.Tensor:
        """``(B, C, L)`` (or ``(B, L, C)``) of the windows starting at buffer rows ``starts`` (int64, on the device)."""
        if not self.channel_major:
            return self._runs.index_select(0, starts).view(len(starts), self.window, self._channels)
        assert self._offsets is not None  # made by ready()
        index = (starts[:, None] + self._offsets).reshape(-1)  # (B, C) -> (B * C,): each window's run per channel
        return self._runs.index_select(0, index).view(len(starts), self._channels, self.window)

    def targets(self, starts: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` at each window's last row, or ``(B, T, H)`` for the ``H`` rows after it."""
        assert self.y is not None  # asked for only when the dataset has targets
        if not self.horizon:
            return self.y.index_select(1, starts + (self.window - 1)).T.contiguous()
        runs = self.y.unfold(1, self.horizon, 1)  # (T, rows - H + 1, H): the H rows from every row
        return runs.index_select(1, starts + self.window).permute(1, 0, 2).contiguous()


def standardize_windows(x: torch.Tensor, channel_major: bool, eps: float = 1e-8) -> torch.Tensor:
    """Standardise each window and channel of a batch in place: ``(x - mean) / max(std, eps)`` over its
    ``L`` values, as ``normalize="sample"`` on the host (within float32 rounding, not bit for bit)."""
    if not x.numel():
        return x
    var, mean = torch.var_mean(x, dim=2 if channel_major else 1, correction=0, keepdim=True)
    return x.sub_(mean).div_(var.sqrt_().clamp_min_(eps))
