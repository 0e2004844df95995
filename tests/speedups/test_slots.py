"""Batches from DataLoader workers through reused shared slots: exact, deterministic, never reused live."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import make_frames, oracle_starts, write_parquet
from torch.utils.data import DataLoader

import dask_windows as dw
from dask_windows.speedups import slots

WINDOW = 8
ROOT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(os.path.dirname(__file__))))


@pytest.fixture(autouse=True)
def gather_into_slots(monkeypatch):
    """These small batches are gathered straight into slots too (forked workers inherit it)."""
    monkeypatch.setattr(slots.SlotPool, "direct_bytes", 0)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    frames = make_frames(seed=5, num_files=4, num_series=12, max_len=300, channels=2)
    root = str(tmp_path_factory.mktemp("slots"))
    write_parquet(frames, root)
    full = np.concatenate([f["f0"].to_numpy() for f in frames])
    return root, frames, full


def make(root: str, **kw) -> dw.WindowDataset:
    args = dict(features=["f0", "f1"], targets=["y"], series="sid", window=WINDOW, batch_size=16, return_index=True)
    return dw.WindowDataset(root, **{**args, **kw})


def check(batches: list, frames: list, full: np.ndarray) -> np.ndarray:
    """Every window of the oracle exactly once, each batch's values those of its start rows."""
    starts = np.concatenate([b[2].numpy() for b in batches])
    assert np.array_equal(np.sort(starts), oracle_starts(frames, "sid", WINDOW))
    for x, y, rows in batches:
        rows = rows.numpy()
        expected = full[rows[:, None] + np.arange(WINDOW)]
        assert np.array_equal(x[:, 0, :].numpy(), expected)  # f0 == global row
        assert np.array_equal(y[:, 0].numpy(), (rows + WINDOW - 1) * 10.0)
    return starts


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_yield_the_oracle_windows_through_slots_and_the_same_as_no_workers(data, workers):
    root, frames, full = data
    ds = make(root)
    seen, in_slots = [], 0
    for batch in DataLoader(ds, batch_size=None, num_workers=workers):
        in_slots += all(slots.in_slots(t) for t in batch)
        seen.append(tuple(t.clone() for t in batch))  # clones: the slots are reused
    starts = check(seen, frames, full)
    assert in_slots == len(seen)  # one consumer dropping each batch: every batch took a slot
    ds0 = make(root)
    ds0.set_epoch(0)
    zero = np.concatenate([b[2].numpy() for b in DataLoader(ds0, batch_size=None)])
    assert np.array_equal(np.sort(starts), np.sort(zero))
    assert len(seen) == len(ds)


def test_same_seed_gives_the_same_batches_in_the_same_order(data):
    root, _, _ = data

    def run() -> list:
        return [tuple(t.clone() for t in b) for b in DataLoader(make(root, seed=4), batch_size=None, num_workers=2)]

    a, b = run(), run()
    assert len(a) == len(b)
    assert all(torch.equal(p, q) for u, v in zip(a, b) for p, q in zip(u, v))


def test_batches_kept_by_the_loop_are_never_overwritten(data):
    root, frames, full = data
    kept = list(DataLoader(make(root), batch_size=None, num_workers=2))  # every batch alive at once
    assert len(kept) > 2 * slots.SLOTS  # more than the rings hold: the rest took torch's path
    flags = [slots.in_slots(b[0]) for b in kept]
    assert any(flags) and not all(flags)
    check(kept, frames, full)


def test_views_of_batches_keep_their_slots(data):
    root, _, full = data
    views = [(x[:3, 0], rows[:3]) for x, _, rows in DataLoader(make(root), batch_size=None, num_workers=1)]
    for x, rows in views:
        assert np.array_equal(x.numpy(), full[rows.numpy()[:, None] + np.arange(WINDOW)])


def test_persistent_workers_two_iterators_and_an_abandoned_one(data):
    root, frames, full = data
    ds = make(root)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    first = iter(loader)
    for _ in range(3):
        next(first)  # abandoned mid-epoch: the next iter() resets the same workers
    epochs = [[tuple(t.clone() for t in b) for b in loader] for _ in range(2)]
    for batches in epochs:
        check(batches, frames, full)
    other = DataLoader(make(root), batch_size=None, num_workers=1)
    a, b = iter(other), iter(DataLoader(make(root), batch_size=None, num_workers=2))
    both = list(zip(a, b))  # two sets of workers at once, each with its rings
    check([p for p, _ in both], frames, full)


