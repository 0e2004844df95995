"""One reader's packed batches: partitions read ahead in order of first use, items copied into sequences.

``batches`` reads the partitions a ``ReaderWork`` needs on ``prefetch.Prefetcher`` threads, keeps
each only between its first and last batch, and fills each batch in a few vectorised gathers.
Layout (Moirai's): ``S`` tokens of ``P`` steps per sequence; an item of ``C`` channels and ``n``
tokens per channel takes ``C * n`` consecutive tokens, its steps right-aligned (docs/corpora.md).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import numpy as np

from dask_windows.runtime.prefetch import Prefetcher

__all__ = ["ReaderWork", "batches"]


@dataclass(frozen=True)
class ReaderWork:
    """Everything one reader serves, as arrays over its items (``E``) and partitions (``K``)."""

    batch: np.ndarray  # (E,) batch of each item (0-based in this reader's pass)
    row: np.ndarray  # (E,) sequence of the item inside its batch
    offset: np.ndarray  # (E,) its first token inside the sequence
    tokens: np.ndarray  # (E,) its tokens per channel
    member: np.ndarray  # (E,) its data set
    series: np.ndarray  # (E,) its series (row number in the data set)
    channel: np.ndarray  # (E,) its first channel
    width: np.ndarray  # (E,) its channels
    start: np.ndarray  # (E,) first step served
    stop: np.ndarray  # (E,) one past the last step served
    key: np.ndarray  # (E,) index into ``keys`` of the partition holding it
    row_in_partition: np.ndarray  # (E,) the series' row inside that partition
    keys: list[tuple[int, int]]  # [(member, partition)] in order of first use
    first_use: np.ndarray  # (K,) batch of each key's first use
    last_use: np.ndarray  # (K,) batch of each key's last use
    batch_tokens: np.ndarray  # (nb,) tokens per sequence of each batch
    batch_rows: np.ndarray  # (nb,) sequences in each batch
    patch: np.ndarray  # (E,) steps per token of each item (its values fill that many of a token's columns)


@dataclass(frozen=True)
class Layout:
    """What a batch holds besides values: settings the assembly needs."""

    patch: int  # a token's columns: the largest patch size
    prediction_length: int  # steps, rounded up to whole patches of each item
    nan: str
    freq_ids: list[np.ndarray]  # per member: (S,) corpus-wide frequency id of each series
    lengths: list[np.ndarray]  # per member: (S,) steps of each series
    return_index: bool
    planes: int = 0  # the padded view's channels (0: channels laid out along the sequence)
    patch_field: bool = False  # per-frequency patch sizes: a patch_size field in the batch
    covariates: list[np.ndarray] | None = None  # per member: (planes,) whether each plane is a covariate


def _runs(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(owner, k)`` of ``sum(counts)`` positions: position ``j`` is the ``k``-th of run ``owner``."""
    owner = np.repeat(np.arange(len(counts)), counts)
    first = np.cumsum(counts) - counts
    return owner, np.arange(int(counts.sum()), dtype=np.int64) - first[owner]


def _assemble(work: ReaderWork, b: int, parts: dict, layout: Layout, lo: int, hi: int) -> dict[str, np.ndarray]:
    """Batch ``b``'s arrays from its items ``[lo, hi)`` of ``work``, in a few vectorised gathers."""
    rows, tokens, patch = int(work.batch_rows[b]), int(work.batch_tokens[b]), layout.patch
    sl = slice(lo, hi)
    row, offset, n, width = work.row[sl], work.offset[sl], work.tokens[sl], work.width[sl]
    member, series, key = work.member[sl], work.series[sl], work.key[sl]
    start, stop, first, size = work.start[sl], work.stop[sl], work.channel[sl], work.patch[sl]
    number = np.arange(len(row)) - np.searchsorted(row, row, side="left") + 1  # (E,) the item's sample_id
    length = np.zeros(len(row), np.int64)  # (E,) steps of the item's series
    freq = np.zeros(len(row), np.int64)
    base = np.zeros(len(row), np.int64)  # (E,) the series' first value in its partition's array
    many = len(layout.lengths) > 1
    for m in np.unique(member).tolist() if len(layout.lengths) > 8 else range(len(layout.lengths)):
        at = member == m if many else slice(None)
        length[at] = layout.lengths[m][series[at]]
        freq[at] = layout.freq_ids[m][series[at]]
    keys = range(int(key.min()), int(key.max()) + 1) if len(key) else range(0)  # first-use order: a short range
    for part in keys:
        at = key == part
        if at.any():  # keys in the range whose partition this batch does not need may be dropped already
            base[at] = parts[part].starts[work.row_in_partition[sl][at]]

    planes = layout.planes
    item, v = _runs(width)  # (pieces,): one piece per item and channel
    t0 = offset[item] if planes else offset[item] + v * n[item]  # its first token in the sequence
    count = (stop - start)[item]
    pad = n[item] * size[item] - count  # left padding inside its first patch

    tp, tk = _runs(n[item])  # (T,) every token of every piece: its piece, its place in the piece
    pos = row[item][tp] * tokens + t0[tp] + tk  # flat (B, S) position
    e = item[tp]

    def per_token(values: Any, fill: Any = 0, dtype: Any = np.int64) -> np.ndarray:
        """``(rows, tokens)``: each token's value, ``fill`` where no item is."""
        out = np.full(rows * tokens, fill, dtype)
        out[pos] = values
        return out.reshape(rows, tokens)

    prediction = False
    if layout.prediction_length:  # the last whole patches of each item, one of context kept
        prediction = tk >= n[e] - np.minimum(-(-layout.prediction_length // size[e]), n[e] - 1)

    owner, k = _runs(count)  # (steps,) every value served
    line = row[item] * planes + v if planes else row[item]  # (pieces,) the piece's row of tokens
    if (size == patch).all():  # one patch size: a piece's values are contiguous
        dest = (line * tokens + t0)[owner] * patch + pad[owner] + k
    else:  # a token of patch p fills its first p columns
        q = pad[owner] + k  # (steps,) the value's place in its piece's tokens
        p = size[item][owner]
        dest = ((line * tokens + t0)[owner] + q // p) * patch + q % p
    src = (base[item] + (first[item] + v) * length[item] + start[item])[owner] + k
    target = np.zeros(rows * max(planes, 1) * tokens * patch, np.float32)
    step_key = key[item][owner]
    for kk in keys:
        at = step_key == kk
        if at.any():
            target[dest[at]] = parts[kk].values[src[at]]
    real = np.zeros(len(target), bool)
    real[dest] = True
    observed = real & ~np.isnan(target)
    if layout.nan == "mask":
        target[~observed] = 0.0
    values = (rows, planes, tokens, patch) if planes else (rows, tokens, patch)
    out: dict[str, np.ndarray] = {
        "target": target.reshape(values),
        "observed_mask": observed.reshape(values),
        "sample_id": per_token(number[e]),
        "variate_id": per_token(first[e] + v[tp]),
        "time_id": per_token(tk),
        "prediction_mask": per_token(prediction, False, bool),
        "dataset_id": per_token(member[e], -1),
        "freq_id": per_token(freq[e], -1),
    }
    if planes:  # channels are planes: which of them each token's item has, instead of a variate id
        at = (line * tokens + t0)[tp] + tk
        channel_mask = np.zeros(rows * planes * tokens, bool)
        channel_mask[at] = True
        out["channel_mask"] = channel_mask.reshape(rows, planes, tokens)
        del out["variate_id"]
        if layout.covariates is not None:  # the item's channels that are covariates (Chronos-2's extra rows)
            covariate_mask = np.zeros(rows * planes * tokens, bool)
            is_covariate = np.stack(layout.covariates)[member[item], v]  # (pieces,)
            covariate_mask[at] = is_covariate[tp]
            out["covariate_mask"] = covariate_mask.reshape(rows, planes, tokens)
    if layout.patch_field:
        out["patch_size"] = per_token(size[e])
    if layout.return_index:
        out["series_id"] = per_token(series[e], -1)
        out["step"] = per_token(start[e] - pad[tp] + tk * size[e])
    return out


def batches(
    work: ReaderWork, read: Callable[[tuple[int, int]], Any], layout: Layout, read_ahead: int
) -> Generator[dict[str, np.ndarray], None, None]:
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
