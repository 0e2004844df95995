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
    import dask_windows.planning.budget as pool_module
    from dask_windows.planning.world import World

    saved, pool_module.POOL_FIRST_BYTES = pool_module.POOL_FIRST_BYTES, 200
    try:
        ds = open_ds(root, **{**COMMON, "return_index": True, "buffer_bytes": 30_000})
        plan = ds._plan(World(0, 1, 0, 1))
        assert plan.fill == 1 < plan.spread, (plan.fill, plan.spread)
        return one_epoch(ds)
    finally:
        pool_module.POOL_FIRST_BYTES = saved


# Re-recorded on purpose by issue 33 (one engine): whole partitions are served by the pool machinery
# (a pool of buffer_partitions partitions), so every shuffled configuration of them changed (whole_in_order
# kept its bits: the same partitions in order, each one's windows in order).
KEPT = {
    "whole_shuffled": (whole_shuffled, "6837f9280bea9feb1400d982a8bc9313d8dd43c2255fd58b1465abc6830d9c2d"),
    "whole_in_order": (whole_in_order, "cc07450b22c881173477b41398d266ce09313ef95131cd376244c71f87637811"),
    "whole_stride_window": (whole_stride_window, "c4074133ef7c53fd4983c207139ae9f3c5d5b3d147594a84596d585b5fabe4a8"),
    "whole_horizon": (whole_horizon, "5ea729fba7e0a8f1cc8e6b583c6cf4d11021ba1ec3d2da0c8cfbeb197149415a"),
    "whole_normalize_global": (
        whole_normalize_global,
        "5fbff79cf93a592ba9aed35b63269d439e53272162d5dc9f5a675fb4b8446a2e",
    ),
    "whole_normalize_sample": (
        whole_normalize_sample,
        "79f0e87a1f3b51b88bafd8c5313e4fa7d51f075c34d54eef33980c91db849685",
    ),
    "whole_resume": (
        whole_resume,
        "6e3c6565b40e4188be3311df09c30abe3a4752a5a500cc259f47ab2229d2cb6b:"
        "cefa0b144bd43912542162ddac38576a426fd23e8aa40711157108ef451ee16e",
    ),
    "whole_two_workers": (whole_two_workers, "aef46e982a33b6beba29d68f3cfaf8b5d45813f172acd01a31d7abc73020b4ce"),
    "whole_two_ranks": (
        whole_two_ranks,
        "4dee4d431be5653a7ea9e4df534d904fd1cd7977bf624bb3326aa3d046afa00a:"
        "cd841f454500cace94d1bc3a630519808a7c589e9eb09d814930fe563c571751",
    ),
    "arrays_whole": (arrays_whole, "191991c45a57c02c4d5c01e498795f03e50fd252631cc4298e7792869e170748"),
    "dask_frame": (dask_frame, "00cefcb477a449103e0ef4c5a99b78a261125d18c85b2c5239052dbdee45b8e9"),
    "converted": (converted, "b804ccff334c68168e7e6a895562a57ddf2d2a9d852eace41779c5bab31a7839"),
    "mixture": (mixture, "587ec170ee1b701f854d07d679e125d951eaa66895d753b3189597b70fb3c58c"),
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
