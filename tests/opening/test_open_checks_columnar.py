"""The open's checks over every partition at once equal their per-partition loops (kept as the oracle).

``check_series_order`` and ``omissions.left_out`` walked one partition at a time (1.3 s and 1.6 s at
10^5 files); over an index's columnar runs (``FileRuns``) and integer keys they use flat arrays.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_windows.opening.checks import _regrouped, _regrouped_columnar
from dask_windows.opening.omissions import left_out
from dask_windows.planning.index import FileRuns, PartitionRuns
from dask_windows.sources.base import Partition


@st.composite
def partitions_runs(draw: st.DrawFn) -> list[tuple[list[int], list[int]]]:
    """Per partition, its runs' lengths and series keys (keys may repeat inside a partition)."""
    out = []
    for _ in range(draw(st.integers(1, 8))):
        n = draw(st.integers(0, 6))
        out.append(
            (
                draw(st.lists(st.integers(1, 9), min_size=n, max_size=n)),
                draw(st.lists(st.integers(-3, 5), min_size=n, max_size=n)),
            )
        )
    return out


def as_runs(parts: list, dtype=np.int64) -> tuple[list[PartitionRuns], FileRuns]:
    per = []
    for lengths, keys in parts:
        lengths = np.asarray(lengths, np.int64)
        per.append(PartitionRuns(np.cumsum(lengths) - lengths, lengths, np.asarray(keys).astype(dtype)))
    offsets = np.cumsum([0, *(len(r.keys) for r in per)])
    flat = FileRuns(
        np.concatenate([r.starts for r in per]),
        np.concatenate([r.lengths for r in per]),
        np.concatenate([r.keys for r in per]).astype(dtype),
        offsets,
    )
    return per, flat


@settings(max_examples=200, deadline=None)
@given(partitions_runs(), st.sampled_from([np.int64, np.int8, np.uint32]))
def test_series_order_columnar_equals_the_per_partition_loop(parts: list, dtype) -> None:
    names = [f"part-{i}" for i in range(len(parts))]
    per, flat = as_runs(parts, dtype)
    expected = _regrouped(per, names)
    assert _regrouped_columnar(per, names) == expected
    assert _regrouped_columnar(flat, names) == expected


def test_series_order_of_other_keys_goes_through_the_loop() -> None:
    per, _ = as_runs([([2, 2], [1, 1])])
    strings = [PartitionRuns(per[0].starts, per[0].lengths, np.array(["a", "a"], object))]
    assert _regrouped_columnar(strings, ["p"]) is None
    assert _regrouped_columnar([None], ["p"]) is None


@settings(max_examples=200, deadline=None)
@given(partitions_runs(), st.integers(1, 8))
def test_left_out_columnar_equals_the_per_partition_runs(parts: list, span: int) -> None:
    per, flat = as_runs(parts)
    partitions = [Partition(f"part-{i}", int(np.sum(lengths)), ("k", i)) for i, (lengths, _) in enumerate(parts)]
    assert left_out(flat, partitions, span) == left_out(per, partitions, span)
