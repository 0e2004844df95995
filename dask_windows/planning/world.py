"""Rank / worker topology as a small frozen value, and where it comes from.

``World`` is what the plan divides work by. ``detect()`` reads it from
``torch.distributed`` and the DataLoader worker context; constructors accept
explicit values and only fall back to detection.
"""

from __future__ import annotations

from dataclasses import dataclass

from dask_windows.errors import ConfigError

__all__ = ["World", "detect_ranks", "detect_worker", "resolve_ranks"]


@dataclass(frozen=True)
class World:
    """Who is reading: one DataLoader worker of one rank.

    Attributes:
        rank: This process's rank in ``[0, world_size)``.
        world_size: Number of ranks.
        worker: This DataLoader worker's id in ``[0, num_workers)``.
        num_workers: DataLoader workers per rank (1 when iterating in the main process).
    """

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank={self.rank} must be in [0, world_size={self.world_size})")
        if self.num_workers < 1 or not 0 <= self.worker < self.num_workers:
            raise ConfigError(f"worker={self.worker} must be in [0, num_workers={self.num_workers})")


def detect_ranks() -> tuple[int, int] | None:
    """``(rank, world_size)`` from an initialised ``torch.distributed``, else ``None``."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch without distributed support
        return None
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def detect_worker() -> tuple[int, int]:
    """``(worker, num_workers)`` of the current DataLoader worker, ``(0, 1)`` outside one."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    if info is None:
        return 0, 1
    return info.id, info.num_workers


def resolve_ranks(explicit: tuple[int | None, int | None], known: tuple[int, int] = (0, 1)) -> tuple[int, int]:
    """``(rank, world_size)``: the explicit values, else an initialised ``torch.distributed``'s, else ``known``.

    Args:
        explicit: ``(rank, world_size)`` as the user passed them (``None``: not given).
        known: The ranks resolved earlier (a pickled copy in a spawned worker cannot detect them).

    Raises:
        ConfigError: the result is not a valid topology.
    """
    rank, world_size = explicit
    detected = detect_ranks() or known
    rank = detected[0] if rank is None else rank
    world_size = detected[1] if world_size is None else world_size
    World(rank, world_size)  # validates
    return rank, world_size
