"""One reader's packed batches: partitions read ahead in order of first use, items copied into sequences.

``ReaderWork`` lists, for a reader's range of sequences, every item it serves
(data set, series, channel, steps, token offset inside its sequence) as
O(items of the range) numpy arrays, and the partitions they need in order of
first use with the batch of their last use. ``batches`` reads those
partitions on ``prefetch.Prefetcher`` threads, keeps each only between its
first and last batch, and fills each batch's arrays item by item (a slice
copy per item and channel).

Batch layout (Moirai's): ``S`` tokens of ``P`` steps per sequence. An item of
``C`` channels and ``n`` tokens per channel takes ``C * n`` consecutive
tokens, channel by channel; its steps are right-aligned inside its ``n * P``
steps, so the first token of a series shorter than a whole number of patches
is left-padded (``observed_mask`` 0, ``sample_id`` of the item). Tokens no
item takes have ``sample_id`` 0. Unpacked (one item per sequence), an item is
right-aligned in its sequence: shorter series are left-padded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from dask_windows.prefetch import Prefetcher

__all__ = ["ReaderWork", "batches"]


@dataclass(frozen=True)
class ReaderWork:
    """Everything one reader serves, as arrays over its items (``E``) and partitions (``K``).

    Attributes:
        batch: ``(E,)`` batch of each item (0-based in this reader's pass).
        row: ``(E,)`` sequence of the item inside its batch.
        offset: ``(E,)`` its first token inside the sequence.
        tokens: ``(E,)`` its tokens per channel.
        member: ``(E,)`` its data set.
        series: ``(E,)`` its series (row number in the data set).
        channel: ``(E,)`` its first channel.
        width: ``(E,)`` its channels.
        start: ``(E,)`` first step served.
        stop: ``(E,)`` one past the last step served.
        key: ``(E,)`` index into ``keys`` of the partition holding it.
        row_in_partition: ``(E,)`` the series' row inside that partition.
        keys: ``[(member, partition)]`` in order of first use.
        first_use: ``(K,)`` batch of each key's first use.
        last_use: ``(K,)`` batch of each key's last use.
        batch_tokens: ``(nb,)`` tokens per sequence of each batch.
        batch_rows: ``(nb,)`` sequences in each batch.
    """

    batch: np.ndarray
    row: np.ndarray
    offset: np.ndarray
    tokens: np.ndarray
    member: np.ndarray
    series: np.ndarray
    channel: np.ndarray
    width: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    key: np.ndarray
    row_in_partition: np.ndarray
    keys: list[tuple[int, int]]
    first_use: np.ndarray
    last_use: np.ndarray
    batch_tokens: np.ndarray
    batch_rows: np.ndarray


@dataclass(frozen=True)
class Layout:
    """What a batch holds besides values: settings the assembly needs."""

    patch: int
    prediction_patches: int
    nan: str
    freq_ids: list[np.ndarray]  # per member: (S,) corpus-wide frequency id of each series
    lengths: list[np.ndarray]  # per member: (S,) steps of each series
    return_index: bool


def _assemble(work: ReaderWork, b: int, parts: dict, layout: Layout, lo: int, hi: int) -> dict[str, np.ndarray]:
    """Batch ``b``'s arrays from its items ``[lo, hi)`` of ``work``."""
    rows, tokens, patch = int(work.batch_rows[b]), int(work.batch_tokens[b]), layout.patch
    target = np.zeros((rows, tokens * patch), np.float32)  # (B, S * P), reshaped at the end
    real = np.zeros((rows, tokens * patch), bool)  # steps holding a value (padding not)
    sample_id = np.zeros((rows, tokens), np.int64)  # (B, S)
    variate_id = np.zeros((rows, tokens), np.int64)
    time_id = np.zeros((rows, tokens), np.int64)
    prediction = np.zeros((rows, tokens), bool)
    dataset_id = np.full((rows, tokens), -1, np.int64)
    freq_id = np.full((rows, tokens), -1, np.int64)
    series_id = np.full((rows, tokens), -1, np.int64)
    step = np.zeros((rows, tokens), np.int64)
    number = np.zeros(rows, np.int64)  # items placed in each sequence so far
    for e in range(lo, hi):
        i, o, n, m = int(work.row[e]), int(work.offset[e]), int(work.tokens[e]), int(work.member[e])
        s, start, stop = int(work.series[e]), int(work.start[e]), int(work.stop[e])
        decoded = parts[int(work.key[e])]
        length = int(layout.lengths[m][s])
        base = int(decoded.starts[int(work.row_in_partition[e])])
        pad = n * patch - (stop - start)
        number[i] += 1
        first = int(work.channel[e])
        for v in range(int(work.width[e])):
            t0 = o + v * n
            at = base + (first + v) * length
            target[i, t0 * patch + pad : (t0 + n) * patch] = decoded.values[at + start : at + stop]
            real[i, t0 * patch + pad : (t0 + n) * patch] = True
            sample_id[i, t0 : t0 + n] = number[i]
            variate_id[i, t0 : t0 + n] = first + v
            time_id[i, t0 : t0 + n] = np.arange(n)
            hidden = min(layout.prediction_patches, n - 1)
            if hidden > 0:
                prediction[i, t0 + n - hidden : t0 + n] = True
            dataset_id[i, t0 : t0 + n] = m
            freq_id[i, t0 : t0 + n] = layout.freq_ids[m][s]
            if layout.return_index:
                series_id[i, t0 : t0 + n] = s
                step[i, t0 : t0 + n] = start - pad + np.arange(n) * patch
    observed = real & ~np.isnan(target)
    if layout.nan == "mask":
        target[~observed] = 0.0
    out = {
        "target": target.reshape(rows, tokens, patch),
        "observed_mask": observed.reshape(rows, tokens, patch),
        "sample_id": sample_id,
        "variate_id": variate_id,
        "time_id": time_id,
        "prediction_mask": prediction,
        "dataset_id": dataset_id,
        "freq_id": freq_id,
    }
    if layout.return_index:
        out["series_id"] = series_id
        out["step"] = step
    return out


def batches(
    work: ReaderWork, read: Callable[[tuple[int, int]], Any], layout: Layout, read_ahead: int
) -> Iterator[dict[str, np.ndarray]]:
    """The reader's batches, in order, as dicts of numpy arrays."""
    nb = len(work.batch_rows)
    bounds = np.searchsorted(work.batch, np.arange(nb + 1), side="left")  # (nb + 1,) first item of each batch
    prefetch = Prefetcher(read, work.keys, depth=read_ahead, name="dask-windows-corpus")
    parts: dict[int, Any] = {}
    taken = 0
    try:
        for b in range(nb):
            while taken < len(work.keys) and work.first_use[taken] <= b:
                parts[taken] = next(prefetch)
                taken += 1
            yield _assemble(work, b, parts, layout, int(bounds[b]), int(bounds[b + 1]))
            for k in [k for k in parts if work.last_use[k] <= b]:
                del parts[k]
    finally:
        prefetch.close()
