"""The runtime's contract: every allocator x batch output x source x order gives the oracle's windows.

A pass is driven through its runtime entry point (``runtime.pool.pool_batches`` for the pool order,
whole partitions too) with frozen values (``runtime.values``) whose
seams (``runtime.seams``) are injected with ``dataclasses.replace``, never monkeypatched:

* allocator: plain numpy (``NumpyAllocator``) or shared slots (``speedups.slots.SlotAllocator``, which
  uses slots only inside a DataLoader worker: that case runs in one);
* batch output: torch tensors, numpy arrays, pinned tensors (CUDA only: skipped here without it);
* source: Parquet files (two row groups each), numpy arrays, an Arrow table.

Against a brute-force numpy oracle: every valid window start exactly once, each window's values
and target those of its rows; and every combination yields the same batches, bit for bit, as the
plain one (threads, numpy, torch). Torch runs two intra-op threads, as in a user's process.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from helpers import oracle_starts, write_parquet

from dask_windows.dataset import WindowDataset
from dask_windows.planning.world import World
from dask_windows.runtime.pool import pool_batches
from dask_windows.runtime.seams import NumpyAllocator, NumpyOutput, PinnedOutput, TorchOutput
from dask_windows.speedups.slots import SlotAllocator

FILES, ROWS, CHANNELS = 4, 5_000, 4
KW = dict(window=256, stride=8, batch_size=64, return_index=True, seed=3)  # 256 KiB of features per batch
ORDERS = {"pool": {}, "whole": {"pieces_per_partition": 1, "buffer_partitions": 2}}
SOURCES = ("parquet", "arrays", "arrow")


def _frames() -> list[pd.DataFrame]:
    """One series per file; ``f0`` is the dataset row, so a window's values prove which rows it holds."""
    rng = np.random.default_rng(7)
    out = []
    for f in range(FILES):
        rows = np.arange(f * ROWS, (f + 1) * ROWS)
        frame = pd.DataFrame({"f0": rows.astype(np.float32)})
        for c in range(1, CHANNELS):
            frame[f"f{c}"] = rng.standard_normal(ROWS).astype(np.float32)
        frame["y"] = (rows * 0.5).astype(np.float32)
        out.append(frame)
    return out


