"""Golden hashes of whole epochs: what users get stays the same bit for bit while the runtime moves.

Each configuration below streams one whole epoch from small data written in ``tmp_path`` from a
fixed seed and hashes every batch's tensors (``x``, ``y``, the window index), in order, with their
dtypes and shapes. The hashes were recorded on ``main`` before the folder move of issue 21; every
later step of that work must reproduce them.

Two kinds of configuration:

* ``KEPT``: orders that no planned change touches (whole partitions in a random order, converted
  data, Dask frames, ...). A changed hash here is a regression.
* ``DEFAULT_ORDER``: configurations that use the default piece order (``pieces_per_partition``
  left unset on raw Parquet or arrays). The mixing issue (22) replaces that order on purpose and
  re-records these hashes, and only these, when it lands.

To print the hashes of the current code (when a hash is changed on purpose):
``PYTHONPATH=$PWD python tests/test_golden.py``.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys

import numpy as np
import pytest
import torch
from helpers import make_frames, write_parquet
from torch.utils.data import DataLoader

SEED = 20261203
EPOCH = 3
FEATURES = ["f0", "f1", "f2"]
COMMON = {"features": FEATURES, "targets": ["y"], "series": "sid", "window": 8, "batch_size": 16}
WHOLE = {**COMMON, "pieces_per_partition": 1, "buffer_partitions": 2, "return_index": True}


def epoch_hash(batches) -> str:
    """SHA-256 over every batch's tensors in order (dtype, shape and bytes of each)."""
    digest = hashlib.sha256()
    count = 0
    for batch in batches:
        batch = batch if isinstance(batch, (tuple, list)) else (batch,)
        for tensor in batch:
            array = tensor.numpy() if isinstance(tensor, torch.Tensor) else np.asarray(tensor)
            array = np.ascontiguousarray(array)
            digest.update(f"{array.dtype.str}{array.shape}".encode())
            digest.update(array.tobytes())
        count += 1
    digest.update(f"batches={count}".encode())
    return digest.hexdigest()


def frames():
    return make_frames(seed=SEED % 1000, num_files=6, num_series=10, min_len=5, max_len=90)


@pytest.fixture(scope="module")
def parquet_root(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("golden") / "data")
    write_parquet(frames(), root, row_group_size=20)
    return root


def open_ds(data, **kwargs):
    from dask_windows.dataset import WindowDataset

    ds = WindowDataset(data, **kwargs)
    ds.set_epoch(EPOCH)
    return ds


def one_epoch(ds, num_workers: int = 0) -> str:
    if num_workers:
        return epoch_hash(DataLoader(ds, batch_size=None, num_workers=num_workers))
    return epoch_hash(iter(ds))


# --- the configurations: name -> a function of (parquet root, tmp_path) returning one hash ---


def whole_shuffled(root, tmp):
    return one_epoch(open_ds(root, **WHOLE))


def whole_in_order(root, tmp):
    return one_epoch(open_ds(root, **{**WHOLE, "shuffle": False}))


def whole_stride_window(root, tmp):
    return one_epoch(open_ds(root, **{**WHOLE, "stride": 8}))


def whole_horizon(root, tmp):
    return one_epoch(open_ds(root, **{**WHOLE, "horizon": 4, "stride": 2, "layout": "NLC"}))


def whole_normalize_global(root, tmp):
    norm = {"mean": [100.0, 0.5, -0.25], "std": [50.0, 2.0, 0.5]}
    return one_epoch(open_ds(root, **{**WHOLE, "normalize": norm}))


def whole_normalize_sample(root, tmp):
    return one_epoch(open_ds(root, **{**WHOLE, "normalize": "sample"}))


def whole_resume(root, tmp):
    """Five batches taken, the state pickled, the rest of the epoch from a new dataset."""
    ds = open_ds(root, **WHOLE)
    it = iter(ds)
    head = [next(it) for _ in range(5)]
    state = pickle.loads(pickle.dumps(ds.state_dict()))
    del it
    again = open_ds(root, **WHOLE)
    again.load_state_dict(state)
    return epoch_hash(head) + ":" + one_epoch(again)


