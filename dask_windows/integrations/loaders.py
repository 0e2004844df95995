"""The DataLoader the integrations build around a ``WindowDataset``: whole batches (``batch_size=None``),
workers started by ``forkserver`` unless told otherwise (a process running threads can deadlock a forked
child) and so persistent by default, torchdata's ``StatefulDataLoader`` when installed (mid-epoch resume).
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
