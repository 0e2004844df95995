"""Rank / worker topology as a small frozen value; ``runtime.detect`` fills it in when not given."""

from __future__ import annotations

from dataclasses import dataclass

from dask_windows.errors import ConfigError

__all__ = ["World"]


@dataclass(frozen=True)
class World:
    """Who is reading: DataLoader ``worker`` of ``num_workers`` (1 in the main process) of ``rank``."""

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank={self.rank} must be in [0, world_size={self.world_size})")
        if self.num_workers < 1 or not 0 <= self.worker < self.num_workers:
            raise ConfigError(f"worker={self.worker} must be in [0, num_workers={self.num_workers})")
