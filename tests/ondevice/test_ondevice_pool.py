"""Device mode on the pool order (``ondevice.pool``), checked on the CPU device against the host pool order.

Each unit's rows cross to the device once per epoch into a pool there, and every
batch is gathered on the device from the steps the host's plan gives: so the
batches must be the host pool order's bit for bit (the same seed and epoch),
whole epochs long, over layouts whose pools wrap (small budgets), at strides 1
and above, with targets, a horizon and the index, after a mid-epoch or elastic
resume, per rank; the bytes sent are the units' rows once (counted against the
plan, and row groups decoded once against the source), and the device pool
stays within ``buffer_bytes``.
"""

from __future__ import annotations

import gc
import pickle
from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import make_frames, oracle_starts, threads_started_here, write_parquet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dask_windows as dw
from dask_windows.planning.world import World

pytestmark = pytest.mark.filterwarnings("ignore::dask_windows.runtime.pool.PoolWarning")  # small budgets on purpose
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
FEATURES = ["f0", "f1", "f2"]


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """Three layouts: series across row groups of 40 rows; one long series in 6 files of 3 row groups;
    numpy arrays (units cut by the budget)."""
    groups = str(tmp_path_factory.mktemp("groups"))
    frames = make_frames(seed=3, num_files=5, num_series=14, min_len=20, max_len=120)
    write_parquet(frames, groups, row_group_size=40)
    long = str(tmp_path_factory.mktemp("long"))
    rows = np.arange(6 * 150)
    whole = pd.DataFrame({"f0": rows.astype(np.float32), "f1": np.sin(rows).astype(np.float32)})
    whole["f2"], whole["y"] = (rows % 7).astype(np.float32), (rows * 0.5).astype(np.float32)
    files = [whole.iloc[a : a + 150].reset_index(drop=True) for a in range(0, len(whole), 150)]
    write_parquet(files, long, row_group_size=50)  # (windows do not cross files: no series column says they may)
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal((n, 3), dtype=np.float32) for n in (700, 1_300, 90, 500)]
    return {"groups": (groups, frames), "long": (long, files), "arrays": (arrays, None)}


def _open(layouts, name: str, device=None, **kw) -> dw.WindowDataset:
    data, _ = layouts[name]
    base: dict = {"window": 8, "batch_size": 16, "seed": 5, "next_pass_seconds": 0}
    if name == "groups":
        base.update(features=FEATURES, series="sid")
    elif name == "long":
        base.update(features=FEATURES, series=None)
    else:
        base.update(partition_rows=600)
    return dw.WindowDataset(data, device=device, **{**base, **kw})


def _columns(batch) -> tuple:
    return batch if isinstance(batch, tuple) else (batch,)


def _equal(host: list, device: list, empty_ok: bool = False) -> None:
    """The two epochs hold the same tensors, bit for bit, dtype and shape included, in order (and at
    least one batch, unless ``empty_ok``: ``drop_last`` with fewer windows than a batch yields none)."""
    assert len(host) == len(device) and (empty_ok or len(host) > 0)
    for a, b in zip(host, device):
        a, b = _columns(a), _columns(b)
        assert len(a) == len(b)
        for u, v in zip(a, b):
            assert u.dtype == v.dtype and u.shape == v.shape and u.device.type == "cpu"
            assert torch.equal(u, v)


def _row_bytes(ds: dw.WindowDataset) -> int:
    """Bytes of one decoded row on the device: features float32, targets in their dtype."""
    return 4 * len(ds.spec.features) + 4 * len(ds.spec.targets)


CASES = [
    ("groups", {}),
    ("groups", {"targets": ["y", "z"], "horizon": 3, "return_index": True, "stride": 2}),
    ("groups", {"layout": "NLC", "targets": ["y"], "stride": 3, "buffer_bytes": 6_000, "batch_size": 5}),
    ("long", {"window": 16, "batch_size": 32, "buffer_bytes": 12_000, "targets": ["y"], "return_index": True}),
    ("long", {"shuffle": False, "drop_last": True, "batch_size": 7, "buffer_bytes": 12_000}),
    ("long", {"normalize": {"mean": [1.0, 2.0, 3.0], "std": [2.0, 0.5, 4.0]}, "window": 5, "stride": 4}),
    ("arrays", {"buffer_bytes": 64_000, "prefetch_partitions": 0, "batch_size": 13}),
    ("arrays", {"buffer_bytes": 64_000, "horizon": 2, "targets": [2], "features": [0, 1], "stride": 2}),
]


