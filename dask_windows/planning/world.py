"""Rank / worker topology as a small frozen value.

``World`` is what the plan divides work by. Where its parts come from when
the user does not pass them (``torch.distributed``, the DataLoader worker
context) is ``runtime.detect``'s business, not the plan's.
"""

from __future__ import annotations

from dataclasses import dataclass

from dask_windows.errors import ConfigError

__all__ = ["World"]


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
