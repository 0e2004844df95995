"""A damaged dataset index is refused with the remedy, never a crash, an unclear error or other batches.

Each flip runs in a forked child (``tests/index_flips``): on the index format 1 some flips aborted the
process in pyarrow (a damaged footer parsed by its private unpickling function), asked for memory
without bound, or changed the batches silently. ``benchmarks/bench_index_flips.py`` flips every byte.
"""

from __future__ import annotations

import collections
import os
import sys

import index_flips
import pytest

from dask_windows.errors import DataError
from dask_windows.sources.parquet.footer_index import INDEX_NAME

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="forks a child per flip")


def test_a_byte_flipped_anywhere_in_the_index_is_refused_or_changes_nothing(tmp_path):
    root = str(tmp_path / "data")
    index, blob, want = index_flips.make_dataset(root)
    positions = index_flips.spread(blob, 40, 24)  # 40 over the file, and the end of its footer
    outcomes = index_flips.flip_outcomes(root, index, blob, want, positions)
    bad = {p: o for p, o in outcomes.items() if o in ("unclear", "silent", "crash")}
    assert not bad, f"{collections.Counter(outcomes.values())}; at {bad}"
    assert collections.Counter(outcomes.values())["refused"] >= len(positions) // 2


def test_a_truncated_or_foreign_index_is_refused_with_the_remedy(tmp_path):
    from helpers import collect

    from dask_windows.dataset import WindowDataset

    root = str(tmp_path / "data")
    index, blob, _ = index_flips.make_dataset(root)
    for damaged in (blob[: len(blob) // 2], blob[:-1], b"PAR1" + os.urandom(64) + b"PAR1", b""):
        with open(index, "wb") as dst:
            dst.write(damaged)
        with pytest.raises(DataError, match=rf"{INDEX_NAME} is not a readable dataset index.*dask-windows index"):
            collect(WindowDataset(root, **index_flips.KW))
