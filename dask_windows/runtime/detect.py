"""Who is reading: this process's rank and DataLoader worker, asked of torch here and nowhere else
(an import-rule test holds ``get_worker_info`` and ``torch.distributed`` to this file)."""

from __future__ import annotations

from typing import Any

from dask_windows.planning.world import World

__all__ = [
    "all_gather",
    "detect_ranks",
    "detect_worker",
    "in_worker",
    "process_group_store",
    "resolve_ranks",
    "worker_info",
]


def worker_info() -> Any:
    """torch's ``WorkerInfo`` of the current DataLoader worker (``id``, ``num_workers``, ``seed``), else ``None``."""
    from torch.utils.data import get_worker_info

    return get_worker_info()


def in_worker() -> bool:
    """Whether this code runs in a DataLoader worker process."""
    return worker_info() is not None


def detect_worker() -> tuple[int, int]:
    """``(worker, num_workers)`` of the current DataLoader worker, ``(0, 1)`` outside one."""
    info = worker_info()
    if info is None:
        return 0, 1
    return info.id, info.num_workers


def detect_ranks() -> tuple[int, int] | None:
    """``(rank, world_size)`` from an initialised ``torch.distributed``, else ``None``."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch without distributed support
        return None
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def resolve_ranks(explicit: tuple[int | None, int | None], known: tuple[int, int] = (0, 1)) -> tuple[int, int]:
    """``(rank, world_size)``: the ``explicit`` values, else an initialised ``torch.distributed``'s, else
    ``known`` (resolved earlier: a spawned worker's copy cannot detect them); ``ConfigError`` if invalid."""
    rank, world_size = explicit
    detected = detect_ranks() or known
    rank = detected[0] if rank is None else rank
    world_size = detected[1] if world_size is None else world_size
    World(rank, world_size)  # validates
    return rank, world_size


def process_group_store() -> tuple[Any, int] | None:
    """``(key-value store, world size)`` of an initialised ``torch.distributed`` of more than one rank, else
    ``None`` (footers shared between ranks: ``sources.parquet.footer_share``)."""
    ranks = detect_ranks()
    if ranks is None or ranks[1] <= 1:
        return None
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store(), ranks[1]
    except Exception:  # no default store (a custom group), or a torch without it
        return None


def all_gather(obj: Any) -> list | None:
    """Every rank's ``obj`` (``all_gather_object``, a collective) under an initialised ``torch.distributed``
    of more than one rank, else ``None``."""
    ranks = detect_ranks()
    if ranks is None or ranks[1] <= 1:
        return None
    import torch.distributed as dist

    everyone: list = [None] * ranks[1]
    dist.all_gather_object(everyone, obj)
    return everyone
