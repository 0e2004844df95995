"""Elastic resume: the rest of an epoch re-divided between another number of ranks and workers.

A loader-scope state says how many batches each old reader yielded. The rest is a list of *pieces*
``(rank, worker, lo, hi)`` of old readers' streams, laid end to end and divided by the new topology as
``division`` divides an epoch (balanced shares): every window not yet yielded is yielded exactly once,
and a state saved meanwhile records the pieces. Trade-off: the rest's order is not an uninterrupted
run's; a tiny rest that cannot fill equal batch counts leaves out ``rest % world_size`` windows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dask_windows.planning.division import ReaderShare, reader_share
from dask_windows.planning.world import World

__all__ = [
    "Share",
    "batches_of_rest",
    "divide",
    "is_elastic",
    "rest_from_state",
    "rest_of_epoch",
]

log = logging.getLogger(__name__)

Piece = tuple[int, int, int, int]  # (old rank, old worker, lo, hi) of that old reader's stream


@dataclass(frozen=True)
class Share:
    """What one new reader yields of the rest of an epoch: ``pieces`` in reading order, ``sizes`` of batches."""

    pieces: tuple[Piece, ...]
    sizes: tuple[int, ...]


def _rest_share(total: int, world: World, batch_size: int) -> ReaderShare:
    """``world``'s part of ``total`` rest windows: balanced shares (``division``), a left-out remainder warned."""
    share = reader_share(total, world, batch_size, balanced=True)
    if share.left_out:  # too few windows for equal batch counts with the remainder given out
        log.warning(
            "elastic resume: %d windows of the rest of the epoch cannot be divided into equal batch counts over "
            "%d ranks and are left out", share.left_out, world.world_size,
        )  # fmt: skip
    return share


def divide(pieces: Sequence[Piece], world: World, batch_size: int) -> Share:
    """The part of the rest sequence ``pieces`` that new reader ``world`` yields."""
    lengths = np.array([hi - lo for _, _, lo, hi in pieces], dtype=np.int64)
    share = _rest_share(int(lengths.sum()), world, batch_size)
    a, b = share.lo, share.hi
    ends = np.cumsum(lengths)  # (pieces,) rest position just past each piece
    starts = ends - lengths
    out = []
    for k in range(int(np.searchsorted(ends, a, side="right")), len(pieces)):
        if starts[k] >= b:
            break
        rank, worker, lo, _ = pieces[k]
        x, y = max(a, int(starts[k])), min(b, int(ends[k]))
        if y > x:
            out.append((rank, worker, lo + x - int(starts[k]), lo + y - int(starts[k])))
    return Share(tuple(out), tuple(int(s) for s in share.sizes()))


def batches_of_rest(pieces: Sequence[Piece], world_size: int, batch_size: int) -> int:
    """Batches every new rank yields of the rest ``pieces``."""
    return _rest_share(sum(hi - lo for _, _, lo, hi in pieces), World(0, world_size), batch_size).rank_batches


def rest_of_epoch(
    consumed: Sequence[int],
    world_size: int,
    num_workers: int,
    readers: Callable[[int, int], tuple[Sequence[Piece], Sequence[int]]],
) -> list[Piece]:
    """The pieces not yet yielded, given ``(num_workers,)`` batches each worker of every rank had yielded
    (``consumed``) and ``readers(rank, worker) -> (pieces, sizes)`` of each original reader."""
    out: list[Piece] = []
    for rank in range(world_size):
        for worker in range(num_workers):
            pieces, sizes = readers(rank, worker)
            done = int(np.sum(sizes[: int(consumed[worker])]))  # windows of the batches yielded
            for r, w, lo, hi in pieces:
                length = hi - lo
                if done >= length:
                    done -= length
                    continue
                out.append((r, w, lo + done, hi))
                done = 0
    return out


def is_elastic(state: dict, world_size: int, num_workers: int | None) -> bool:
    """Whether resuming ``state`` with this topology re-divides the rest (``num_workers=None``: unknown)."""
    if "rest" in state or state["world_size"] != world_size:
        return True
    return num_workers is not None and state["num_workers"] != max(num_workers, 1)


def rest_from_state(
    state: dict, round_robin: Callable, num_windows: int, batch_size: int, drop_last: bool
) -> tuple[list[Piece], tuple[int, int]]:
    """``(pieces, origin)``: the rest of the epoch of loader-scope ``state`` and the topology of its streams."""
    world_size, num_workers = int(state["world_size"]), int(state["num_workers"])
    if "rest" in state:  # saved during an elastic epoch: its readers divided these pieces
        base: list[Piece] = [(int(r), int(w), int(a), int(b)) for r, w, a, b in state["rest"]["pieces"]]
        origin = (int(state["rest"]["origin"][0]), int(state["rest"]["origin"][1]))

        def readers(rank: int, worker: int) -> tuple:
            share = divide(base, World(rank, world_size, worker, num_workers), batch_size)
            return share.pieces, share.sizes

    else:
        origin = (world_size, num_workers)

        def readers(rank: int, worker: int) -> tuple:
            share = reader_share(num_windows, World(rank, world_size, worker, num_workers), batch_size, drop_last)
            return [(rank, worker, 0, share.hi - share.lo)], [int(s) for s in share.sizes()]

    per_worker = [len(readers(0, w)[1]) for w in range(num_workers)]
    consumed, _ = round_robin(per_worker, int(state["batches"]))
    return rest_of_epoch(consumed, world_size, num_workers, readers), origin
