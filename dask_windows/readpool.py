"""Reading and decoding in worker processes while this process gathers batches.

``ReadPool(read, keys, num_workers, depth)`` is a drop-in for ``Prefetcher``
(iterate the results of ``read(key)`` in key order, ``close()``) that runs
``read`` in ``num_workers`` processes. Each result travels back once, as
tensors in shared memory (torch's own tensor sharing: a segment is unlinked
as soon as both sides hold it, so nothing outlives a crash), and the batches
are then gathered here from those arrays.

Why not the usual ``DataLoader(ds, num_workers=W)``: there every worker
gathers its own batches and torch copies each batch into a new shared-memory
segment and passes its file descriptor, per batch. For windows, where the
gather is a memcpy-speed operation, that per-batch hand-off costs more than
the gather itself (0.15M windows/s with workers against 1M without, B=256
L=512 C=4). Handing over one decoded partition instead (tens of MB, once)
amortises the hand-off, and the workers take what is worth moving off this
process: reading, decompressing, decoding, checking.

The trade-off: the gather stays on one core of this process, so the pool
helps when reading/decoding is the bottleneck (zstd files, object stores,
many columns), not at stride 1 from the page cache, where the gather
dominates and ``num_workers=0`` is as fast. Workers start with
``multiprocessing_context`` (``"forkserver"`` by default: forking a process
that already runs pyarrow or fsspec threads can deadlock), whose server
process imports torch, pyarrow and the loader once; later pools fork from it
in milliseconds.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

__all__ = ["ReadPool"]

_MIN_SHARED_BYTES = 1 << 16  # smaller arrays are pickled inline
_PRELOAD = ["numpy", "pyarrow.parquet", "torch", "dask_windows.dataset"]


def _to_shared(value: Any) -> Any:
    """Replace large numpy arrays in ``value`` (a dataclass, tuple, list or dict) with tensors."""
    if isinstance(value, np.ndarray):
        if value.nbytes >= _MIN_SHARED_BYTES and value.dtype.kind in "biuf" and value.dtype.isnative:
            return _Shared(torch.from_numpy(np.ascontiguousarray(value)), value.shape)
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _to_shared(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return _Packed(type(value), fields)
    if isinstance(value, (tuple, list)):
        return type(value)(_to_shared(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_shared(v) for k, v in value.items()}
    return value


def _from_shared(value: Any) -> Any:
    """Undo ``_to_shared``: numpy views of the received tensors (no copy)."""
    if isinstance(value, _Shared):
        return value.tensor.numpy().reshape(value.shape)
    if isinstance(value, _Packed):
        return value.cls(**{k: _from_shared(v) for k, v in value.fields.items()})
    if isinstance(value, (tuple, list)):
        return type(value)(_from_shared(v) for v in value)
    if isinstance(value, dict):
        return {k: _from_shared(v) for k, v in value.items()}
    return value


@dataclasses.dataclass
class _Shared:
    """A numpy array travelling as a tensor (torch shares its storage, not its bytes)."""

    tensor: torch.Tensor
    shape: tuple


@dataclasses.dataclass
class _Packed:
    """A dataclass instance whose fields travel separately (so tensors inside are shared)."""

    cls: type
    fields: dict


class _Keys(Dataset):
    """``read(keys[i])`` as a map-style dataset, results packed for sharing."""

    def __init__(self, read: Callable[[Any], Any], keys: Sequence[Any]) -> None:
        self.read = read
        self.keys = list(keys)

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> Any:
        try:
            return _to_shared(self.read(self.keys[i]))
        except Exception as exc:  # re-raised as itself in the consumer, not as torch's wrapper
            return _Raised(exc)


@dataclasses.dataclass
class _Raised:
    """An exception of ``read``, carried back so the consumer sees its own type and message."""

    exc: Exception


def _identity(item: Any) -> Any:
    return item


class ReadPool:
    """Iterate ``read(key)`` for ``keys`` in order, computed in worker processes.

    Args:
        read: A picklable callable (it is sent to every worker once).
        keys: What to read, in order.
        num_workers: Worker processes (>= 1).
        depth: Results read ahead of the consumer in all, at least one per worker.
        multiprocessing_context: How workers start (``"forkserver"``, ``"spawn"`` or ``"fork"``).
        timeout: Seconds to wait for one result before raising (0: no limit).
    """

    def __init__(
        self,
        read: Callable[[Any], Any],
        keys: Sequence[Any],
        num_workers: int,
        depth: int = 2,
        multiprocessing_context: str | None = "forkserver",
        timeout: float = 0,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers={num_workers} must be >= 1 for a ReadPool; use Prefetcher for 0")
        self._keys = list(keys)
        workers = max(1, min(num_workers, len(self._keys)))
        context = multiprocessing.get_context(multiprocessing_context)
        if multiprocessing_context == "forkserver":
            # The server imports these once; every later worker is forked from it ready to read.
            context.set_forkserver_preload(_PRELOAD)
        self._loader = DataLoader(
            _Keys(read, self._keys),
            batch_size=None,
            num_workers=workers,
            collate_fn=_identity,
            prefetch_factor=max(1, -(-max(depth, workers) // workers)),
            multiprocessing_context=context,
            timeout=timeout,
        )
        self._it: Iterator[Any] | None = iter(self._loader) if self._keys else None
        self._taken = 0

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._it is None or self._taken >= len(self._keys):
            self.close()
            raise StopIteration
        try:
            item = next(self._it)
        except BaseException:
            self.close()
            raise
        self._taken += 1
        if isinstance(item, _Raised):
            self.close()
            raise item.exc
        return _from_shared(item)

    def close(self) -> None:
        """Stop the workers (idempotent); results not yet taken are dropped."""
        it, self._it = self._it, None
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    @property
    def alive(self) -> bool:
        """Whether worker processes are running."""
        it = self._it
        return it is not None and any(w.is_alive() for w in getattr(it, "_workers", ()))

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass
