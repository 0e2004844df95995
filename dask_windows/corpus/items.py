"""A corpus's items and their epoch order, as pure arithmetic on O(series) numbers.

A data set's series become *units* (each channel of each series, or each series with all its
channels), each cut from its end into ``ceil(L / segment)`` *items*, so every observation of a kept
series is in exactly one item. A series shorter than ``min_length``, without channels, or wider
than the budget is left out and counted in ``LeftOut``. An epoch's order follows the loader's
shuffle: partitions permuted, grouped ``buffer_partitions`` at a time, items permuted inside a
group; a mixture interleaves ``counts[m]`` items of each member by ``schedule``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dask_windows.planning.plan import rng_for
from dask_windows.planning.schedule import labels

__all__ = ["LeftOut", "Units", "build_units", "epoch_items", "member_order"]

_ORDER, _INSIDE = 0xC0, 0xC1  # tags of the random streams (see plan.rng_for)


@dataclass(frozen=True)
class LeftOut:
    """What a data set leaves out at open, and why."""

    short: int = 0  # series shorter than min_length (null rows included)
    short_steps: int = 0  # their observations (time steps x channels)
    wide: int = 0  # series with more channels than the budget holds (multivariate view)
    wide_steps: int = 0

    @property
    def series(self) -> int:
        return self.short + self.wide


@dataclass(frozen=True)
class Units:
    """The units of one data set, in partition order."""

    series: np.ndarray  # (U,) the unit's series (row number in the data set)
    channel: np.ndarray  # (U,) its channel (channel-independent view) or -1 (all channels)
    width: np.ndarray  # (U,) channels it serves (1 in the channel-independent view)
    length: np.ndarray  # (U,) its time steps
    segment: np.ndarray  # (U,) steps of its items (the first may be shorter)
    first_item: np.ndarray  # (U + 1,) first item of each unit, then the item count
    partition_items: np.ndarray  # (P + 1,) first item of each partition, then the item count
    item_unit: np.ndarray  # (I,) unit of each item (O(items): the epoch's permutation is as large)
    patch: np.ndarray  # (U,) steps per token of the unit (its frequency's patch size)

    @property
    def num_items(self) -> int:
        return int(self.first_item[-1])

    def locate(self, items: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(unit, start, stop)`` of ``items``: the steps ``[start, stop)`` of the unit's series each covers."""
        items = np.asarray(items, dtype=np.int64)
        unit = self.item_unit[items]
        count = self.first_item[unit + 1] - self.first_item[unit]
        j = items - self.first_item[unit]
        stop = self.length[unit] - (count - 1 - j) * self.segment[unit]
        return unit, np.maximum(stop - self.segment[unit], 0), stop


