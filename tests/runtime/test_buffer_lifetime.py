"""A drained buffer's feature array is freed before the next buffer is read (``prefetch_partitions=0``).

With ``prefetch_partitions=0`` the consumer's thread drains buffer ``k - 1``, drops it and then reads
and builds buffer ``k``; nothing reads ahead. So the memory formula counts one buffer there, plus
the piece being decoded. A reference the consumer keeps past ``del buffer, built`` (the last run's
bound gather, a view of the feature array, was one: peak 1.33-1.49x of the formula) keeps the old
array alive through the whole next read. The array is freed by its reference count (no cycle), so
weak references to it tell, without timing or a garbage collection, whether it is still held.

Where the old array may legitimately still be alive: while buffer ``k``'s *first* unit is read,
the parts iterator of ``reading.batches`` still holds the last part it handed over (a view of
buffer ``k - 1``'s array) until that read returns. So the checks are: when any of buffer ``k``'s
units is read, buffers ``< k - 1`` are gone; when its second and later units are read, and when
``Buffer`` ``k`` is built, buffer ``k - 1`` is gone as well.
"""

from __future__ import annotations

import weakref

import numpy as np
import pytest
from helpers import make_frames, write_parquet

import dask_windows as dw
from dask_windows.runtime import batch, buffer, reading


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    frames = make_frames(seed=3, num_files=4, num_series=6, min_len=1500, max_len=3000)
    path = tmp_path_factory.mktemp("lifetime")
    write_parquet(frames, str(path), row_group_size=700)
    return str(path)


def _owner(a: np.ndarray) -> object:
    """The object owning ``a``'s memory (the end of its ``.base`` chain): alive while any view is."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a


@pytest.mark.parametrize("pieces", [1, 512])  # one unit per buffer; many (the piece order's former default here)
def test_the_drained_buffers_features_are_freed_before_the_next_buffer_is_read(root, monkeypatch, pieces):
    features: list[weakref.ref] = []  # per Buffer built, in order: its feature array's owner
    problems: list[str] = []
    units_read: dict[int, int] = {}  # plan buffer -> its units read so far
    runs = [0]

    def alive(upto: int) -> list[int]:
        return [k for k, ref in enumerate(features[:upto]) if ref() is not None]

    init = buffer.Buffer.__init__

    def tracked_init(self, *args, **kwargs):
        k = len(features)
        if alive(k):  # the buffers drained so far are gone before this one is built
            problems.append(f"buffer {k} built while buffers {alive(k)} are alive")
        init(self, *args, **kwargs)
        features.append(weakref.ref(_owner(self.gatherer._source)))

    read_unit = reading.read_unit

    def tracked_read(ds, unit, reader, arena=None):
        k = arena.buffer_of[unit]
        j = units_read.get(k, 0)
        units_read[k] = j + 1
        assert len(features) == k  # prefetch_partitions=0: read when the previous buffers are built, no sooner
        held = alive(k)
        if held:
            problems.append(f"unit {j} of buffer {k} read while buffers {held} are alive")
        return read_unit(ds, unit, reader, arena)

    gather_for = batch.Gatherer.gather_for

    def counted_gather_for(self, size, pool):
        runs[0] += 1
        return gather_for(self, size, pool)

    monkeypatch.setattr(buffer.Buffer, "__init__", tracked_init)
    monkeypatch.setattr(reading, "read_unit", tracked_read)
    monkeypatch.setattr(batch.Gatherer, "gather_for", counted_gather_for)
    ds = dw.WindowDataset(
        root,
        features=["f0", "f1"],
        targets=["y"],
        series="sid",
        window=6,
        batch_size=256,
        buffer_partitions=1,
        prefetch_partitions=0,
        pieces_per_partition=pieces,
    )
    count = sum(1 for _ in ds)
    assert count == len(ds)
    assert len(features) >= 3  # two hand-overs between buffers at least
    assert runs[0] >= len(features)  # every buffer drained by runs of full batches (the path under test)
    if pieces > 1:
        assert min(units_read.values()) >= 2  # later units are read: the stricter check ran
    assert not problems, problems
