"""Exact sharding across real torch.distributed ranks (gloo, 2 processes) and DataLoader workers."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from helpers import oracle_starts, write_parquet
from scale_helpers import make_uneven_frames, open_dataset, run_child, wait

# Partitions differ in size tenfold; series span them.
SIZES = [31, 310, 45, 290, 36, 300, 52]
WINDOW = 9
CONFIGS = [
    {"num_workers": 0, "epoch": 0, "dataset": {"window": WINDOW, "batch_size": 16}},
    {"num_workers": 2, "epoch": 1, "dataset": {"window": WINDOW, "batch_size": 16}},
    {"num_workers": 0, "epoch": 1, "dataset": {"window": WINDOW, "batch_size": 12, "drop_last": True, "stride": 2}},
    {"num_workers": 2, "epoch": 0, "dataset": {"window": WINDOW, "batch_size": 7, "drop_last": True}},
    {"num_workers": 2, "epoch": 2, "dataset": {"window": WINDOW, "batch_size": 10, "buffer_partitions": 1}},
    {"num_workers": 2, "epoch": None, "context": "spawn", "dataset": {"window": WINDOW, "batch_size": 16}},
    # the pool order on the (CPU) device: each rank's units sent once into its pool there (ondevice.pool)
    {
        "num_workers": 0,
        "epoch": 1,
        "dataset": {"window": WINDOW, "batch_size": 16, "device": "cpu", "buffer_bytes": 4_000},
    },
]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("uneven")
    frames = make_uneven_frames(SIZES, seed=4)
    write_parquet(frames, str(root))
    return str(root), frames


@pytest.fixture(scope="module")
def ranks(data, tmp_path_factory):
    """Run both ranks once over every config; return each rank's saved results."""
    root, _ = data
    work = tmp_path_factory.mktemp("ddp")
    init = f"file://{work / 'rendezvous'}"
    args = {"world_size": 2, "init": init, "data": root, "configs": CONFIGS}
    procs = [run_child("ddp", {**args, "rank": r, "out": str(work / f"rank{r}.npz")}) for r in range(2)]
    wait(procs, timeout=180)
    return [dict(np.load(work / f"rank{r}.npz")) for r in range(2)]


@pytest.mark.parametrize("n", range(len(CONFIGS)))
def test_ranks_get_equal_disjoint_shares(ranks, data, n):
    _, frames = data
    config = CONFIGS[n]["dataset"]
    expected = oracle_starts(frames, "sid", WINDOW, config.get("stride", 1))
    batch_size, drop_last = config["batch_size"], config.get("drop_last", False)
    sizes = [r[f"sizes{n}"] for r in ranks]
    # (a) every rank yields exactly len(ds) batches, the same on every rank.
    assert int(ranks[0][f"len{n}"]) == int(ranks[1][f"len{n}"]) == len(sizes[0]) == len(sizes[1]) > 0
    for s in sizes:  # only the last batch of a rank may be partial, and not with drop_last
        assert (s[:-1] == batch_size).all() and (s[-1] == batch_size if drop_last else 0 < s[-1] <= batch_size)
    got = [r[f"idx{n}"] for r in ranks]
    # (b) no window goes to two ranks (nor twice to one).
    union = np.concatenate(got)
    assert len(np.unique(union)) == len(union)
    # (c) together they cover the oracle's windows but the documented remainder.
    assert np.isin(union, expected).all()
    share = len(expected) // 2
    used = share // batch_size * batch_size if drop_last else share
    assert len(expected) - len(union) == len(expected) % 2 + 2 * (share - used)


def test_partitions_really_differ_tenfold(data):
    root, _ = data
    rows = [p.num_rows for p in open_dataset(root, window=WINDOW).partitions]
    assert max(rows) >= 9 * min(rows)


def test_pickled_dataset_keeps_detected_ranks(data, monkeypatch):
    # DataLoader workers started by spawn cannot detect torch.distributed: the pickle carries it.
    import dask_windows.runtime.detect as world_module  # where ranks are detected

    root, _ = data
    ds = open_dataset(root, window=WINDOW, batch_size=16)
    monkeypatch.setattr(world_module, "detect_ranks", lambda: (1, 2))
    blob = pickle.dumps(ds)
    monkeypatch.setattr(world_module, "detect_ranks", lambda: None)
    copy = pickle.loads(blob)
    assert (copy.rank, copy.world_size) == (1, 2)
    assert len(copy) == -(-(ds.num_windows // 2) // 16)


def test_explicit_ranks_override_and_split_parts_shard_like_the_parent(data):
    root, _ = data
    whole = np.concatenate([b[1].numpy() for b in open_dataset(root, window=WINDOW, batch_size=8).split(valid=0.3)[0]])
    ranks = [open_dataset(root, window=WINDOW, batch_size=8, rank=r, world_size=2) for r in range(2)]
    train = [ds.split(valid=0.3)[0] for ds in ranks]
    got = [np.concatenate([b[1].numpy() for b in ds]) for ds in train]
    assert len(train[0]) == len(train[1]) == -(-(len(whole) // 2) // 8)
    union = np.concatenate(got)
    assert len(np.unique(union)) == len(union) == len(whole) - len(whole) % 2 and np.isin(union, whole).all()