def test_ranks_with_workers_cover_the_epoch_once(data):
    root, frames, _ = data
    starts = []
    for rank in range(2):
        ds = make(root, rank=rank, world_size=2, drop_last=False)
        starts += [b[2].clone() for b in DataLoader(ds, batch_size=None, num_workers=2)]
    got = np.sort(np.concatenate([s.numpy() for s in starts]))
    expected = oracle_starts(frames, "sid", WINDOW)
    assert set(got.tolist()) == set(expected.tolist()) and len(got) >= len(expected)


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_spawned_workers_use_slots_too(data, context):
    root, frames, full = data
    loader = DataLoader(make(root), batch_size=None, num_workers=1, multiprocessing_context=context)
    seen, flags = [], []
    for batch in loader:
        flags.append(slots.in_slots(batch[0]))
        seen.append(tuple(t.clone() for t in batch))
    check(seen, frames, full)
    assert all(flags)


def test_a_mixture_through_workers_uses_slots_and_keeps_its_windows(data):
    root, _, _ = data
    mixture = dw.mix({"a": make(root), "b": make(root, seed=9)})
    zero = [b[2].clone() for b in DataLoader(mixture, batch_size=None)]
    mixture.set_epoch(0)
    flags, two = [], []
    for batch in DataLoader(mixture, batch_size=None, num_workers=2):
        flags.append(all(slots.in_slots(t) for t in batch))
        two.append(batch[2].clone())
    assert all(flags) and len(two) == len(zero) == len(mixture)
    assert np.array_equal(np.sort(torch.cat(zero).numpy()), np.sort(torch.cat(two).numpy()))


def test_stateful_loader_resumes_mid_epoch_with_workers(data):
    stateful = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader
    root, _, _ = data
    whole = [b[2].clone() for b in stateful(make(root), batch_size=None, num_workers=2)]
    loader = stateful(make(root), batch_size=None, num_workers=2)
    it = iter(loader)
    head = [next(it)[2].clone() for _ in range(5)]
    state = loader.state_dict()
    del it
    again = stateful(make(root), batch_size=None, num_workers=2)
    again.load_state_dict(state)
    tail = [b[2].clone() for b in again]
    assert all(torch.equal(p, q) for p, q in zip(head + tail, whole)) and len(head + tail) == len(whole)


def test_a_killed_worker_raises_and_leaves_no_shared_memory(data):
    root, _, _ = data
    script = f"""
import gc, os, signal
import torch, dask_windows as dw
pids = {{str(os.getpid())}}
def ours():  # /dev/shm is shared with other programs (a second test run): names we or torch would make here
    return {{n for n in os.listdir("/dev/shm") if "dask" in n or ("torch" in n and any(p in n for p in pids))}}
def rings():
    return sum("dask_windows-slots" in line for line in open("/proc/self/maps"))
before = ours()
ds = dw.WindowDataset({root!r}, features=["f0"], series="sid", window=8, batch_size=4)
it = iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1, timeout=120))
kept = [next(it) for _ in range(3)]
print("mapped", rings())
pids.add(str(it._workers[0].pid))  # torch names a segment after the process that made it
os.kill(it._workers[0].pid, signal.SIGKILL)
try:
    for got in it:
        kept.append(got)
    print("no error")
except RuntimeError as exc:
    print("raised", "exited unexpectedly" in str(exc) or "killed" in str(exc))
got = None
del it, kept, got
gc.collect()
print("shm", ours() == before)
fresh = iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1))
batch = next(fresh)  # a new ring: the dead worker's mapping is dropped, its memory freed
print("mapped", rings())
"""
    env = dict(os.environ, PYTHONPATH=ROOT_DIR)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["mapped", "1", "raised", "True", "shm", "True", "mapped", "1"], (
        out.stdout + out.stderr
    )


def test_disabled_by_environment_and_outside_workers(data, monkeypatch):
    root, frames, full = data
    assert not slots.enabled()  # the main process: batches are plain tensors
    monkeypatch.setenv("DASK_WINDOWS_SLOTS", "0")  # forked workers inherit it: torch's own path
    seen = list(DataLoader(make(root), batch_size=None, num_workers=1))
    assert not any(slots.in_slots(b[0]) for b in seen)
    check(seen, frames, full)


def check_values(batches: list, full: np.ndarray) -> None:
    """Each batch's values those of its start rows (for a subset of an epoch's batches)."""
    for x, y, rows in batches:
        rows = rows.numpy()
        assert np.array_equal(x[:, 0, :].numpy(), full[rows[:, None] + np.arange(WINDOW)])
        assert np.array_equal(y[:, 0].numpy(), (rows + WINDOW - 1) * 10.0)


