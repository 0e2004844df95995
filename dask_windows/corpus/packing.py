"""Items packed into sequences of a fixed token budget.

The epoch's items are packed in blocks of ``window`` consecutive items, each block by *best-fit
decreasing*: blocks keep the shuffle's locality, and a block's sequences are put in a random order
so a batch does not gather its longest items. Sequences are ``sequence_ptr`` (``(Q + 1,)``) over
``entries`` (``(N,)`` positions in the epoch's item order).
"""

from __future__ import annotations

import bisect

import numpy as np

from dask_windows.planning.plan import rng_for

__all__ = ["pack", "unpacked"]

_SHUFFLE = 0xC2


def _best_fit(tokens: np.ndarray, budget: int) -> np.ndarray:
    """Best-fit decreasing of ``tokens`` (each ``<= budget``) into bins of ``budget``: ``(n,)`` bin of each item.

    Items of one size go in bulk: best fit puts an item of size ``t`` into the open bin of least
    room ``r >= t``, which keeps the least room while ``r - t >= t``, so that bin takes ``r // t``
    of them in a row. Cost: one step per (size, room class) visited, not per item.
    """
    n = len(tokens)
    order = np.argsort(-tokens, kind="stable")  # (n,) items by size, largest first, epoch order within a size
    sizes, first = np.unique(-tokens[order], return_index=True)  # sizes descending (negated)
    bounds = [*first.tolist(), n]
    rooms: dict[int, list[int]] = {}  # room -> open bins with that room, in the order they got it
    open_rooms: list[int] = []  # sorted rooms with bins
    bins_used = 0
    got_bin: list[np.ndarray] = []
    got_count: list[np.ndarray] = []

    def give(room: int, bins: list[int]) -> None:
        if room <= 0 or not bins:
            return
        if room not in rooms:
            rooms[room] = []
            bisect.insort(open_rooms, room)
        rooms[room].extend(bins)

    for g, negated in enumerate(sizes.tolist()):
        t, need = -negated, bounds[g + 1] - bounds[g]
        smallest = t  # rooms below are too small, rooms visited are used up
        while need:
            at = bisect.bisect_left(open_rooms, smallest)
            if at == len(open_rooms):
                break
            r = open_rooms[at]
            waiting = rooms[r]
            k = r // t
            full = min(len(waiting), need // k)
            got_bin.append(np.asarray(waiting[:full], np.int64))
            got_count.append(np.full(full, k, np.int64))
            need -= full * k
            moved = [(r - k * t, waiting[:full])]
            if need and full < len(waiting):  # the next bin of this room takes the last few
                got_bin.append(np.asarray(waiting[full : full + 1], np.int64))
                got_count.append(np.asarray([need], np.int64))
                moved.append((r - need * t, waiting[full : full + 1]))
                full, need = full + 1, 0
            if full == len(waiting):
                del rooms[r]
                open_rooms.pop(at)
            else:
                rooms[r] = waiting[full:]
            for room, bins in moved:  # rooms below r: not visited again for this size
                give(room, bins)
            smallest = r + 1
        if need:  # new bins, budget // t items each
            per = budget // t
            count = -(-need // per)
            new = list(range(bins_used, bins_used + count))
            bins_used += count
            got_bin.append(np.asarray(new, np.int64))
            fill = np.full(count, per, np.int64)
            fill[-1] = need - per * (count - 1)
            got_count.append(fill)
            give(budget - per * t, new[:-1])
            give(budget - int(fill[-1]) * t, new[-1:])
    bin_of = np.empty(n, np.int64)
    bin_of[order] = np.repeat(np.concatenate(got_bin), np.concatenate(got_count))
    return bin_of


def pack(tokens: np.ndarray, budget: int, blocks: np.ndarray, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """``(sequence_ptr, entries)``: the epoch's items (``tokens`` each, in epoch order) packed.

    ``tokens``: ``(N,)``, each ``<= budget``; ``blocks``: ``(K + 1,)`` first item of each block packed together.
    ``(seed, epoch)`` orders each block's sequences.
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    sizes = [np.zeros(0, np.int64)]
    entries = [np.zeros(0, np.int64)]
    bounds = np.asarray(blocks, np.int64).tolist()
    for block, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        if hi <= lo:
            continue
        bin_of = _best_fit(tokens[lo:hi], budget)
        num_bins = int(bin_of.max()) + 1
        place = np.empty(num_bins, np.int64)
        place[rng_for(seed, epoch, block, _SHUFFLE).permutation(num_bins)] = np.arange(num_bins)
        rank = place[bin_of]  # (n,) the item's sequence inside the block
        entries.append(lo + np.argsort(rank, kind="stable"))
        sizes.append(np.bincount(rank, minlength=num_bins))
    ptr = np.concatenate([[0], np.cumsum(np.concatenate(sizes))]).astype(np.int64)
    return ptr, np.concatenate(entries)


def unpacked(num_items: int) -> tuple[np.ndarray, np.ndarray]:
    """One item per sequence."""
    return np.arange(num_items + 1, dtype=np.int64), np.arange(num_items, dtype=np.int64)
