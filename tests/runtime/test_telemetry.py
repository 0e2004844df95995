"""Telemetry (``dask_windows.telemetry``): the figures against a loop of known step time, and the verdict."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
import torch

from dask_windows import WindowDataset
from dask_windows.runtime.telemetry import STARTUP, Telemetry, judge
from dask_windows.settings.tuning import INPUT_BOUND_SHARE

# seconds of "training" per batch: long beside a batch's few milliseconds of loading even on a loaded CI machine
# (at 0.03 s a batch, 3-4 ms of scheduling delay a batch under load read as input-bound)
STEP = 0.5
READ_DELAY = 0.15  # seconds added to every read of the slowed loader


def _arrays(n: int = 6, rows: int = 600) -> list[np.ndarray]:
    return [np.random.default_rng(i).standard_normal((rows, 1)).astype(np.float32) for i in range(n)]


class SlowReads:
    """A source's ``read_ranges`` that sleeps first: the injected I/O delay."""

    def __init__(self, read, delay: float) -> None:
        self.read, self.delay = read, delay

    def __call__(self, *args, **kwargs):
        time.sleep(self.delay)
        return self.read(*args, **kwargs)


def _dataset(batch_size: int = 16, **kw) -> WindowDataset:
    return WindowDataset(
        _arrays(),
        window=16,
        stride=16,
        batch_size=batch_size,
        partition_rows=600,  # one partition per array
        buffer_partitions=1,
        pieces_per_partition=1,
        next_pass_seconds=0,  # no read of the next pass's first buffer inside this one
        **kw,
    )


def test_a_loop_with_a_known_step_is_compute_bound():
    ds = _dataset(batch_size=64)  # 4 batches of STEP each
    for _ in ds:
        time.sleep(STEP)
    stats = ds.stats()
    assert stats.batches == len(ds)
    assert stats.step_seconds >= STEP * (len(ds) - 1)  # the sleeps between batches, at least
    assert stats.wait_seconds < stats.step_seconds
    assert not stats.verdict.input_bound and stats.verdict.stage is None
    assert stats.open_seconds > 0 and stats.reads == len(ds.partitions) and stats.fetch_bytes > 0
    assert "not input-bound" in stats.table()


def test_a_loader_slowed_by_its_reads_is_input_bound_by_fetch():
    ds = _dataset()
    ds.source.read_rows = SlowReads(ds.source.read_rows, READ_DELAY)
    batches = sum(1 for _ in ds)
    stats = ds.stats()
    assert batches == stats.batches == len(ds)
    assert stats.reads == len(ds.partitions)
    assert stats.fetch_seconds >= READ_DELAY * stats.reads  # each read slept at least that long
    assert stats.verdict.input_bound and stats.verdict.stage == "fetch"
    assert "num_workers" in stats.verdict.advice
    assert stats.as_dict()["verdict"]["stage"] == "fetch"


def test_each_pass_counts_its_own_batches_and_an_early_break_closes_the_pass():
    ds = _dataset(prefetch_partitions=0)
    it = iter(ds)
    next(it)
    next(it)
    it.close()
    assert ds.stats().batches == 2
    assert sum(1 for _ in ds) == ds.stats().batches == len(ds)


def test_workers_stages_are_not_seen_but_the_loop_wait_is():
    ds = _dataset()
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1)
    assert sum(1 for _ in ds.watch(loader)) == len(ds)
    stats = ds.stats()
    assert stats.batches == len(ds) and not stats.stages_seen and stats.reads == 0
    assert "DataLoader workers" in stats.table()


def test_judge_rules():
    assert not judge(0.0, 1.0, 10, {"fetch": 1.0}).input_bound
    slow = judge(0.9, 0.1, 10, {"fetch": 0.1, "decode": 0.2, "buffer": 0.0, "gather": 0.5})
    assert slow.input_bound and slow.stage == "gather" and "num_workers" in slow.advice
    assert judge(0.9, 0.1, 10, None).stage == "workers"


STAGES = ("fetch", "decode", "buffer", "gather", "device")


@pytest.mark.parametrize("order", ["pool", "buffer", None])
def test_the_verdict_is_input_bound_exactly_when_the_wait_share_reaches_the_threshold(order):
    for wait, step, batches in itertools.product(
        [0.0, 1e-4, 0.05, 0.0999, 0.1, 0.5, 3.0], [0.0, 1e-4, 0.9, 2.0], [1, 10**5]
    ):
        share = wait / (wait + step) if wait + step else 0.0
        verdict = judge(wait, step, batches, {"fetch": wait}, order=order)
        assert verdict.input_bound == (share >= INPUT_BOUND_SHARE), (wait, step, batches)
        assert verdict.wait_share == share
        if verdict.input_bound:  # however short each wait (0.5 s over 10^5 batches: 5 us each)
            assert str(verdict).startswith("input-bound") and verdict.stage == "fetch"
        else:
            assert "not input-bound" in str(verdict) and verdict.stage is None


def test_the_bound_is_the_stage_with_the_most_exposed_seconds_and_its_remedy_exists_in_the_order():
    for stage in STAGES:
        stages = {name: 1.0 if name == stage else 0.5 for name in STAGES}
        pool = judge(0.5, 0.5, 10, stages, order="pool")
        assert pool.stage == stage and pool.input_bound
        for setting in ("buffer_partitions", "prefetch_partitions"):  # settings the pool order does not use
            assert setting not in pool.advice, (stage, pool.advice)
        assert judge(0.5, 0.5, 10, stages, order="buffer").stage == stage
    assert "num_workers" in judge(0.5, 0.5, 10, {"fetch": 1.0}, order="pool").advice


