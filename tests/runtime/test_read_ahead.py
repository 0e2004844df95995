"""How far the reads run ahead of the consumer, against the plan: a whole buffer plus the prefetch depth.

While the consumer drains buffer ``b``, the builder assembles buffer ``b + 1`` (taking its units as
the readers finish them) and the readers read ``depth`` units beyond it, ``depth`` being
``prefetch_partitions`` partitions' worth of units and at least one per reader thread
(``reading.read_ahead``). So ``prefetch_partitions`` below ``buffer_partitions`` does not make the
next buffer's reads wait for the consumer: they all run during the drain. Checked with the consumer
holding each buffer's last batch: the readers reach exactly that many units (waited for, without a
timing assertion) and never more (the memory formula counts no more).
"""

from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import pytest
from helpers import write_parquet

import dask_windows as dw
from dask_windows.planning.world import World
from dask_windows.runtime import reading

FILES, WINDOWS, WINDOW, BATCH = 8, 32, 16, 8  # per file: WINDOWS windows of WINDOW rows (stride = window)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    rng = np.random.default_rng(0)
    frames = []
    for i in range(FILES):
        rows = WINDOWS * WINDOW
        frames.append(
            pd.DataFrame({"f0": np.arange(i * rows, (i + 1) * rows, dtype=np.float32), "f1": rng.random(rows)})
        )
    path = tmp_path_factory.mktemp("ahead")
    write_parquet(frames, str(path), row_group_size=128)
    return str(path)


@pytest.mark.parametrize("buffer_partitions,prefetch_partitions", [(2, 1), (4, 1), (2, 2), (1, 3), (2, 0)])
def test_reads_run_a_buffer_plus_the_prefetch_depth_ahead_of_the_consumer(
    root, monkeypatch, buffer_partitions, prefetch_partitions
):
    started = [0]
    moved = threading.Condition()
    read_unit = reading.read_unit

    def counted(*args, **kwargs):
        with moved:
            started[0] += 1
            moved.notify_all()
        return read_unit(*args, **kwargs)

    monkeypatch.setattr(reading, "read_unit", counted)
    ds = dw.WindowDataset(
        root, features=["f0", "f1"], series=None, window=WINDOW, stride=WINDOW, batch_size=BATCH,
        pieces_per_partition=1, buffer_partitions=buffer_partitions, prefetch_partitions=prefetch_partitions,
        next_pass_seconds=0,  # this pass's reads only (the next pass's read-ahead: tests/speedups/test_next_pass.py)
    )  # fmt: skip
    plan = ds._plan(World(0, 1, 0, 1), 0, 0)
    units = reading.piece_units(plan)
    assert len(units) == FILES  # one unit per partition (whole partitions)
    depth = reading.read_ahead(ds._read_values(), plan, units, reading.READ_THREADS)
    assert depth == (max(prefetch_partitions, reading.READ_THREADS) if prefetch_partitions else 0)
    per_buffer = [len(group) for group in plan.buffers]  # units of each buffer
    through = np.cumsum(per_buffer)  # (buffers,) units up to the end of each buffer
    batches_per_buffer = buffer_partitions * WINDOWS // BATCH
    for k, _ in enumerate(ds):
        b, last = divmod(k, batches_per_buffer)
        if prefetch_partitions == 0:  # everything on the consumer's thread: a buffer is read when needed
            assert started[0] == through[b]
            continue
        expect = int(min(len(units), (through[b + 1] if b + 1 < len(through) else through[b]) + depth))
        if last == batches_per_buffer - 1:  # holding buffer b's last batch: the readers get there
            with moved:
                assert moved.wait_for(lambda e=expect: started[0] >= e, timeout=120), (b, started[0], expect)
        assert started[0] <= expect, f"buffer {b}: {started[0]} units read, at most {expect} expected"
