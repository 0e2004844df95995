"""Items packed into sequences of a fixed token budget, and an epoch's sequences divided between readers.

The epoch's items are taken in blocks of ``window`` consecutive items (their
shuffled order); each block is packed on its own by *best-fit decreasing*:
items by token count, largest first, each into the open sequence with the
least room that still holds it (a new sequence when none does). Blocks keep
the shuffle's locality (a block's items come from the few partitions of one
buffer per data set), and the packed sequences of a block are put in a random
order so a batch does not gather the block's longest items. Best fit on a
shuffled block of a few thousand items of mixed lengths leaves a few percent
of padding; an item is never split nor repeated.

Sequences are laid out as ``sequence_ptr`` (``(Q + 1,)`` first entry of each
sequence) over ``entries`` (``(N,)`` positions in the epoch's item order).
Ranks take equal contiguous shares of the sequences (the last ``Q % world``
left out, as ``plan`` leaves out windows), workers contiguous blocks of a
rank's batches: the arithmetic of ``plan``.
"""

from __future__ import annotations

import bisect

import numpy as np

from dask_windows.plan import batches_per_rank, rng_for, worker_batch_range
from dask_windows.world import World

__all__ = ["pack", "reader_sequences", "unpacked"]

_SHUFFLE = 0xC2


def _best_fit(tokens: np.ndarray, budget: int) -> list[list[int]]:
    """Best-fit decreasing of ``tokens`` (each ``<= budget``) into bins of ``budget``; bins of indices."""
    order = np.argsort(-tokens, kind="stable")
    bins: list[list[int]] = []
    room: list[int] = []  # open bins as room * scale + bin, sorted: the best fit is a bisection
    scale = 1 << 40
    for i, t in zip(order.tolist(), tokens[order].tolist()):
        if t >= budget:
            bins.append([i])
            continue
        at = bisect.bisect_left(room, t * scale)
        if at == len(room):
            bins.append([i])
            left = budget - t
            b = len(bins) - 1
        else:
            code = room.pop(at)
            b = code % scale
            bins[b].append(i)
            left = code // scale - t
        if left > 0:
            bisect.insort(room, left * scale + b)
    return bins


def pack(tokens: np.ndarray, budget: int, window: int, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """``(sequence_ptr, entries)``: the epoch's items (``tokens`` each, in epoch order) packed.

    Args:
        tokens: ``(N,)`` tokens of each item, ``1 <= tokens <= budget``.
        budget: Tokens of one sequence.
        window: Items packed together (a block of the epoch's order).
        seed: The dataset seed; with ``epoch`` it orders each block's sequences.
        epoch: The epoch.
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    ptr = [0]
    entries: list[int] = []
    for block, lo in enumerate(range(0, len(tokens), window)):
        bins = _best_fit(tokens[lo : lo + window], budget)
        for b in rng_for(seed, epoch, block, _SHUFFLE).permutation(len(bins)).tolist():
            entries.extend(lo + i for i in bins[b])
            ptr.append(len(entries))
    return np.asarray(ptr, np.int64), np.asarray(entries, np.int64)


def unpacked(num_items: int) -> tuple[np.ndarray, np.ndarray]:
    """One item per sequence."""
    return np.arange(num_items + 1, dtype=np.int64), np.arange(num_items, dtype=np.int64)


def reader_sequences(
    num_sequences: int, batch_size: int, drop_last: bool, reader: World, skip_batches: int = 0
) -> tuple[int, int]:
    """Sequences ``[lo, hi)`` of the epoch that ``reader`` yields after ``skip_batches`` batches."""
    share = num_sequences // reader.world_size
    num_batches = batches_per_rank(num_sequences, reader.world_size, batch_size, drop_last)
    used = min(share, num_batches * batch_size)
    b0, b1 = worker_batch_range(num_batches, reader.worker, reader.num_workers)
    base = reader.rank * share
    hi = base + min(b1 * batch_size, used)
    return min(base + (b0 + skip_batches) * batch_size, hi), hi
