"""Mid-epoch resumption: interrupt after k batches, resume in a new process, compare bit for bit."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from helpers import write_parquet
from scale_helpers import (
    assert_same_batches,
    drain,
    load_batches,
    make_uneven_frames,
    open_dataset,
    reads,
    run_child,
    wait,
)
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from dask_windows.errors import ConfigError
from dask_windows.planning.plan import worker_batch_range
from dask_windows.planning.pool import reader_steps
from dask_windows.planning.resume import round_robin
from dask_windows.planning.world import World

SIZES = [40, 150, 60, 130, 45, 170, 55, 120]
SETTINGS = {
    "next_pass_seconds": 0,  # the reads logged are the resumed pass's (no read-ahead of the next epoch)
    "window": 7,
    "batch_size": 6,
    "buffer_partitions": 2,
    "pieces_per_partition": 1,  # whole partitions (a pool of buffer_partitions of them)
    "targets": ["y"],
    "horizon": 2,
}
EPOCH = 1


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = tmp_path_factory.mktemp("resume")
    write_parquet(make_uneven_frames(SIZES, seed=7), str(path))
    return str(path)


def loader_for(ds, kind: str, num_workers: int):
    if kind == "stateful":
        StatefulDataLoader = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader

        return StatefulDataLoader(ds, batch_size=None, num_workers=num_workers)
    return DataLoader(ds, batch_size=None, num_workers=num_workers)


def interrupt_points(root: str, num_workers: int) -> dict[str, int]:
    """Loader batch counts inside a buffer, at both sides of a buffer edge, and in the last buffer."""
    ds = open_dataset(root, **SETTINGS)
    ds.set_epoch(EPOCH)
    readers = max(num_workers, 1)
    plan = ds._plan(World(0, 1, 0, readers))
    sizes = [len(w) for w in reader_steps(plan, lambda i: np.arange(plan.units[i].num_windows))]  # windows per step
    edge = sizes[0] / SETTINGS["batch_size"]  # worker 0's first step end
    points = {
        "first": 1,
        "inside": int(edge // 2) * readers,
        "edge_straddle": int(np.floor(edge)) * readers,  # the next batch spans two steps
        "edge_after": int(np.ceil(edge)) * readers,  # the next batch starts in the second step
        "last_buffer": len(ds) - 3,
        "last_batch": len(ds) - 1,
    }
    ends = np.cumsum(sizes)
    exact = [int(e) // SETTINGS["batch_size"] * readers for e in ends if e % SETTINGS["batch_size"] == 0]
    if exact:  # the state ends exactly where a step ends
        points["edge_exact"] = min(exact[0], len(ds))
    assert len(sizes) >= 2 and 0 < points["inside"] < points["edge_straddle"] < points["last_buffer"]
    return points


@pytest.mark.parametrize("kind,num_workers", [("plain", 0), ("plain", 2), ("stateful", 0), ("stateful", 2)])
def test_resume_in_a_new_process_matches_the_uninterrupted_run(root, tmp_path, kind, num_workers):
    ds = open_dataset(root, **SETTINGS)
    ds.set_epoch(EPOCH)
    full = drain(loader_for(ds, kind, num_workers))
    assert len(full) == len(ds)
    points = interrupt_points(root, num_workers)
    jobs, heads = [], {}
    for name, k in points.items():
        ds = open_dataset(root, **SETTINGS)
        ds.set_epoch(EPOCH)
        loader = loader_for(ds, kind, num_workers)
        head = []
        for batch in loader:
            head.append(tuple(t.numpy() for t in batch))
            if len(head) == k:
                break
        if kind == "stateful":
            saved = {"epoch": EPOCH, "loader": loader.state_dict()}
        else:
            saved = {"epoch": EPOCH, "data": ds.state_dict(batches=k, num_workers=num_workers)}
        del loader
        torch.save(saved, tmp_path / f"{name}.pt")
        heads[name] = head
        files = {"state": f"{name}.pt", "out": f"{name}.npz", "log": f"{name}.log"}
        paths = {k: str(tmp_path / f) for k, f in files.items()}
        jobs.append({"name": name, "loader": kind, "num_workers": num_workers, **paths})
    wait([run_child("resume", {"data": root, "dataset": SETTINGS, "jobs": jobs})])
    for job in jobs:
        name, k = job["name"], points[job["name"]]
        rest = load_batches(job["out"])
        assert_same_batches(heads[name] + rest, full)
        # Buffers every worker had finished are not read again; the others once each (one read per
        # partition of a buffer: its pieces of that partition together).
        ds = open_dataset(root, **SETTINGS)
        ds.set_epoch(EPOCH)
        readers = max(num_workers, 1)
        per_worker = [b1 - b0 for b0, b1 in (worker_batch_range(len(ds), w, readers) for w in range(readers))]
        consumed, _ = round_robin(per_worker, k)
        expected = []
        for role, skip in enumerate(consumed):
            expected += units_read(ds._plan(World(0, 1, role, readers), int(skip)))
        got = reads(job["log"])
        assert sorted(got) == sorted(expected), name
        if name in ("last_buffer", "last_batch"):  # far fewer pieces read than a whole epoch reads
            whole = sum(len(units_read(ds._plan(World(0, 1, role, readers)))) for role in range(readers))
            assert len(got) <= whole // 2  # (the units resident at the resume point are read again)


def units_read(plan) -> list[int]:
    """The partition of each unit a pass over ``plan`` reads (units finished before a resume are not)."""
    return [u.partition for u in plan.units[plan.first_unit :] if u.fresh[1] > u.fresh[0]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_twice_with_a_plain_dataloader(root, num_workers):
    ds = open_dataset(root, **SETTINGS)
    ds.set_epoch(EPOCH)
    full = drain(DataLoader(ds, batch_size=None, num_workers=num_workers))
    got, state = [], None
    for stop in (5, 9, None):  # stop after 5 batches, then 9 more, then run to the end
        ds = open_dataset(root, **SETTINGS)
        start = EPOCH
        if state is not None:
            ds.load_state_dict(pickle.loads(pickle.dumps(state)))
            start = ds.epoch
        for epoch in range(start, EPOCH + 1):  # the usual loop: set_epoch keeps a resumed epoch
            ds.set_epoch(epoch)
            taken = 0
            for batch in DataLoader(ds, batch_size=None, num_workers=num_workers):
                if epoch == EPOCH:
                    got.append(tuple(t.numpy() for t in batch))
                taken += 1
                if epoch == EPOCH and taken == stop:
                    break
        state = ds.state_dict(batches=taken, num_workers=num_workers)
    assert_same_batches(got, full)
    assert state["batches"] == len(ds)


def test_state_dict_counts_itself_without_workers(root):
    ds = open_dataset(root, **SETTINGS)
    it = iter(ds)
    assert ds.state_dict()["batches"] == 0
    for _ in range(3):
        next(it)
    state = ds.state_dict()
    assert (state["scope"], state["epoch"], state["batches"], state["num_workers"]) == ("loader", 0, 3, 1)
    again = open_dataset(root, **SETTINGS)
    again.load_state_dict(state)
    assert again.state_dict() == state  # before iterating, the loaded position
    assert len(list(again)) == len(ds) - 3
    assert len(list(again)) == len(ds)  # the state applies to one pass


def test_a_finished_state_resumes_to_an_empty_pass(root):
    ds = open_dataset(root, **SETTINGS)
    n = len(list(ds))
    again = open_dataset(root, **SETTINGS)
    again.load_state_dict(ds.state_dict())
    assert ds.state_dict()["batches"] == n and list(again) == []


def test_state_is_the_same_on_every_rank(root):
    states = []
    for rank in range(2):
        ds = open_dataset(root, rank=rank, world_size=2, **SETTINGS)
        it = iter(ds)
        next(it)
        states.append(ds.state_dict())
    assert states[0] == states[1]
    heads = []
    for rank in range(2):  # rank 0's state resumes rank 1 where it stood
        ds = open_dataset(root, rank=rank, world_size=2, **SETTINGS)
        ds.load_state_dict(states[0])
        heads.append(next(iter(ds))[2].numpy())
        full = [b[2].numpy() for b in open_dataset(root, rank=rank, world_size=2, **SETTINGS)]
        assert (heads[-1] == full[1]).all()


@pytest.mark.parametrize(
    "change,message",
    [
        ({"batch_size": 9}, "batch_size: 6 in the state, 9 here"),
        ({"seed": 1}, "seed: 0 in the state, 1 here"),
        ({"window": 6}, "window: 7 in the state, 6 here"),
        # another world_size resumes elastically (tests/planning/test_elastic.py)
        ({"buffer_partitions": 3}, "buffer_partitions: 2 in the state, 3 here"),
    ],
)
def test_a_state_of_another_configuration_is_rejected(root, change, message):
    ds = open_dataset(root, **SETTINGS)
    state = ds.state_dict(batches=2, num_workers=0)
    other = open_dataset(root, **{**SETTINGS, **change})
    with pytest.raises(ConfigError, match=message):
        other.load_state_dict(state)


def test_a_state_of_other_data_is_rejected(root, tmp_path):
    write_parquet(make_uneven_frames(SIZES[:-1], seed=7), str(tmp_path))
    state = open_dataset(root, **SETTINGS).state_dict(batches=1, num_workers=0)
    with pytest.raises(ConfigError, match="partitions: 8 in the state, 7 here"):
        open_dataset(str(tmp_path), **SETTINGS).load_state_dict(state)
    train, valid = open_dataset(root, **SETTINGS).split(valid=0.3)
    with pytest.raises(ConfigError, match="num_windows"):
        valid.load_state_dict(train.state_dict(batches=1, num_workers=0))
    with pytest.raises(ConfigError, match="not a WindowDataset state"):
        train.load_state_dict({"epoch": 1})


def test_misuse_gets_a_clear_error(root):
    ds = open_dataset(root, **SETTINGS)
    with pytest.raises(ConfigError, match="never iterated"):
        ds.state_dict()
    with pytest.raises(ConfigError, match="needs num_workers="):
        ds.state_dict(batches=3)
    with pytest.raises(ConfigError, match="more than the"):
        ds.state_dict(batches=len(ds) + 1, num_workers=0)
    # (a state of another num_workers resumes elastically: tests/planning/test_elastic.py)


class _Labelled(IterableDataset):
    """Worker ``w`` yields ``counts[w]`` items ``(w, i)``."""

    def __init__(self, counts: list[int]) -> None:
        self.counts = counts

    def __iter__(self):
        w = get_worker_info().id
        return iter([torch.tensor([w, i]) for i in range(self.counts[w])])


def test_torch_dataloader_asks_workers_in_round_robin():
    # The plain-DataLoader resume relies on this order; fail loudly if torch changes it.
    counts = [2, 4, 3]
    order = [int(t[0]) for t in DataLoader(_Labelled(counts), batch_size=None, num_workers=3, prefetch_factor=1)]
    for taken in range(len(order) + 1):
        consumed, _ = round_robin(counts, taken)
        assert consumed.tolist() == [order[:taken].count(w) for w in range(3)]


def test_a_pool_state_saved_before_the_progressive_fill_is_refused(root):
    """The pool order's first step no longer waits for the whole pool (order "pool-2"): a "pool-1" state
    would resume into other batches, so it is refused with the error naming the order."""
    pool = {k: v for k, v in SETTINGS.items() if k not in ("buffer_partitions", "pieces_per_partition")}
    state = open_dataset(root, **pool).state_dict(batches=2, num_workers=0)
    assert state["dataset"]["order"] == "pool-2"
    open_dataset(root, **pool).load_state_dict(state)
    state["dataset"] = {**state["dataset"], "order": "pool-1"}
    with pytest.raises(ConfigError, match="order: 'pool-1' in the state, 'pool-2' here.*start the epoch over"):
        open_dataset(root, **pool).load_state_dict(state)


def test_a_whole_partition_state_saved_by_the_buffer_order_is_refused(root):
    """Whole partitions are now a pool of ``buffer_partitions`` partitions (order "partitions-2"): a state the
    buffer order saved (it recorded no order) would resume into other batches, so it is refused by name."""
    state = open_dataset(root, **SETTINGS).state_dict(batches=2, num_workers=0)
    assert state["dataset"]["order"] == "partitions-2"
    open_dataset(root, **SETTINGS).load_state_dict(state)
    state["dataset"] = {k: v for k, v in state["dataset"].items() if k != "order"}
    with pytest.raises(ConfigError, match="order: None in the state, 'partitions-2' here.*start the epoch over"):
        open_dataset(root, **SETTINGS).load_state_dict(state)