@pytest.mark.parametrize("name,kw", CASES, ids=[f"{n}:{','.join(k) or 'plain'}" for n, k in CASES])
def test_device_pool_batches_are_the_host_pool_batches_over_whole_epochs(layouts, name, kw):
    ds, host = _open(layouts, name, "cpu", **kw), _open(layouts, name, **kw)
    assert ds.spec.buffer_bytes is not None and ds.config.order.pieces_per_partition is None  # the pool order
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        host.set_epoch(epoch)
        before = ds.device_traffic.row_bytes
        device = list(ds)
        _equal(list(host), device)
        windows = sum(len(_columns(b)[0]) for b in device)
        # what crossed: each unit of the reader's plan once (its rows, with the few of a window across a cut)
        plan = ds._plan(World(), 0, epoch)
        assert ds.device_traffic.row_bytes - before == sum(u.num_rows for u in plan.units) * _row_bytes(ds)
    traffic = ds.device_traffic
    assert traffic.units == 2 * len(plan.units)
    # per batch only its starts (and the index rows with return_index) cross: 8 bytes a window each
    assert traffic.batches == 2 * len(ds) and traffic.index_bytes == 2 * 8 * windows * (1 + ds.spec.return_index)
    # the device pool: within the budget (the window starts it also counts stay on the host), one per pass
    assert 0 < traffic.pool_bytes <= ds.spec.buffer_bytes
    assert traffic.pool_bytes <= plan.pool_rows * _row_bytes(ds)
    assert traffic.peak_resident == 1 and traffic.resident == 0


def test_small_budgets_wrap_the_pool_and_every_row_crosses_about_once(layouts):
    """One long series in 18 row groups, a budget of a few: units reuse pool rows twice over; each row
    group is decoded once (counted at the source) and its rows sent once."""
    kw = {"window": 16, "batch_size": 8, "buffer_bytes": 12_000, "return_index": True}
    ds = _open(layouts, "long", "cpu", **kw)
    plan = ds._plan(World())
    assert plan.spread < len(plan.units) == 18 and plan.pool_rows < 900 // 1.5  # a few of the 18 units
    decoded: Counter = Counter()
    read = ds.source._read_table

    def counted(path, row_groups, columns):
        decoded.update((path, g) for g in row_groups)
        return read(path, row_groups, columns)

    ds.source._read_table = counted
    starts = np.concatenate([index.numpy() for _, index in ds])
    assert np.array_equal(np.sort(starts), oracle_starts(layouts["long"][1], None, 16))  # every window once
    assert len(decoded) == 18 and sum(decoded.values()) <= 1.25 * 18
    rows, cuts = 900, 12  # every row once; at each cut between a file's row groups, the rows a window across it needs
    assert rows * 12 <= ds.device_traffic.row_bytes <= (rows + cuts * 15) * 12
    assert ds.device_traffic.pool_bytes <= 12_000


def test_stride_one_sends_far_fewer_bytes_than_the_host_batches(layouts):
    kw = {"window": 32, "batch_size": 32}
    ds = _open(layouts, "groups", "cpu", **kw)
    host_bytes = sum(x.numel() * 4 for x in _open(layouts, "groups", **kw))
    assert sum(1 for _ in ds)
    rows = sum(len(f) for f in layouts["groups"][1])
    assert ds.device_traffic.row_bytes <= 1.25 * rows * 3 * 4  # each row about once
    assert host_bytes > 10 * ds.device_traffic.total_bytes  # (32 windows share a row: ~1/32, plus the starts)


def test_mid_epoch_resume_yields_the_rest_of_the_host_pool_epoch(layouts):
    """Also a regression test of the host pool order: a resume whose first unit needs rows an unread unit
    (released before the resume step) kept waited for them forever; they are read from the source now."""
    kw = {"targets": ["y"], "return_index": True, "buffer_bytes": 6_000, "batch_size": 8}
    ds = _open(layouts, "groups", "cpu", **kw)
    ds.set_epoch(1)
    it = iter(ds)
    taken = [next(it) for _ in range(11)]
    state = pickle.loads(pickle.dumps(ds.state_dict()))
    del it
    resumed = _open(layouts, "groups", "cpu", **kw)
    resumed.load_state_dict(state)
    rest = list(resumed)
    host = _open(layouts, "groups", **kw)
    host.set_epoch(1)
    whole = list(host)
    _equal(whole, taken + rest)
    host_resumed = _open(layouts, "groups", **kw)
    host_resumed.load_state_dict(state)
    _equal(whole[len(taken) :], list(host_resumed))
    # the resumed pass skipped the finished units without reading them: fewer units sent than a whole epoch
    assert 0 < resumed.device_traffic.units < len(resumed._plan(World(), 0, 1).units)


