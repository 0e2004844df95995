"""WindowDataset(device=...): batches cut on the training device, checked on the CPU device.

The device path runs the same code on ``"cpu"`` as on ``"cuda"`` (only the
upload differs: pinned staging and a side stream on CUDA), so every promise is
held here against the host path (bit for bit) and the brute-force oracle:
every window once, determinism, resume, ranks, mixtures, the two-buffer bound,
and DataLoader workers refused.
"""

from __future__ import annotations

import gc
import os
import pickle

import numpy as np
import pytest
import torch
from helpers import make_frames, oracle_starts, threads_started_here, write_parquet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dask_windows as dw
from dask_windows.errors import ConfigError
from dask_windows.ondevice import Traffic, resolve_device, standardize_windows
from dask_windows.ondevice.masks import subsequence_mask

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
FEATURES = ["f0", "f1", "f2"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    frames = make_frames(seed=3, num_files=5, num_series=14, min_len=20, max_len=120)
    root = str(tmp_path_factory.mktemp("ondevice"))
    write_parquet(frames, root, row_group_size=40)
    return root, frames


def _open(root: str, device=None, **kw) -> dw.WindowDataset:
    settings = dict(
        features=FEATURES, series="sid", window=8, batch_size=16, seed=5, buffer_partitions=1, pieces_per_partition=1
    )
    settings.update(kw)
    return dw.WindowDataset(root, device=device, **settings)


def _columns(batch) -> tuple:
    return batch if isinstance(batch, tuple) else (batch,)


def _equal(host: list, device: list) -> None:
    """The two epochs hold the same tensors, bit for bit, dtype and shape included, in order."""
    assert len(host) == len(device)
    for a, b in zip(host, device):
        a, b = _columns(a), _columns(b)
        assert len(a) == len(b)
        for u, v in zip(a, b):
            assert u.dtype == v.dtype and u.shape == v.shape and u.is_contiguous() and v.is_contiguous()
            assert torch.equal(u, v)


SETTINGS = [
    {},
    {"targets": ["y"]},
    {"targets": ["y", "z"], "horizon": 3, "return_index": True},
    {"layout": "NLC", "targets": ["y"], "stride": 3},
    {"shuffle": False, "drop_last": True, "batch_size": 7},
    {"normalize": {"mean": [1.0, 2.0, 3.0], "std": [2.0, 0.5, 4.0]}, "window": 5},
    {"prefetch_partitions": 0, "batch_size": 13},
    {"buffer_partitions": 2, "pieces_per_partition": None, "batch_size": 64},
]


@pytest.mark.parametrize("kw", SETTINGS, ids=[",".join(k) or "plain" for k in SETTINGS])
def test_device_batches_are_the_host_batches_bit_for_bit(data, kw):
    root, _ = data
    ds = _open(root, "cpu", **kw)
    device = list(ds)
    # the host path in the order the device dataset took (the pool order when pieces_per_partition is None)
    host = {**kw, "pieces_per_partition": ds.config.order.pieces_per_partition}
    _equal(list(_open(root, **host)), device)
    assert all(t.device.type == "cpu" for b in device for t in _columns(b))
    traffic = ds.device_traffic
    assert traffic.batches == len(device) == len(ds) and traffic.peak_resident <= 2
    if kw.get("prefetch_partitions") == 0:
        assert traffic.peak_resident == 1  # nothing is built ahead


@pytest.mark.parametrize("stride", [1, 4])
def test_every_window_once_with_the_oracle_values(data, stride):
    root, frames = data
    window, horizon = 8, 2
    ds = _open(root, "cpu", targets=["y"], horizon=horizon, stride=stride, return_index=True, batch_size=10)
    starts, seen = [], 0
    table = np.concatenate([f[[*FEATURES, "y"]].to_numpy(np.float32) for f in frames])  # (rows, C + 1)
    for x, y, index in ds:
        rows = index.numpy()
        starts.append(rows)
        seen += len(rows)
        # every window's values are the oracle rows: features [s, s + L), targets [s + L, s + L + H)
        expect_x = np.stack([table[s : s + window, :3].T for s in rows])
        expect_y = np.stack([table[s + window : s + window + horizon, 3][None] for s in rows])
        assert np.array_equal(x.numpy(), expect_x) and np.array_equal(y.numpy(), expect_y)
    starts = np.concatenate(starts)
    assert seen == len(starts) == len(np.unique(starts))
    assert np.array_equal(np.sort(starts), oracle_starts(frames, "sid", window, stride, horizon))


def test_sample_normalization_within_float_rounding_of_the_host_and_the_oracle(data):
    root, _ = data
    kw = {"normalize": "sample", "window": 24, "return_index": True, "batch_size": 32}
    host, device = list(_open(root, **kw)), list(_open(root, "cpu", **kw))
    raw = {
        int(s): w
        for x, index in _open(root, "cpu", window=24, return_index=True, batch_size=32)
        for s, w in zip(index, x)
    }
    assert len(host) == len(device)
    for (hx, hi), (dx, di) in zip(host, device):
        assert torch.equal(hi, di)
        assert torch.allclose(dx, hx, rtol=1e-5, atol=2e-5)
        for s, w in zip(di.tolist(), dx):  # the oracle in float64 from the raw window
            values = raw[s].double()
            std = values.std(-1, correction=0, keepdim=True).clamp_min(1e-8)
            assert torch.allclose(w.double(), (values - values.mean(-1, keepdim=True)) / std, rtol=1e-5, atol=2e-5)


def test_standardize_windows_constant_windows_become_zeros_both_layouts():
    x = torch.randn(4, 3, 10) * 5 + 2
    x[1, 2] = 7.25  # a constant window and channel
    z = standardize_windows(x.clone(), channel_major=True)
    assert torch.equal(z[1, 2], torch.zeros(10))
    assert torch.allclose(z.mean(-1), torch.zeros(4, 3), atol=1e-5)
    nlc = standardize_windows(x.transpose(1, 2).contiguous(), channel_major=False)
    assert torch.allclose(nlc.transpose(1, 2), z, atol=1e-6)


def test_same_epoch_same_batches_and_another_epoch_another_order(data):
    root, _ = data
    ds = _open(root, "cpu", return_index=True)
    ds.set_epoch(2)
    first = list(ds)
    ds.set_epoch(2)
    again = list(ds)  # the next pass may come from a builder started ahead (nextpass): rows sent on use
    _equal(first, again)
    ds.set_epoch(3)
    other = list(ds)
    assert not all(torch.equal(a[1], b[1]) for a, b in zip(first, other))
    host = _open(root, return_index=True)
    host.set_epoch(3)
    _equal(list(host), other)
    assert ds.device_traffic.peak_resident <= 2


def test_mid_epoch_resume_yields_the_rest_of_the_host_epoch(data):
    root, _ = data
    kw = {"targets": ["y"], "return_index": True}
    ds = _open(root, "cpu", **kw)
    ds.set_epoch(1)
    it = iter(ds)
    taken = [next(it) for _ in range(7)]
    state = pickle.loads(pickle.dumps(ds.state_dict()))
    del it
    resumed = _open(root, "cpu", **kw)
    resumed.load_state_dict(state)
    host = _open(root, **kw)
    host.set_epoch(1)
    _equal(list(host), taken + list(resumed))


def test_an_elastic_resume_on_one_rank_is_the_host_paths(data):
    root, _ = data
    states = []
    for rank in (0, 1):  # two ranks stop after 3 batches each
        ds = _open(root, "cpu", return_index=True, rank=rank, world_size=2)
        it = iter(ds)
        for _ in range(3):
            next(it)
        states.append(ds.state_dict())
        del it
    assert states[0] == states[1]
    rest = []
    for device in ("cpu", None):  # the rest of the epoch re-cut for one rank
        ds = _open(root, device, return_index=True, world_size=1)
        ds.load_state_dict(pickle.loads(pickle.dumps(states[0])))
        rest.append(list(ds))
    _equal(rest[1], rest[0])
    taken = np.concatenate([index.numpy() for _, index in rest[0]])  # the rest: every window not yet yielded
    assert len(taken) == len(np.unique(taken)) == _open(root).num_windows - 2 * 3 * 16


def test_two_ranks_split_the_epoch_as_the_host_path_does(data):
    root, frames = data
    seen = []
    for rank in (0, 1):
        kw = {"return_index": True, "rank": rank, "world_size": 2}
        device = list(_open(root, "cpu", **kw))
        _equal(list(_open(root, **kw)), device)
        seen.append(np.concatenate([index.numpy() for _, index in device]))
    assert len(seen[0]) == len(seen[1]) and not set(seen[0]) & set(seen[1])
    every = oracle_starts(frames, "sid", 8)
    assert set(seen[0]) | set(seen[1]) <= set(every) and len(every) - 2 * len(seen[0]) < 2


def test_a_mixture_of_device_datasets_is_the_host_mixture(data, tmp_path):
    root, _ = data
    other = str(tmp_path / "other")
    write_parquet(make_frames(seed=9, num_files=2, num_series=5, min_len=30, max_len=90), other)

    def mixture(device):
        members = {"a": _open(root, device, targets=["y"]), "b": _open(other, device, targets=["y"], seed=2)}
        return dw.mix(members, {"a": 2.0, "b": 1.0}, windows_per_epoch=300, batch_size=20, return_source=True)

    device = list(mixture("cpu"))
    _equal(list(mixture(None)), device)
    assert len(device) == 15


def test_a_mixture_of_host_and_device_members_is_refused(data):
    root, _ = data
    with pytest.raises(ConfigError, match="device"):
        dw.mix({"a": _open(root, "cpu"), "b": _open(root)})


def test_dataloader_workers_are_refused_with_the_remedy(data):
    root, _ = data
    loader = torch.utils.data.DataLoader(_open(root, "cpu"), batch_size=None, num_workers=1)
    it = iter(loader)
    try:
        next(it)
    except ConfigError as error:  # raised in the worker, re-raised here
        message = str(error)
    else:
        pytest.fail("a DataLoader worker yielded a device batch")
    del it  # its worker stops now (the error, which held the iterator, is gone with the except block)
    assert "num_workers=0" in message and "device='cpu'" in message
    same = list(torch.utils.data.DataLoader(_open(root, "cpu"), batch_size=None, num_workers=0))
    _equal(list(_open(root)), same)


def test_bytes_sent_at_stride_one_are_far_fewer_than_the_host_batches(data):
    root, _ = data
    kw = {"window": 32, "batch_size": 32, "buffer_partitions": 5, "next_pass_seconds": 0}  # one epoch's sends
    ds = _open(root, "cpu", pieces_per_partition=1, **kw)
    host_bytes = sum(x.numel() * 4 for x in _open(root, **kw))
    assert sum(1 for _ in ds)
    # each row once (about 1/32 of the windows' values), plus a start per window: 8 of its 384 bytes
    assert host_bytes > 10 * ds.device_traffic.total_bytes


def test_an_early_break_leaves_no_thread_and_no_resident_buffer(data):
    root, _ = data
    ds = _open(root, "cpu", next_pass_seconds=0)
    it = iter(ds)
    next(it), next(it)
    it.close()
    del it
    gc.collect()
    assert ds.device_traffic.resident == 0
    assert not [t for t in threads_started_here() if t.is_alive()]


def test_masks_on_device_batches_are_the_masks_of_host_batches(data):
    root, _ = data
    host, device = _open(root), _open(root, "cpu")
    for a, b in zip(host, device):
        ga, gb = torch.Generator().manual_seed(1), torch.Generator(device=b.device).manual_seed(1)
        assert torch.equal(subsequence_mask(a, 0.3, 3, generator=ga), subsequence_mask(b, 0.3, 3, generator=gb))


def test_device_setting_is_checked():
    assert resolve_device(None) is None
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == (torch.device("cuda") if torch.cuda.is_available() else None)
    with pytest.raises(ConfigError, match="not a torch device"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA is not available"):
            resolve_device("cuda")


def test_traffic_and_a_device_dataset_pickle(data):
    root, _ = data
    ds = _open(root, "cpu")
    sum(1 for _ in ds)
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.device == torch.device("cpu") and copy.device_traffic.units == ds.device_traffic.units
    copy.device_traffic.landed(4)
    assert copy.device_traffic.row_bytes == ds.device_traffic.row_bytes + 4 and isinstance(copy.device_traffic, Traffic)


@CUDA
def test_cuda_batches_equal_the_host_batches(data):
    root, _ = data
    kw = {"targets": ["y", "z"], "horizon": 2, "return_index": True}
    device = [tuple(t.cpu() for t in b) for b in _open(root, "cuda", **kw)]
    _equal(list(_open(root, **kw)), device)


def test_the_benchmark_counts_over_100x_fewer_bytes_at_stride_one_and_l512():
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(os.path.dirname(__file__)).resolve().parents[1] / "benchmarks"))
    try:
        import bench_device
    finally:
        sys.path.pop(0)
    args = bench_device.parse_args(["--sizes", "3000"])
    data = bench_device.series(3000)
    host, device = bench_device.epoch(data, None, args), bench_device.epoch(data, "cpu", args)
    windows = 3000 - 512 + 1
    assert host["windows"] == device["windows"] == windows and host["batches"] == device["batches"]
    assert host["bytes"] == windows * 4 * 512 * 4  # every window's values
    assert device["bytes"] == 3000 * 4 * 4 + windows * 8  # every row once, a start per window
    assert host["bytes"] > 100 * device["bytes"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(5, 90), min_size=1, max_size=5),
    window=st.integers(1, 12),
    stride=st.integers(1, 4),
    batch_size=st.integers(1, 40),
    pieces=st.integers(1, 4),
    drop_last=st.booleans(),
    seed=st.integers(0, 3),
)
def test_batch_cuts_across_buffers_match_the_host_path(lengths, window, stride, batch_size, pieces, drop_last, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal((n, 2), dtype=np.float32) for n in lengths]
    if sum(max(n - window + 1, 0) for n in lengths) == 0:
        return  # no window at all: the dataset refuses to open (tested elsewhere)
    kw = dict(
        window=window, stride=stride, batch_size=batch_size, pieces_per_partition=pieces, drop_last=drop_last,
        seed=seed, buffer_partitions=1, partition_rows=32, return_index=True,
    )  # fmt: skip
    device = dw.WindowDataset(arrays, device="cpu", **kw)
    _equal(list(dw.WindowDataset(arrays, **kw)), list(device))
    assert device.device_traffic.peak_resident <= 2


def test_device_mode_takes_the_pool_order_budget(data):
    root, _ = data
    ds = _open(root, "cpu", pieces_per_partition=None, buffer_bytes=1 << 20)
    assert ds.spec.buffer_bytes == 1 << 20 and ds.config.order.pieces_per_partition is None  # (ondevice.pool)
