"""Elastic resume: a state of (2 ranks, 2 workers) resumed by (3 ranks, 0 workers), (1, 1), then again."""

from __future__ import annotations

import os
import pickle

import forkrun
import numpy as np
import pytest
import torch
from helpers import write_parquet
from hypothesis import given, settings
from hypothesis import strategies as st
from scale_helpers import make_uneven_frames, open_dataset
from torch.utils.data import DataLoader

from dask_windows.planning.elastic import batches_of_rest, divide
from dask_windows.planning.world import World

SIZES = [40, 150, 60, 130, 45, 170, 55, 120]
SETTINGS = {"window": 7, "batch_size": 6, "buffer_partitions": 2}
EPOCH = 1


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("elastic")
    write_parquet(make_uneven_frames(SIZES, seed=4), str(path))
    return str(path)


def windows(batches: list) -> np.ndarray:
    return np.concatenate([b[1].numpy() for b in batches]) if batches else np.zeros(0, np.int64)


def check_values(batches: list) -> None:
    for x, index in batches:  # f0 is the global row: a window's values prove its start
        assert torch.equal(x[:, 0, 0], index.to(torch.float32))


def epoch_windows(root: str, world_size: int, epoch: int = EPOCH) -> np.ndarray:
    """Every window the uninterrupted epoch yields over ``world_size`` ranks (any num_workers)."""
    out = []
    for r in range(world_size):
        ds = open_dataset(root, rank=r, world_size=world_size, **SETTINGS)
        ds.set_epoch(epoch)
        out.append(windows(list(ds)))
    return np.sort(np.concatenate(out))


def interrupted(root: str, taken: int) -> tuple[dict, list]:
    """Two ranks with 2 DataLoader workers each stop after ``taken`` batches; the state and what they got."""
    got = []
    for r in range(2):
        ds = open_dataset(root, rank=r, world_size=2, **SETTINGS)
        ds.set_epoch(EPOCH)
        loader = iter(DataLoader(ds, batch_size=None, num_workers=2))
        got += [next(loader) for _ in range(taken)]
        del loader
        state = ds.state_dict(batches=taken, num_workers=2)
    return pickle.loads(pickle.dumps(state)), got


def resume(root: str, state: dict, world_size: int, num_workers: int, stop: int | None = None) -> list[list]:
    """Each new rank's batches of the rest of the epoch (``stop``: only that many per rank)."""
    out = []
    for r in range(world_size):
        ds = open_dataset(root, rank=r, world_size=world_size, **SETTINGS)
        ds.load_state_dict(state)
        ds.set_epoch(EPOCH)  # the training loop's call keeps the resumed epoch
        batches = []
        for batch in DataLoader(ds, batch_size=None, num_workers=num_workers):
            batches.append(batch)
            if stop is not None and len(batches) == stop:
                break
        out.append(batches)
    return out


@pytest.mark.parametrize("taken", [1, 9, 23])
def test_two_ranks_two_workers_to_three_ranks_and_to_one_worker(root, taken):
    full = epoch_windows(root, 2)
    state, before = interrupted(root, taken)
    for world_size, num_workers in ((3, 0), (1, 1)):
        ranks = resume(root, state, world_size, num_workers)
        assert len({len(r) for r in ranks}) == 1  # equal batches per rank
        after = [b for r in ranks for b in r]
        check_values(after)
        union = np.concatenate([windows(before), windows(after)])
        assert len(np.unique(union)) == len(union)  # nothing twice
        assert np.array_equal(np.sort(union), full)  # nothing lost, in-flight buffers included
        for r in ranks:
            assert all(0 < len(b[1]) <= SETTINGS["batch_size"] for b in r)


def test_a_second_elastic_restart_in_the_same_epoch(root):
    full = epoch_windows(root, 2)
    state, before = interrupted(root, 7)
    first = resume(root, state, 3, 0, stop=4)
    # the ranks stopped together after 4 batches; rank 0 (any rank) saves the state
    ds = open_dataset(root, rank=0, world_size=3, **SETTINGS)
    ds.load_state_dict(state)
    it = iter(ds)
    for _ in range(4):
        next(it)
    second = ds.state_dict()
    assert second["batches"] == 4 and "rest" in second and second["world_size"] == 3
    loader_scope = resume_state(root, state)
    assert loader_scope == second
    ranks = resume(root, pickle.loads(pickle.dumps(second)), 2, 2)
    assert len(ranks[0]) == len(ranks[1])
    union = np.concatenate([windows(before), *(windows(r) for r in first), *(windows(r) for r in ranks)])
    assert len(np.unique(union)) == len(union) and np.array_equal(np.sort(union), full)


def resume_state(root: str, state: dict) -> dict:
    """The state a plain DataLoader loop saves after 4 batches of the 3-rank elastic epoch."""
    ds = open_dataset(root, rank=1, world_size=3, **SETTINGS)
    ds.load_state_dict(state)
    return ds.state_dict(batches=4, num_workers=1)


def test_next_epochs_are_those_of_the_new_topology(root):
    state, _ = interrupted(root, 5)
    for r in range(3):
        ds = open_dataset(root, rank=r, world_size=3, **SETTINGS)
        ds.load_state_dict(state)
        list(ds)
        ds.set_epoch(EPOCH + 1)
        fresh = open_dataset(root, rank=r, world_size=3, **SETTINGS)
        fresh.set_epoch(EPOCH + 1)
        a, b = list(ds), list(fresh)
        assert len(a) == len(b) == len(fresh)
        assert all(torch.equal(u, v) for x, y in zip(a, b) for u, v in zip(x, y))


