"""The named seams a pass runs through, and their plain implementations.

Each seam is a value in ``values.PassValues`` that only the dataset wires: the **allocator** makes
the arrays a pass gathers features into (``NumpyAllocator``; ``speedups.slots.SlotAllocator`` in a
worker); the **batch output** makes the batch from ``(x, y, rows)`` (``TorchOutput``, the default, no
copy; ``NumpyOutput``; ``PinnedOutput``; a workflow's ``Emitter``). Whatever the seams, a pass yields
the same windows in the same order with the same values (``tests/runtime/test_contract.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from dask_windows.errors import ConfigError
from dask_windows.runtime.batch import OutputPool

__all__ = ["NumpyAllocator", "NumpyOutput", "PinnedOutput", "TorchOutput"]


@dataclass(frozen=True)
class NumpyAllocator:
    """The allocator seam's default: a ``batch.OutputPool`` of plain numpy arrays per pass."""

    def __call__(self) -> OutputPool:
        return OutputPool()


def _tuple(x: Any, y: Any, rows: Any, return_index: bool, wrap: Any) -> Any:
    if y is None and rows is None:  # features only: the common case, one call per batch
        return wrap(x)
    out = [wrap(x)]
    if y is not None:
        out.append(wrap(y))
    if return_index:
        out.append(wrap(np.ascontiguousarray(rows, dtype=np.int64)))
    return out[0] if len(out) == 1 else tuple(out)


@dataclass(frozen=True)
class TorchOutput:
    """Batches as tensors over the gathered arrays (``torch.from_numpy``: no copy).

    Attributes:
        return_index: Also yield each window's dataset start row, int64 ``(B,)``.
    """

    return_index: bool = False

    def emit(self, x: np.ndarray, y: np.ndarray | None, rows: np.ndarray | None) -> Any:
        """``x`` (features only), else the tuple ``(x, y, rows)`` of what there is, as tensors."""
        if y is None and rows is None:  # features only: one call per batch (no helper: it is per batch)
            return torch.from_numpy(x)
        return _tuple(x, y, rows, self.return_index, torch.from_numpy)

    __call__ = emit


@dataclass(frozen=True)
class NumpyOutput:
    """Batches as the gathered numpy arrays themselves (no torch); shapes and order as ``TorchOutput``'s."""

    return_index: bool = False

    def emit(self, x: np.ndarray, y: np.ndarray | None, rows: np.ndarray | None) -> Any:
        """``x``, else the tuple of what there is."""
        return _tuple(x, y, rows, self.return_index, lambda a: a)

    __call__ = emit


@dataclass(frozen=True)
class PinnedOutput:
    """Batches as tensors in pinned (page-locked) host memory: ``.to("cuda", non_blocking=True)`` then
    overlaps compute. One copy per batch; needs CUDA (refused at construction without it)."""

    return_index: bool = False
    copies: ClassVar[bool] = True  # timed as the telemetry's ``device copy`` stage (``telemetry.timed_output``)

    def __post_init__(self) -> None:
        if not torch.cuda.is_available():
            raise ConfigError(
                "PinnedOutput needs CUDA (pinned memory is page-locked for a CUDA copy) and torch sees none; "
                "use TorchOutput, or dw.DevicePrefetcher on a machine with a GPU"
            )

    def emit(self, x: np.ndarray, y: np.ndarray | None, rows: np.ndarray | None) -> Any:
        """The tuple of ``TorchOutput``, each tensor copied into pinned memory."""
        return _tuple(x, y, rows, self.return_index, lambda a: torch.from_numpy(a).pin_memory())

    __call__ = emit