def test_a_loop_that_waited_only_for_its_first_batch_is_bound_by_start_up():
    verdict = judge(0.001, 0.034, 100, {"fetch": 0.001}, first=1.0, order="pool")
    assert not verdict.input_bound and verdict.stage == STARTUP
    assert verdict.startup_share == pytest.approx(1.0 / 1.035)
    assert str(verdict).startswith("bound by start-up: the loop waited 96.6% of its time for its first batch")
    assert "buffer_bytes" in verdict.advice and "not input-bound" not in str(verdict)
    assert judge(0.001, 1.0, 100, None, first=0.05).stage is None  # a short start-up is no bound


def test_exposed_seconds_count_the_reads_waited_for_and_never_halve_them():
    t = Telemetry()
    stages = t.exposed(fetch_ns=6 * 10**9, decode_ns=2 * 10**9, buffer_wait_ns=9 * 10**9, reads_waited_ns=8 * 10**9,
                       gather_ns=10**9, device_ns=0)  # fmt: skip
    assert stages == pytest.approx({"fetch": 6.0, "decode": 2.0, "buffer": 1.0, "gather": 1.0, "device": 0.0})
    # reads the loop did not wait for (read ahead while it worked) are not exposed
    assert t.exposed(8 * 10**9, 0, 10**9, 10**9, 0, 0)["fetch"] == pytest.approx(1.0)


def _pool_dataset(**kw) -> WindowDataset:
    """The default pool order over 12 one-unit arrays, its budget holding one unit: every step reads one."""
    return WindowDataset(_arrays(n=12), window=16, stride=16, batch_size=16, buffer_bytes=8 << 10, **kw)


def test_a_pool_order_loop_slowed_by_its_reads_is_input_bound_by_fetch():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PoolWarning: the budget holds one unit, on purpose
        ds = _pool_dataset()
    assert ds.spec.buffer_bytes is not None
    ds.source.read_rows = SlowReads(ds.source.read_rows, 0.05)
    assert sum(1 for _ in ds) == len(ds)
    stats = ds.stats()
    assert stats.reads_waited_seconds >= 0.05 * (stats.reads - 3)  # the pool order counts its waits for reads
    assert stats.verdict.input_bound and stats.verdict.stage == "fetch", stats.table()
    assert "num_workers" in stats.verdict.advice and "prefetch_partitions" not in stats.verdict.advice


def test_a_pool_order_loop_with_a_known_step_is_compute_bound():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = WindowDataset(_arrays(n=12), window=16, stride=16, batch_size=128, next_pass_seconds=0)  # 4 batches
    for _ in ds:
        time.sleep(STEP)
    stats = ds.stats()
    assert not stats.verdict.input_bound and stats.verdict.stage in (None, STARTUP), stats.table()


def test_bench_counts_the_reads_of_the_pool_order(tmp_path):
    import pandas as pd

    from dask_windows.cli.bench import bench

    for i in range(2):
        pd.DataFrame({"f0": np.arange(2000, dtype=np.float32)}).to_parquet(tmp_path / f"part-{i}.parquet")
    out = bench(str(tmp_path), features=["f0"], window=16, batch_size=16, seconds=30)
    assert out["stats"]["verdict"]["text"] and out["batches"] > 0
    assert out["read_share"] > 0  # reads go through read_rows, not source.read


@pytest.mark.parametrize("nested", [False, True])
def test_a_watched_loader_over_the_dataset_counts_once(nested):
    ds = _dataset()
    loader = torch.utils.data.DataLoader(ds, batch_size=None)
    batches = sum(1 for _ in (ds.watch(loader) if nested else loader))
    assert ds.stats().batches == batches == len(ds)
    assert ds.stats().stages_seen


def test_telemetry_pickles_as_fresh_counters():
    import pickle

    t = Telemetry(123)
    t.add_read(5, 6, 7)
    again = pickle.loads(pickle.dumps(t))
    assert again.open_ns == 123 and again.reads == 0


def test_a_mixture_counts_the_loop_and_its_members_reads():
    from dask_windows import mix

    a, b = _dataset(), _dataset()
    b.source.read_rows = SlowReads(b.source.read_rows, READ_DELAY)
    mixture = mix({"a": a, "b": b}, batch_size=16)
    batches = sum(1 for _ in mixture)
    stats = mixture.stats()
    assert batches == stats.batches == len(mixture)
    assert stats.reads >= len(b.partitions) and stats.fetch_seconds >= READ_DELAY * len(b.partitions)
    assert stats.open_seconds == pytest.approx(a.stats().open_seconds + b.stats().open_seconds)


def test_the_default_pool_order_reports_its_reads_and_buffer_waits():
    arrays = _arrays()
    ds = WindowDataset(arrays, window=16, stride=16, batch_size=16, buffer_bytes=1 << 20)
    assert ds.spec.buffer_bytes is not None  # the pool order
    assert sum(1 for _ in ds) == len(ds)
    stats = ds.stats()
    assert stats.reads >= 1 and stats.fetch_seconds > 0 and stats.decode_seconds > 0  # (small arrays: merged units)
    assert 0 < stats.fetch_bytes <= sum(a.shape[0] * a.shape[1] for a in arrays) * 4  # no row read twice
    assert stats.stages_seen
