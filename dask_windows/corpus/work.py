"""One reader's share of an epoch as arrays over its items: where each sits in its batch and what it reads.

Given the epoch's plan (items in order, packed into sequences) and a reader's
range of sequences, ``reader_work`` lists every item the reader serves (its
batch, row and first token, its data set, series, channels and steps) and the
partitions they need in order of first use with the batch of their last use:
O(items of the range) numpy arrays, no loop per item. With ``context_length``
(unpacked) each batch's length is drawn here from ``(seed, epoch, batch)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dask_windows.corpus.batches import ReaderWork
from dask_windows.corpus.items import Units
from dask_windows.planning.plan import rng_for

__all__ = ["EpochPlan", "reader_work"]

_CONTEXT = 0xC3


@dataclass(frozen=True)
class EpochPlan:
    """One epoch's items in order and their sequences."""

    epoch: int
    member: np.ndarray  # (N,)
    item: np.ndarray  # (N,)
    tokens: np.ndarray  # (N,) tokens of each item (all channels)
    unit: np.ndarray  # (N,) the item's unit in its data set
    start: np.ndarray  # (N,) its first step
    stop: np.ndarray  # (N,) one past its last step
    sequence_ptr: np.ndarray  # (Q + 1,)
    entries: np.ndarray  # (N,) positions in the item order, sequence by sequence


def reader_work(
    plan: EpochPlan,
    units: list[Units],
    partition_series: list[np.ndarray],
    s: Any,
    epoch: int,
    lo: int,
    hi: int,
    first_batch: int,
) -> ReaderWork:
    """What the reader of sequences ``[lo, hi)`` of ``plan`` serves (see ``batches.ReaderWork``).

    Args:
        plan: The epoch's items and sequences.
        units: Each data set's units.
        partition_series: Each data set's first series per partition.
        s: The ``CorpusSettings``.
        epoch: The epoch (with ``first_batch``, it draws unpacked batches' context lengths).
        lo: First sequence.
        hi: One past the last.
        first_batch: The rank's number of the reader's first batch.
    """
    ptr = plan.sequence_ptr
    entries = plan.entries[ptr[lo] : ptr[hi]]  # (E,) positions in the epoch's item order
    per_sequence = np.diff(ptr[lo : hi + 1])
    sequence = np.repeat(np.arange(lo, hi), per_sequence)  # (E,)
    batch = (sequence - lo) // s.batch_size
    row = (sequence - lo) % s.batch_size
    member = plan.member[entries]
    unit, start, stop = plan.unit[entries], plan.start[entries], plan.stop[entries]
    n = len(entries)
    series, channel, width, partition = (np.zeros(n, np.int64) for _ in range(4))
    for m, (own, firsts) in enumerate(zip(units, partition_series)):
        at = member == m if len(units) > 1 else slice(None)
        u = unit[at]
        series[at] = own.series[u]
        channel[at] = np.maximum(own.channel[u], 0)
        width[at] = own.width[u]
        partition[at] = np.searchsorted(firsts, series[at], side="right") - 1
    nb = -(-(hi - lo) // s.batch_size) if hi > lo else 0
    batch_rows = np.full(nb, s.batch_size, np.int64)
    if nb:
        batch_rows[-1] = (hi - lo) - (nb - 1) * s.batch_size
    batch_tokens = np.full(nb, s.tokens, np.int64)
    if s.context_length is not None:  # unpacked: each batch's length drawn, the item's last steps kept
        c_lo, c_hi = s.context_length
        p = s.patch_size
        draws = [
            rng_for(s.seed, epoch, first_batch + b, _CONTEXT).integers(c_lo // p, c_hi // p + 1) for b in range(nb)
        ]
        batch_tokens = np.asarray(draws, np.int64).reshape(nb)
        steps = batch_tokens * p
        start = np.maximum(start, stop - steps[batch] // width // s.patch_size * s.patch_size)
    tokens = -(-(stop - start) // s.patch_size)
    used = width * tokens
    if s.pack:  # items follow one another from the sequence's first token
        first_entry = np.concatenate([[0], np.cumsum(per_sequence)])[:-1]
        cum = np.cumsum(used) - used
        offset = cum - np.repeat(cum[first_entry] if n else cum[:0], per_sequence)
    else:  # one item, right-aligned
        offset = batch_tokens[batch] - used if n else used
    key_codes = member * (1 << 40) + partition
    uniq, first_at, inverse = np.unique(key_codes, return_index=True, return_inverse=True)
    by_first = np.argsort(first_at, kind="stable")  # keys in order of first use
    rank_of = np.empty(len(uniq), np.int64)
    rank_of[by_first] = np.arange(len(uniq))
    key = rank_of[inverse.reshape(-1)]
    last_use = np.zeros(len(uniq), np.int64)
    np.maximum.at(last_use, key, batch)
    first_use = batch[first_at[by_first]] if n else np.zeros(0, np.int64)
    keys = [(int(c >> 40), int(c & ((1 << 40) - 1))) for c in uniq[by_first]]
    row_in_partition = np.zeros(n, np.int64)
    for m, firsts in enumerate(partition_series):
        at = member == m
        row_in_partition[at] = series[at] - firsts[partition[at]]
    return ReaderWork(
        batch,
        row,
        offset,
        tokens,
        member,
        series,
        channel,
        width,
        start,
        stop,
        key,
        row_in_partition,
        keys,
        first_use,
        last_use,
        batch_tokens,
        batch_rows,
    )
