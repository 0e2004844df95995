"""Batches onto the training device one step ahead, and per-sample standardisation.

The trade-off of :class:`DevicePrefetcher`: on CUDA one more batch lives on
the device, and a batch the loader did not pin is pinned here, on the training
thread (``DataLoader(pin_memory=True)`` pins in the background instead).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

__all__ = ["DevicePrefetcher", "standardize"]

_END = object()  # the loader is exhausted


class DevicePrefetcher:
    """Iterates a loader's batches (tensors, or nested tuples, lists and dicts of them), moved to ``device``.

    On CUDA the next batch is pinned, copied on a side stream and transformed there while the caller
    works on the current one; the current stream waits for it and records its tensors, so they may
    be kept, freed or modified as usual. Elsewhere batches pass through ``.to(device)``.

    Args:
        loader: Any iterable of batches, typically a ``DataLoader``.
        device: Target device; ``None``: ``"cuda"`` when available, else ``"cpu"``.
        transform: Optional function of each batch once on the device, e.g. :func:`standardize`.

    Raises:
        ValueError: ``device`` is not a device, or is CUDA while CUDA is not available.
        TypeError: ``transform`` is not callable.
    """

    def __init__(
        self,
        loader: Iterable[Any],
        device: str | torch.device | int | None = None,
        *,
        transform: Callable[[Any], Any] | None = None,
    ) -> None:
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as error:
            raise ValueError(
                f"DevicePrefetcher: device={device!r} is not a torch device ({error}); "
                "pass e.g. 'cuda', 'cuda:1', 'cpu' or None to pick CUDA when available"
            ) from None
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                f"DevicePrefetcher: device={device!r} but CUDA is not available here; "
                "pass device='cpu' or device=None to fall back to the CPU"
            )
        if transform is not None and not callable(transform):
            raise TypeError(f"DevicePrefetcher: transform={transform!r} is not callable; pass a function or None")
        self.loader = loader
        self.transform = transform

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        if self.device.type == "cuda":
            return self._ahead_on_cuda()
        return self._passed_through()

    def _passed_through(self) -> Iterator[Any]:
        for batch in self.loader:
            batch = _map_tensors(batch, lambda tensor: tensor.to(self.device))
            yield batch if self.transform is None else self.transform(batch)

    def _ahead_on_cuda(self) -> Iterator[Any]:
        side = torch.cuda.Stream(device=self.device)
        batches = iter(self.loader)
        pending = self._send(next(batches, _END), side)
        while pending is not _END:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(side)
            # The tensors were allocated on the side stream; tell the allocator the current one uses them.
            _map_tensors(pending, lambda tensor: tensor.record_stream(current) if tensor.is_cuda else None)  # noqa: B023 (called at once)
            ready = pending
            pending = self._send(next(batches, _END), side)  # the copy overlaps the caller's work on `ready`
            yield ready

    def _send(self, batch: Any, side: torch.cuda.Stream) -> Any:
        if batch is _END:
            return _END
        with torch.cuda.stream(side):
            batch = _map_tensors(batch, lambda tensor: _pinned(tensor).to(self.device, non_blocking=True))
            if self.transform is not None:
                batch = self.transform(batch)
        return batch


def _pinned(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.device.type != "cpu" or tensor.is_pinned():
        return tensor
    return tensor.pin_memory()


def _map_tensors(batch: Any, function: Callable[[torch.Tensor], Any]) -> Any:
    """Applies ``function`` to every tensor in a nest of tuples, lists and dicts."""
    if isinstance(batch, torch.Tensor):
        return function(batch)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(_map_tensors(item, function) for item in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(_map_tensors(item, function) for item in batch)
    if isinstance(batch, Mapping):
        return {key: _map_tensors(value, function) for key, value in batch.items()}
    return batch


def standardize(
    x: torch.Tensor, dim: int = -1, eps: float = 1e-5, *, return_stats: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x - mean) / sqrt(var + eps)``, the mean and biased variance taken along ``dim``, the time
    axis (``-1`` for ``(B, C, L)``, ``1`` for ``(B, L, C)``); ``x`` is not modified. A tuple or list
    (a batch with targets) has its first element standardised, so this can be
    :class:`DevicePrefetcher`'s ``transform``.

    Args:
        eps: Added to the variance; keeps near-constant windows finite.
        return_stats: Return ``(z, mean, std)`` (``mean`` and ``std`` shaped
            like ``x`` with ``dim`` of size 1): ``x = z * std + mean``.

    Raises:
        TypeError: ``x`` is not a floating-point tensor.
        ValueError: ``eps`` is negative.
    """
    if isinstance(x, (tuple, list)) and x and not return_stats:
        first = standardize(x[0], dim, eps)
        if hasattr(x, "_fields"):  # a namedtuple
            return x._replace(**{x._fields[0]: first})  # type: ignore[union-attr]
        return type(x)([first, *x[1:]])  # type: ignore[return-value]
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        kind = f"a {x.dtype} tensor" if isinstance(x, torch.Tensor) else f"a {type(x).__name__}"
        raise TypeError(f"standardize: x is {kind}; it must be a floating-point tensor; convert it with x.float()")
    if not eps >= 0:
        raise ValueError(f"standardize: eps={eps!r} is negative; pass eps >= 0 (default 1e-5)")
    var, mean = torch.var_mean(x, dim=dim, correction=0, keepdim=True)
    std = var.add_(eps).sqrt_()
    z = (x - mean).div_(std)
    if return_stats:
        return z, mean, std
    return z