def _worker_side(root: str, kept_every: int, **kw) -> tuple[list, list, int]:
    """A worker's batches made in this process, each pickled as a worker does and rebuilt as the main
    process does: (kept rebuilt batches, their clones, batches gathered into slots less those copied)."""
    import pickle
    from multiprocessing.reduction import ForkingPickler

    from torch.utils.data._utils import worker

    ds = make(root, **kw)
    worker._worker_info = worker.WorkerInfo(id=0, num_workers=1, seed=3, dataset=ds)
    found = {"pool": 0, "copy": 0}  # slots taken by the gather itself / for a whole batch's copy
    ring_for = slots._ring_for

    def counted(nbytes: int, min_bytes: int | None = None) -> object:
        got = ring_for(nbytes, min_bytes)
        found["copy" if min_bytes is None else "pool"] += got is not None
        return got

    slots._ring_for = counted
    try:
        kept, clones = [], []
        for n, batch in enumerate(ds, 1):
            data = ForkingPickler.dumps(batch)
            del batch
            batch = pickle.loads(data)
            if n % kept_every == 0:
                kept.append(batch)
                clones.append(tuple(t.clone() for t in batch))
            del batch
        return kept, clones, found["pool"] - found["copy"]
    finally:
        worker._worker_info = None
        slots._ring_for = ring_for


def test_features_gathered_straight_into_slots_stay_exact_while_later_batches_reuse_the_ring(data):
    root, _, full = data
    kept, clones, direct = _worker_side(root, kept_every=5)  # some batches kept, the rest dropped
    assert direct > 2 * slots.SLOTS  # slots were reused for batches gathered straight into them
    assert sum(slots.in_slots(b[0]) for b in kept) >= slots.SLOTS // 2
    assert all(torch.equal(p, q) for u, v in zip(kept, clones) for p, q in zip(u, v))
    check_values(kept, full)


def test_slot_gathered_batches_when_the_loop_keeps_every_one(data):
    root, _, full = data
    kept, clones, direct = _worker_side(root, kept_every=1)  # the ring fills up, then the fallback pool
    assert direct > 0 and len(kept) > slots.SLOTS
    assert all(torch.equal(p, q) for u, v in zip(kept, clones) for p, q in zip(u, v))
    check_values(kept, full)


def test_slot_gathered_batches_through_workers_match_no_workers_with_global_normalisation(data):
    root, _, _ = data
    kw = dict(normalize={"mean": [1.0, 2.0], "std": [3.0, 4.0]}, seed=2)
    zero = [tuple(t.clone() for t in b) for b in DataLoader(make(root, **kw), batch_size=None)]
    one = [tuple(t.clone() for t in b) for b in DataLoader(make(root, **kw), batch_size=None, num_workers=1)]
    assert len(zero) == len(one)
    assert all(torch.equal(p, q) for u, v in zip(zero, one) for p, q in zip(u, v))


def test_a_slice_of_slot_gathered_features_never_gets_another_tensor_written_over_the_rest(monkeypatch):
    from torch.utils.data._utils import worker

    monkeypatch.setattr(worker, "_worker_info", worker.WorkerInfo(id=0, num_workers=1, seed=0, dataset=None))
    x = slots.SlotPool().take((8, 2, 1000), np.float32)
    x[:] = np.arange(x.size, dtype=np.float32).reshape(x.shape)
    features = torch.from_numpy(x)
    head, tail = features[:3], features[3:]  # two batches sharing the slot (a Mixture's recut)
    y = torch.full((3, 4000), -1.0)
    first = slots._to_slot((head, y))
    assert torch.equal(first[1], y)
    assert torch.equal(tail, torch.arange(3 * 2000, x.size, dtype=torch.float32).reshape(5, 2, 1000))
    again = slots._to_slot((features, torch.ones(8)))  # once shared by slices: copied whole, never in place
    assert again[0].data_ptr() != features.data_ptr() and torch.equal(again[0], features)
    other = torch.from_numpy(slots.SlotPool().take((8, 2, 1000), np.float32))
    whole = slots._to_slot((other, torch.ones(8)))  # the whole array: its other tensor goes in its slot
    assert whole[0].data_ptr() == other.data_ptr() and torch.equal(whole[1], torch.ones(8))
    assert other.data_ptr() < whole[1].data_ptr() < other.data_ptr() + 8 * 2000 * 4 + slots.HEADROOM