def whole_two_workers(root, tmp):
    return one_epoch(open_ds(root, **WHOLE), num_workers=2)


def whole_two_ranks(root, tmp):
    return ":".join(one_epoch(open_ds(root, **WHOLE, rank=r, world_size=2)) for r in range(2))


def arrays_whole(root, tmp):
    rng = np.random.default_rng(SEED)
    arrays = [rng.standard_normal((n, 3)).astype(np.float32) for n in (40, 75, 12, 130, 61)]
    return one_epoch(
        open_ds(arrays, window=8, batch_size=16, pieces_per_partition=1, partition_rows=60, return_index=True)
    )


def dask_frame(root, tmp):
    dd = pytest.importorskip("dask.dataframe")
    import pandas as pd

    frame = dd.from_pandas(pd.concat(frames(), ignore_index=True), npartitions=4)
    return one_epoch(open_ds(frame, **{**COMMON, "buffer_partitions": 2, "return_index": True}))


def converted(root, tmp):
    import dask

    from dask_windows.cli.convert import convert

    out = os.path.join(str(tmp), "converted")
    with dask.config.set(scheduler="synchronous"):
        convert([root], out, series="sid", time="ts", partition_size=2000, window=8)
    return one_epoch(open_ds(out, **{**COMMON, "buffer_partitions": 2, "return_index": True}))


def mixture(root, tmp):
    from dask_windows.mixture import mix

    a = open_ds(root, **WHOLE)
    b = open_ds(root, **{**WHOLE, "stride": 3, "seed": 5})
    mixed = mix({"a": a, "b": b}, {"a": 2.0, "b": 1.0}, batch_size=16, return_source=True)
    mixed.set_epoch(EPOCH)
    return one_epoch(mixed)


# DEFAULT_ORDER: these use the default order, the pool order since issue 22 (its hashes re-recorded then).


def default_order(root, tmp):
    return one_epoch(open_ds(root, **{**COMMON, "return_index": True}))


def default_order_two_workers(root, tmp):
    return one_epoch(open_ds(root, **{**COMMON, "return_index": True}), num_workers=2)


def default_order_arrays(root, tmp):
    rng = np.random.default_rng(SEED + 1)
    arrays = [rng.standard_normal((n, 2)).astype(np.float32) for n in (50, 90, 33)]
    return one_epoch(open_ds(arrays, window=6, batch_size=8, partition_rows=40, return_index=True))


def default_order_filling(root, tmp):
    """A pool of about 30 units whose first step draws after one (issue 33's progressive fill)."""
    import dask_windows.runtime.pool as pool_module
    from dask_windows.planning.world import World

    saved, pool_module.POOL_FIRST_BYTES = pool_module.POOL_FIRST_BYTES, 200
    try:
        ds = open_ds(root, **{**COMMON, "return_index": True, "buffer_bytes": 30_000})
        plan = ds._plan(World(0, 1, 0, 1))
        assert plan.fill == 1 < plan.spread, (plan.fill, plan.spread)
        return one_epoch(ds)
    finally:
        pool_module.POOL_FIRST_BYTES = saved


