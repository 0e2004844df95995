"""The DataLoader the integrations build around a ``WindowDataset``.

The dataset yields whole batches, so the loader has ``batch_size=None``. With workers it starts
them by ``forkserver`` unless told otherwise: a training process that already runs threads (a
``torch.distributed`` process group, CUDA, the dataset's own prefetch thread) can deadlock a
forked child that inherits a lock held by one of them; forkserver forks from a clean
single-threaded server instead, at the price of importing the training script's modules
(torch, the framework) in every worker it starts: seconds per worker. So workers are persistent
by default (``persistent_workers=True``): started once per loader, not once per epoch; the
dataset's epoch still advances in them on each pass. Fork is safe when nothing in the training
process has started threads before the workers are forked (no ``torch.distributed`` process
group, CUDA not initialised, no other loader's pin-memory thread alive); it is then the
fastest to start.

With torchdata installed the loader is its ``StatefulDataLoader``, so a framework that saves the
loader's ``state_dict()`` in its checkpoints (Lightning does) resumes mid-epoch exactly.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

__all__ = ["window_loader"]


def _stateful_class(stateful: bool | None) -> Any:
    if stateful is False:
        return DataLoader
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError as exc:
        if stateful:
            raise ImportError("stateful=True needs torchdata's StatefulDataLoader: pip install torchdata") from exc
        return DataLoader
    return StatefulDataLoader


def window_loader(
    dataset: Any,
    num_workers: int = 0,
    *,
    stateful: bool | None = None,
    multiprocessing_context: Any = None,
    **kwargs: Any,
) -> DataLoader:
    """A DataLoader over ``dataset`` (``batch_size=None``), stateful when torchdata is installed.

    Args:
        dataset: A ``WindowDataset``.
        num_workers: DataLoader worker processes (0: read in this process, on the prefetch thread).
        stateful: ``True``: torchdata's ``StatefulDataLoader`` (required); ``False``: torch's
            ``DataLoader``; ``None``: the stateful one when torchdata is installed.
        multiprocessing_context: How workers start; default ``"forkserver"`` when ``num_workers > 0``.
        **kwargs: Other ``DataLoader`` arguments (``pin_memory``, ...); ``persistent_workers``
            defaults to ``True`` when ``num_workers > 0``.
    """
    if kwargs.get("batch_size") is not None:
        raise ValueError("a WindowDataset yields whole batches: set batch_size on the dataset, not the loader")
    kwargs.pop("batch_size", None)
    if num_workers > 0:
        kwargs["multiprocessing_context"] = multiprocessing_context or "forkserver"
        kwargs.setdefault("persistent_workers", True)
    cls = _stateful_class(stateful)
    return cls(dataset, batch_size=None, num_workers=num_workers, **kwargs)