def test_two_ranks_and_an_elastic_resume_are_the_host_pool_orders(layouts):
    frames = layouts["groups"][1]
    kw = {"return_index": True, "buffer_bytes": 6_000}
    seen, states = [], []
    for rank in (0, 1):
        device = list(_open(layouts, "groups", "cpu", rank=rank, world_size=2, **kw))
        _equal(list(_open(layouts, "groups", rank=rank, world_size=2, **kw)), device)
        seen.append(np.concatenate([index.numpy() for _, index in device]))
        ds = _open(layouts, "groups", "cpu", rank=rank, world_size=2, **kw)
        it = iter(ds)
        for _ in range(3):  # both ranks stop after 3 batches
            next(it)
        states.append(ds.state_dict())
        del it
    assert len(seen[0]) == len(seen[1]) and not set(seen[0]) & set(seen[1])
    every = oracle_starts(frames, "sid", 8)
    assert set(seen[0]) | set(seen[1]) <= set(every) and len(every) - 2 * len(seen[0]) < 2
    assert states[0] == states[1]
    rest = []
    for device in ("cpu", None):  # the rest of the epoch re-cut for one rank
        ds = _open(layouts, "groups", device, world_size=1, **kw)
        ds.load_state_dict(pickle.loads(pickle.dumps(states[0])))
        rest.append(list(ds))
    _equal(rest[1], rest[0])
    taken = np.concatenate([index.numpy() for _, index in rest[0]])
    assert len(taken) == len(np.unique(taken)) == len(every) - 2 * 3 * 16


def test_a_mixture_of_device_pool_members_is_the_host_mixture(layouts):
    def mixture(device):
        members = {
            "a": _open(layouts, "groups", device, targets=["y"], buffer_bytes=6_000),
            "b": _open(layouts, "long", device, targets=["y"], seed=2),
        }
        return dw.mix(members, {"a": 2.0, "b": 1.0}, windows_per_epoch=300, batch_size=20, return_source=True)

    device = list(mixture("cpu"))
    _equal(list(mixture(None)), device)
    assert len(device) == 15


def test_sample_normalization_within_float_rounding_of_the_host_pool(layouts):
    kw = {"normalize": "sample", "window": 24, "return_index": True, "buffer_bytes": 12_000}
    host, device = list(_open(layouts, "groups", **kw)), list(_open(layouts, "groups", "cpu", **kw))
    assert len(host) == len(device)
    for (hx, hi), (dx, di) in zip(host, device):
        assert torch.equal(hi, di)
        assert torch.allclose(dx, hx, rtol=1e-5, atol=2e-5)


def test_an_early_break_leaves_no_thread_and_no_resident_pool(layouts):
    ds = _open(layouts, "long", "cpu", buffer_bytes=12_000)
    it = iter(ds)
    next(it), next(it)
    assert ds.device_traffic.resident == 1
    it.close()
    del it
    gc.collect()
    assert ds.device_traffic.resident == 0
    assert not [t for t in threads_started_here() if t.is_alive()]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(5, 400), min_size=1, max_size=4),
    window=st.integers(1, 12),
    stride=st.integers(1, 4),
    batch_size=st.integers(4, 40),
    budget=st.sampled_from([2_000, 6_000, 50_000]),
    drop_last=st.booleans(),
    seed=st.integers(0, 3),
)
def test_random_layouts_and_budgets_match_the_host_pool(lengths, window, stride, batch_size, budget, drop_last, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal((n, 2), dtype=np.float32) for n in lengths]
    if sum(max(n - window + 1, 0) for n in lengths) == 0:
        return  # no window at all: the dataset refuses to open (tested elsewhere)
    kw = dict(
        window=window, stride=stride, batch_size=batch_size, drop_last=drop_last, seed=seed, buffer_bytes=budget,
        partition_rows=128, return_index=True, next_pass_seconds=0,
    )  # fmt: skip
    device = dw.WindowDataset(arrays, device="cpu", **kw)
    host = dw.WindowDataset(arrays, **kw)
    assert len(host) == len(device)
    _equal(list(host), list(device), empty_ok=drop_last)
    # the device pool is at most the host plan's (which a budget too small for one unit exceeds: it warns)
    assert device.device_traffic.pool_bytes <= device._plan(World()).pool_rows * 2 * 4


@CUDA
def test_cuda_pool_batches_equal_the_host_pool_batches(layouts):
    kw = {"targets": ["y", "z"], "horizon": 2, "return_index": True, "buffer_bytes": 6_000}
    device = [tuple(t.cpu() for t in b) for b in _open(layouts, "groups", "cuda", **kw)]
    _equal(list(_open(layouts, "groups", **kw)), device)