FEATURES = [f"f{c}" for c in range(CHANNELS)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("contract"))
    frames = _frames()
    write_parquet(frames, root, row_group_size=ROWS // 2)
    whole = pd.concat(frames, ignore_index=True)
    return {
        "root": root,
        "frames": frames,
        "x": whole[FEATURES].to_numpy(np.float32),  # (rows, C) the oracle's values
        "y": whole["y"].to_numpy(np.float32),
        "starts": oracle_starts(frames, None, KW["window"], KW["stride"]),
    }


@pytest.fixture(autouse=True)
def two_torch_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the default gather: torch's threads, once numpy's warm-up is timed
    yield
    torch.set_num_threads(before)


def _dataset(data: dict, source: str, order: str, **kw) -> WindowDataset:
    if source == "parquet":
        given: object = data["root"]
        columns: dict = {"features": FEATURES, "targets": ["y"], "series": None}
    elif source == "arrays":  # each array one series: features then the target as its last column
        given = [
            np.column_stack([f[FEATURES].to_numpy(np.float32), f["y"].to_numpy(np.float32)]) for f in data["frames"]
        ]
        columns = {"features": list(range(CHANNELS)), "targets": [CHANNELS]}
    else:  # one table, a series per file's rows, cut into partitions of about 3,000 rows
        frames = [f.assign(sid=i) for i, f in enumerate(data["frames"])]
        given = pa.Table.from_pandas(pd.concat(frames, ignore_index=True), preserve_index=False)
        columns = {"features": FEATURES, "targets": ["y"], "series": "sid", "partition_rows": 3_000}
    return WindowDataset(given, **columns, **{**KW, **ORDERS[order], "next_pass_seconds": 0, **kw})


def _run(ds: WindowDataset, **seams) -> list[tuple[np.ndarray, ...]]:
    """One pass of epoch 0 through the runtime entry point of ``ds``'s order, with ``seams`` injected."""
    values = dataclasses.replace(ds._pass_values(), **seams)
    plan = ds._plan(World(), 0, 0)
    run = pool_batches
    return [tuple(np.array(t) for t in batch) for batch in run(values, plan)]  # copies: arrays may be reused


def _check_oracle(data: dict, batches: list[tuple[np.ndarray, ...]], layout: str = "NCL") -> None:
    x = np.concatenate([b[0] for b in batches])
    y = np.concatenate([b[1] for b in batches])
    rows = np.concatenate([b[2] for b in batches])
    assert np.array_equal(np.sort(rows), data["starts"])  # every valid window exactly once
    window = KW["window"]
    at = rows[:, None] + np.arange(window)  # (N, L) each window's dataset rows
    want = data["x"][at]  # (N, L, C)
    assert np.array_equal(x, want.transpose(0, 2, 1) if layout == "NCL" else want)
    assert np.array_equal(y.reshape(len(rows), -1)[:, 0], data["y"][rows + window - 1])  # target at the last row
    assert all(len(b[0]) == KW["batch_size"] for b in batches[:-1])


def _same(a: list[tuple[np.ndarray, ...]], b: list[tuple[np.ndarray, ...]]) -> bool:
    return len(a) == len(b) and all(
        len(p) == len(q) and all(np.array_equal(u, v) for u, v in zip(p, q)) for p, q in zip(a, b)
    )


@pytest.mark.parametrize("order", list(ORDERS))
@pytest.mark.parametrize("source", SOURCES)
def test_every_output_gives_the_oracle_and_the_same_batches(data, source, order):
    ds = _dataset(data, source, order)
    plain = _run(ds, output=TorchOutput(True), allocator=NumpyAllocator())
    _check_oracle(data, plain)
    as_numpy = _run(ds, output=NumpyOutput(True), allocator=NumpyAllocator())
    assert _same(as_numpy, plain)
    assert _same(_run(ds), plain)  # the seams the dataset wires itself
    assert _same([tuple(t.numpy() for t in batch) for batch in ds], plain)  # and iterating the dataset


def test_numpy_output_yields_arrays_and_torch_output_tensors(data):
    ds = _dataset(data, "arrays", "pool")
    values = dataclasses.replace(ds._pass_values(), output=NumpyOutput(True))
    first = next(iter(pool_batches(values, ds._plan(World(), 0, 0))))
    assert all(isinstance(a, np.ndarray) for a in first) and first[2].dtype == np.int64
    assert isinstance(next(iter(ds))[0], torch.Tensor)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
@pytest.mark.parametrize("order", list(ORDERS))
def test_pinned_output_gives_the_same_batches(data, order):  # pragma: no cover - CUDA machines
    ds = _dataset(data, "parquet", order)
    pinned = dataclasses.replace(ds._pass_values(), output=PinnedOutput(True))
    run = pool_batches
    batches = list(run(pinned, ds._plan(World(), 0, 0)))
    assert all(t.is_pinned() for batch in batches for t in batch)
    assert _same([tuple(t.numpy() for t in b) for b in batches], _run(ds))


def test_pinned_output_without_cuda_is_refused_naming_the_remedy():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ValueError, match="PinnedOutput needs CUDA.*use TorchOutput"):
        PinnedOutput()


class _Passes(torch.utils.data.IterableDataset):
    """Inside a DataLoader worker: one pass per (source, order) with the slot allocator injected."""

    def __init__(self, datasets: dict) -> None:
        self.datasets = datasets

    def __iter__(self):
        for key, ds in self.datasets.items():
            values = dataclasses.replace(ds._pass_values(), allocator=SlotAllocator(), output=TorchOutput(True))
            run = pool_batches
            for batch in run(values, ds._plan(World(), 0, 0)):
                yield key, batch


def test_the_slot_allocator_in_a_dataloader_worker_gives_the_same_batches(data):
    datasets = {(s, o): _dataset(data, s, o) for s in SOURCES for o in ORDERS}
    loader = torch.utils.data.DataLoader(
        _Passes(datasets), batch_size=None, num_workers=1, multiprocessing_context="fork"
    )
    got: dict = {key: [] for key in datasets}
    for key, batch in loader:
        got[tuple(key)].append(tuple(np.array(t) for t in batch))
    for key, ds in datasets.items():
        assert _same(got[key], _run(ds, allocator=NumpyAllocator())), key
