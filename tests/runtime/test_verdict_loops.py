"""The verdict on real loops (``benchmarks/bench_telemetry.py --verdict``): an input-bound loop (latency
injected into every read) is judged input-bound and a compute-bound one (a sleep per batch) is not, with no
worker, with two DataLoader worker processes (the loop's wait measured in this process, the stages unseen)
and on two ranks of a gloo group; in every case the verdict agrees with the loop's own wait share."""

from __future__ import annotations

import os
import sys

import pytest

from dask_windows.settings.tuning import INPUT_BOUND_SHARE

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "benchmarks"))

import bench_telemetry

READ_MS = 40.0  # injected into each read of the input-bound loop
# The compute-bound loop's step: well above a batch's transfer from a worker on a busy machine (at 80 ms, a suite
# run beside other jobs waited 10.4% with 2 workers and was judged input-bound).
STEP_MS = 250.0
SERIES, ROWS = 8, 1_000  # 8 units of 59 windows: 8 batches of 64


def _agrees(loop: str, share: float, input_bound: bool) -> None:
    assert input_bound == (share >= INPUT_BOUND_SHARE), (loop, share)  # never contradicts its own figure
    assert input_bound == (loop == "input-bound"), (loop, share)


@pytest.mark.parametrize("setting", ["0 workers", "2 workers"])
@pytest.mark.parametrize("loop", bench_telemetry.LOOPS)
def test_the_verdict_of_a_real_loop_in_this_process(setting, loop):
    stats = bench_telemetry.verdict_loop(setting, loop, READ_MS, STEP_MS, SERIES, ROWS)
    assert stats.batches == 8
    _agrees(loop, stats.verdict.wait_share, stats.verdict.input_bound)
    assert stats.stages_seen == (setting == "0 workers")
    if stats.verdict.input_bound and setting == "0 workers":  # the reads it slept in bound it
        assert stats.verdict.stage == "fetch" and stats.fetch_seconds >= READ_MS / 1e3 * SERIES
    if stats.verdict.input_bound and setting == "2 workers":  # the workers' reads are not seen here: said so
        assert stats.verdict.stage == "workers" and "num_workers=0" in stats.verdict.advice
        assert "not seen here" in stats.table()


def test_the_verdict_on_two_ranks():
    import forkrun

    ranks = bench_telemetry.rank_loops(READ_MS, STEP_MS, SERIES, ROWS, popen=forkrun.popen)
    for loop, figures in ranks.items():
        assert len(figures) == 2
        for rank in figures:
            assert rank["batches"] == 4 and rank["slowest_rank"] in (0, 1)
            _agrees(loop, rank["wait_share"], rank["input_bound"])