KEPT = {
    "whole_shuffled": (whole_shuffled, "b8238bcd49fde83e8c82cde98e9d836747f2a0117e502adb51af39392be6882b"),
    "whole_in_order": (whole_in_order, "cc07450b22c881173477b41398d266ce09313ef95131cd376244c71f87637811"),
    "whole_stride_window": (whole_stride_window, "d8c42e3df98741a3e161590bf04e3f460d9c2a965d15f0cedb1361d3d1ce0d7d"),
    "whole_horizon": (whole_horizon, "188098e357339b398f6f2ec9ae3bf249f766bc04bd2b4dd28a6fa24e3da8e074"),
    "whole_normalize_global": (
        whole_normalize_global,
        "85348db0c9810268c53c4c8e266addaaa328f3b6fd8debf1ca2f54bea1075ce5",
    ),
    "whole_normalize_sample": (
        whole_normalize_sample,
        "ab9504f503d3c2297e708ec90620d7771bf48915ca48791452dc0cc090384e3e",
    ),
    "whole_resume": (
        whole_resume,
        "c1aeb2294a74eb52c30b832a85c39262266c108ca684bca501cabe0da4f82b37:"
        "7ad317ecf1a70720393ae9d0d71bdd26ea4566f693188db4462d997b50b2466f",
    ),
    "whole_two_workers": (whole_two_workers, "88f3d1cdc31393676285da80fed8c0e05ebfdd7955ba7510a950c1bb80d064a5"),
    "whole_two_ranks": (
        whole_two_ranks,
        "f4ac693bba028522f29a72090427f7b0a5b83af40e65f084502ea4f0e96b7c3a:"
        "2ba7b7324b637d6a4f7a5ad7096e54edb3404568e55376beac08c4a02a857152",
    ),
    "arrays_whole": (arrays_whole, "2a3009a5897e8034f3769fc7fc3c10e4feeac581907545d378c32a15929d126b"),
    "dask_frame": (dask_frame, "d8a5dee31467e9f884e18818af2bfb774de505ff3a4c21656bba18d0321efffa"),
    "converted": (converted, "1f89fb764cae503b75dda1a78c55337d4f511f08d96bc3875ea232b639ae8095"),
    "mixture": (mixture, "99921c7d552f6f5fa05e1c2cb19219cbf8a8ccfca5f978e4783f97dc808a0d69"),
}

DEFAULT_ORDER = {  # re-recorded by the mixing issue (22): the pool order (planning/pool.py)
    "default_order": (default_order, "a0f82715939ecaf3de81ae8e193eeaeefd8fda5eeb0788b09c445ff961f84931"),
    "default_order_two_workers": (
        default_order_two_workers,
        "7e49975ed2ff94cb9e0119d588ae6513a4950cde69390a17009b9be071580ddc",
    ),
    "default_order_arrays": (default_order_arrays, "96a7fa815f81dbb0f3fdce8e9f34a1bbdf2d7c0f2104389b67dc5b9b939fbbaf"),
    # recorded by issue 33: the pool filled progressively (its first step after one unit)
    "default_order_filling": (
        default_order_filling,
        "f80ff7867c1fa0e69862007a66fed925aaac32e7804d479954cd35d48ac5783e",
    ),
}


@pytest.mark.parametrize("name", sorted(KEPT))
def test_kept_orders_reproduce_their_golden_hash(name, parquet_root, tmp_path):
    config, expected = KEPT[name]
    assert config(parquet_root, tmp_path) == expected, f"{name}: the epoch's bits changed"


@pytest.mark.parametrize("name", sorted(DEFAULT_ORDER))
def test_default_order_reproduces_its_golden_hash(name, parquet_root, tmp_path):
    config, expected = DEFAULT_ORDER[name]
    assert config(parquet_root, tmp_path) == expected, f"{name}: the default order's bits changed"


def test_the_hash_sees_every_bit():
    """One flipped bit, a reordered batch or a missing batch changes the hash."""
    batches = [(torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.tensor([1, 2]))] * 2
    base = epoch_hash(batches)
    flipped = [(batches[0][0].clone(), batches[0][1]), batches[1]]
    flipped[0][0].view(torch.int32)[0, 0] ^= 1
    assert epoch_hash(flipped) != base
    assert epoch_hash(batches[:1]) != base
    swapped = [(batches[0][1], batches[0][0]), batches[1]]
    assert epoch_hash(swapped) != base


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "data")
        write_parquet(frames(), root, row_group_size=20)
        for table in (KEPT, DEFAULT_ORDER):
            for name, (config, _) in table.items():
                os.makedirs(os.path.join(tmp, name))
                print(f'    "{name}": ({name}, "{config(root, os.path.join(tmp, name))}"),', file=sys.stdout)