def test_same_topology_still_resumes_in_the_uninterrupted_order(root):
    ds = open_dataset(root, rank=1, world_size=2, **SETTINGS)
    ds.set_epoch(EPOCH)
    full = list(ds)
    ds = open_dataset(root, rank=1, world_size=2, **SETTINGS)
    ds.set_epoch(EPOCH)
    it = iter(ds)
    head = [next(it) for _ in range(5)]
    fresh = open_dataset(root, rank=1, world_size=2, **SETTINGS)
    fresh.load_state_dict(ds.state_dict())
    rest = list(fresh)
    assert "rest" not in ds.state_dict()
    assert all(torch.equal(u, v) for x, y in zip(head + rest, full) for u, v in zip(x, y))


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=6),
    st.integers(1, 5),
    st.integers(1, 3),
    st.integers(1, 7),
)
def test_division_covers_the_rest_exactly_once(lengths, world_size, num_workers, batch_size):
    pieces = [(k % 2, k // 2, 3 * k, 3 * k + n) for k, n in enumerate(lengths)]
    covered, batches = [], []
    for r in range(world_size):
        count = 0
        for w in range(num_workers):
            share = divide(pieces, World(r, world_size, w, num_workers), batch_size)
            assert all(1 <= s <= batch_size for s in share.sizes)
            assert sum(share.sizes) == sum(hi - lo for *_, lo, hi in share.pieces)
            covered += [(a, b, i) for a, b, lo, hi in share.pieces for i in range(lo, hi)]
            count += len(share.sizes)
        batches.append(count)
    assert len(set(batches)) == 1 and batches[0] == batches_of_rest(pieces, world_size, batch_size)
    want = [(a, b, i) for a, b, lo, hi in pieces for i in range(lo, hi)]
    assert len(covered) == len(set(covered))
    left_out = len(want) - len(covered)
    assert set(covered) <= set(want) and (left_out == 0 or (batch_size == 1 or len(want) < world_size * 2))
    assert left_out < world_size


def test_real_gloo_ranks_two_by_two_to_three_by_zero(root, tmp_path):
    """(1, 1) is a single process: the in-process test above covers it; gloo adds nothing there."""
    import json
    import sys

    from scale_helpers import ROOT, wait

    child = os.path.join(os.path.dirname(os.path.dirname(__file__)), "elastic_child.py")
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.path.dirname(os.path.dirname(__file__))}",
        "OMP_NUM_THREADS": "1",
    }

    def phase(name: str, world_size: int, num_workers: int, state: str, **extra) -> list[dict]:
        init = f"file://{tmp_path / ('rendezvous-' + name)}"
        procs = []
        for r in range(world_size):
            args = {
                "data": root, "dataset": SETTINGS, "init": init, "rank": r, "world_size": world_size,
                "num_workers": num_workers, "state": state, "out": str(tmp_path / f"{name}{r}.npz"), **extra,
            }  # fmt: skip
            procs.append(forkrun.popen([sys.executable, child, json.dumps(args)], env=env))
        wait(procs, timeout=180)
        return [dict(np.load(tmp_path / f"{name}{r}.npz")) for r in range(world_size)]

    full = epoch_windows(root, 2)
    state = str(tmp_path / "state.pt")
    before = phase("stop", 2, 2, state, phase="stop", taken=11)
    assert [int(b["batches"]) for b in before] == [11, 11]
    after = phase("three", 3, 0, state, phase="resume")
    assert len({int(a["batches"]) for a in after}) == 1
    union = np.concatenate([b["index"] for b in before] + [a["index"] for a in after])
    assert len(np.unique(union)) == len(union) and np.array_equal(np.sort(union), full)
    one = resume(root, torch.load(state, weights_only=True), 1, 1)[0]
    union = np.concatenate([b["index"] for b in before] + [windows(one)])
    assert len(np.unique(union)) == len(union) and np.array_equal(np.sort(union), full)


@pytest.mark.parametrize("taken", [3, 23])
def test_len_is_the_states_batches_plus_what_the_rank_yields(root, taken):
    """As after a plain resume, a loop over the elastic epoch yields ``len(ds) - state["batches"]``."""
    state, _ = interrupted(root, taken)
    full = {w: len(open_dataset(root, rank=0, world_size=w, **SETTINGS)) for w in (1, 3)}
    for world_size, num_workers in ((3, 0), (1, 1), (3, 2)):
        for r in range(world_size):
            ds = open_dataset(root, rank=r, world_size=world_size, **SETTINGS)
            ds.load_state_dict(state)
            ds.set_epoch(EPOCH)
            loader = DataLoader(ds, batch_size=None, num_workers=num_workers)
            counted = len(loader)
            seen = []
            for _ in loader:
                seen.append(len(ds))  # during the pass too (the main process's count with workers)
            assert len(seen) == counted - taken
            assert set(seen) == {counted} and counted != full[world_size]
            if num_workers == 0:  # the pass is over; with workers the state stays until set_epoch
                assert len(ds) == full[world_size]
            ds.set_epoch(EPOCH + 1)
            assert len(ds) == full[world_size] == len(list(ds))
    # a second restart in the same epoch: the state records the rest; the same rule holds
    first = open_dataset(root, rank=0, world_size=3, **SETTINGS)
    first.load_state_dict(state)
    it = iter(first)
    for _ in range(2):
        next(it)
    second = first.state_dict()
    it.close()
    for r in range(2):
        ds = open_dataset(root, rank=r, world_size=2, **SETTINGS)
        ds.load_state_dict(second)
        counted = len(ds)
        assert len(list(ds)) == counted - second["batches"]
        assert len(ds) == len(open_dataset(root, rank=r, world_size=2, **SETTINGS))
