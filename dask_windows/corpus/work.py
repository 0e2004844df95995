"""One reader's share of an epoch as O(items) arrays: where each item sits in its batch, what it reads.

Unpacked with ``context_length``, each batch's length is drawn here from ``(seed, epoch, batch)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dask_windows.corpus.batches import ReaderWork
from dask_windows.planning.plan import rng_for

__all__ = ["EpochPlan", "reader_work", "split_to_context"]

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


def split_to_context(
    member: np.ndarray,
    item: np.ndarray,
    unit: np.ndarray,
    start: np.ndarray,
    stop: np.ndarray,
    context: tuple[int, int],
    patch: int,
    window: int,
    seed: int,
    epoch: int,
) -> tuple[np.ndarray, ...]:
    """Items of each block of ``window`` cut, from their end, into samples of at most the block's drawn length.

    Returns ``(member, item, unit, start, stop, blocks)`` per sample, ``blocks`` ``(K + 1,)`` the first
    sample of each block. The length of block ``k`` is drawn from ``context`` (steps, in whole patches)
    by ``(seed, epoch, k)``.
    """
    n = len(item)
    num_blocks = -(-n // window)
    lo, hi = context[0] // patch, context[1] // patch
    length = (
        np.asarray(
            [rng_for(seed, epoch, k, _CONTEXT).integers(lo, hi + 1) for k in range(num_blocks)], np.int64
        ).reshape(num_blocks)
        * patch
    )  # (K,) steps of a sample in each block
    cap = length[np.arange(n) // window]  # (n,)
    pieces = -(-(stop - start) // cap)  # (n,) samples of each item
    owner = np.repeat(np.arange(n), pieces)  # (samples,)
    j = np.arange(len(owner)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    new_stop = stop[owner] - (pieces[owner] - 1 - j) * cap[owner]
    new_start = np.maximum(start[owner], new_stop - cap[owner])
    per_block = np.bincount(np.arange(n) // window, weights=pieces, minlength=num_blocks).astype(np.int64)
    blocks = np.concatenate([[0], np.cumsum(per_block)]).astype(np.int64)
    return member[owner], item[owner], unit[owner], new_start, new_stop, blocks


def reader_work(
    plan: EpochPlan,
    members: Sequence[Any],
    s: Any,
    epoch: int,
    lo: int,
    hi: int,
    first_batch: int,
    sequences: np.ndarray | None = None,
    batch_rows: np.ndarray | None = None,
) -> ReaderWork:
    """What the reader of sequences ``[lo, hi)`` of ``plan`` serves (see ``batches.ReaderWork``).

    Args:
        members: The corpus's data sets (``corpus.dataset.Member``: their units and sources).
        s: The ``CorpusSettings``.
        first_batch: The rank's number of the reader's first batch (with ``epoch``, it draws unpacked
            batches' context lengths).
        sequences: The reader's sequences in order, instead of ``[lo, hi)`` (an elastic resume's rest).
        batch_rows: Sequences of each batch (default: ``batch_size`` each, the last one partial).
    """
    ptr = plan.sequence_ptr
    seqs = np.arange(lo, hi, dtype=np.int64) if sequences is None else np.asarray(sequences, np.int64)
    per_sequence = ptr[seqs + 1] - ptr[seqs]  # (Q',) items of each of the reader's sequences
    before = np.cumsum(per_sequence) - per_sequence
    total = int(per_sequence.sum())
    entries = plan.entries[np.repeat(ptr[seqs] - before, per_sequence) + np.arange(total, dtype=np.int64)]  # (E,)
    if batch_rows is None:  # full batches, then a partial one
        nb = -(-len(seqs) // s.batch_size)
        batch_rows = np.full(nb, s.batch_size, np.int64)
        if nb:
            batch_rows[-1] = len(seqs) - (nb - 1) * s.batch_size
    batch_rows = np.asarray(batch_rows, np.int64)
    nb = len(batch_rows)
    place = np.repeat(np.arange(len(seqs)), per_sequence)  # (E,) the item's sequence among the reader's
    batch = np.repeat(np.arange(nb), batch_rows)[place]
    row = (np.arange(len(seqs)) - np.repeat(np.cumsum(batch_rows) - batch_rows, batch_rows))[place]
    member = plan.member[entries]
    unit, start, stop = plan.unit[entries], plan.start[entries], plan.stop[entries]
    n = len(entries)
    series, channel, width, partition, patch, row_in_partition = (np.zeros(n, np.int64) for _ in range(6))
    for m, data_set in enumerate(members):
        own, firsts = data_set.units, data_set.source.partition_series
        at = member == m if len(members) > 1 else slice(None)
        u = unit[at]
        series[at] = own.series[u]
        channel[at] = np.maximum(own.channel[u], 0)
        width[at] = own.width[u]
        patch[at] = own.patch[u]
        partition[at] = np.searchsorted(firsts, series[at], side="right") - 1
        row_in_partition[at] = series[at] - firsts[partition[at]]
    batch_tokens = np.full(nb, s.tokens, np.int64)
    planes = s.channels == "padded"
    if s.context_length is not None and not s.pack:  # each batch's length drawn, the item's last steps kept
        c_lo, c_hi = s.context_length
        p = s.patch_size
        draws = [
            rng_for(s.seed, epoch, first_batch + b, _CONTEXT).integers(c_lo // p, c_hi // p + 1) for b in range(nb)
        ]
        batch_tokens = np.asarray(draws, np.int64).reshape(nb)
        steps = batch_tokens * p
        per_token = 1 if planes else width  # padded: the channels side by side share the tokens
        start = np.maximum(start, stop - steps[batch] // per_token // s.patch_size * s.patch_size)
    tokens = -(-(stop - start) // patch)
    used = tokens if planes else width * tokens
    if s.pack:  # items follow one another from the sequence's first token
        cum = np.cumsum(used) - used
        offset = cum - np.repeat(cum[before] if n else cum[:0], per_sequence)
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
        patch,
    )