def build_units(
    lengths: np.ndarray,
    channels: np.ndarray,
    partition_series: np.ndarray,
    *,
    independent: bool,
    patch: int | np.ndarray,
    max_length: int,
    min_length: int,
    budget: int,
    max_channels: int | None = None,
) -> tuple[Units, LeftOut]:
    """The units of a data set of series ``lengths`` x ``channels`` (see the module docstring).

    Args:
        partition_series: ``(P + 1,)`` first series of each partition.
        independent: One unit per channel (else one per series).
        patch: Steps per token, or ``(S,)`` of each series: an item holds at most ``budget`` tokens.
        max_length: Most steps of one item (a multiple of ``patch``).
        min_length: Fewest steps of a series kept.
        budget: Tokens of one sequence (a multivariate item of ``C`` channels: ``budget // C`` per channel).
        max_channels: The padded view (with ``independent=False``): planes of an item; series of more
            channels are left out.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    channels = np.asarray(channels, dtype=np.int64)
    short = (lengths < min_length) | (channels == 0)
    if independent:
        wide = np.zeros(len(lengths), bool)
    else:
        wide = ~short & (channels > (budget if max_channels is None else max_channels))
    keep = ~(short | wide)
    left = LeftOut(
        int(short.sum()), int((lengths * channels)[short].sum()), int(wide.sum()), int((lengths * channels)[wide].sum())
    )
    patches = np.broadcast_to(np.asarray(patch, dtype=np.int64), lengths.shape)
    kept = np.flatnonzero(keep)
    per = channels[kept] if independent else np.ones(len(kept), np.int64)  # units of each kept series
    series = np.repeat(kept, per)
    if independent:
        first = np.cumsum(per) - per
        channel = np.arange(len(series), dtype=np.int64) - np.repeat(first, per)
        width = np.ones(len(series), np.int64)
        segment = np.minimum(max_length, budget * patches[series])
    else:
        channel = np.full(len(series), -1, np.int64)
        width = channels[series]
        if max_channels is None:  # channels laid out one after another in the sequence
            segment = np.minimum(max_length, (budget // np.maximum(width, 1)) * patches[series])
        else:  # channels side by side, in planes
            segment = np.minimum(max_length, budget * patches[series])
    length = lengths[series]
    items = -(-length // segment)
    first_item = np.concatenate([[0], np.cumsum(items)]).astype(np.int64)
    # Units are in series order, so a partition's units (and items) are contiguous.
    unit_of_partition = np.searchsorted(series, np.asarray(partition_series, dtype=np.int64), side="left")
    partition_items = first_item[unit_of_partition]
    item_unit = np.repeat(np.arange(len(series), dtype=np.int64), items)
    unit_patch = patches[series] if np.ndim(patch) else np.broadcast_to(np.int64(patch), series.shape)  # no copy
    units = Units(series, channel, width, length, segment, first_item, partition_items, item_unit, unit_patch)
    return units, left


def member_order(units: Units, seed: int, member: int, epoch: int, shuffle: bool, buffer_partitions: int) -> np.ndarray:
    """``(I,)`` the items of one data set's epoch ``epoch``, in order (see the module docstring)."""
    starts = units.partition_items[:-1]
    counts = np.diff(units.partition_items)
    num_partitions = len(counts)
    if not shuffle:
        return np.arange(units.num_items, dtype=np.int64)
    order = rng_for(seed, member, epoch, _ORDER).permutation(num_partitions)
    n = counts[order]  # (P,) items of each partition in epoch order
    offsets = np.cumsum(n) - n
    items = np.repeat(starts[order] - offsets, n) + np.arange(int(n.sum()), dtype=np.int64)  # (I,)
    buffer = np.repeat(np.arange(num_partitions) // max(buffer_partitions, 1), n)  # (I,) buffer of each item
    keys = buffer + rng_for(seed, member, epoch, _INSIDE).random(len(items))  # buffer, then a random key
    return items[np.argsort(keys, kind="stable")]


def epoch_items(
    members: list[Units], counts: np.ndarray, seed: int, epoch: int, shuffle: bool, buffer_partitions: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(member, item)``: the ``sum(counts)`` items of mixture epoch ``epoch``, in order.

    Member ``m`` gives positions ``[epoch * counts[m], (epoch + 1) * counts[m])`` of its stream of
    epochs laid end to end (each epoch a fresh order, no item twice inside one).
    """
    taken = []
    for m, (units, count) in enumerate(zip(members, counts)):
        count, per_epoch = int(count), units.num_items
        start, stop = epoch * count, (epoch + 1) * count
        pieces = []
        while start < stop:
            e, offset = divmod(start, per_epoch)
            end = min(stop, (e + 1) * per_epoch)
            pieces.append(member_order(units, seed, m, e, shuffle, buffer_partitions)[offset : end - e * per_epoch])
            start = end
        taken.append(np.concatenate(pieces) if pieces else np.zeros(0, np.int64))
    if len(members) == 1:
        return np.zeros(len(taken[0]), np.int64), taken[0]
    member, k = labels(np.asarray(counts, np.int64), 0, int(np.sum(counts)))
    item = np.empty(len(member), np.int64)
    for m, got in enumerate(taken):
        at = member == m
        item[at] = got[k[at]]
    return member, item
