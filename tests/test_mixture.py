"""Mixtures against a brute-force model of their schedule: counts, shares, streams, resume, workers, DDP."""

from __future__ import annotations

import os
import pickle
from fractions import Fraction

import forkrun
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dask_windows as dw
from dask_windows.errors import ConfigError
from dask_windows.planning.schedule import labels, positions, prefix_counts

WINDOW = 3
# Members of very different sizes; values encode (member offset + row) so an index names a window.
SIZES = {"small": 23, "medium": 260, "large": 1500}
OFFSETS = {"small": 0, "medium": 10_000, "large": 20_000}
WEIGHTS = {"small": 0.3, "medium": 0.5, "large": 0.2}
PER_EPOCH = 600
BATCH = 32


def member(name: str, batch_size: int) -> dw.WindowDataset:
    rows = SIZES[name] + WINDOW - 1
    data = np.arange(OFFSETS[name], OFFSETS[name] + rows, dtype=np.float32)[:, None]
    return dw.WindowDataset(
        [data], window=WINDOW, batch_size=batch_size, return_index=True, seed=len(name),
        partition_rows=97, buffer_partitions=2,
    )  # fmt: skip


@pytest.fixture(scope="module")
def members() -> dict:
    return {"small": member("small", 7), "medium": member("medium", 16), "large": member("large", 50)}


def make(members: dict, **kw) -> dw.Mixture:
    return dw.mix(members, WEIGHTS, windows_per_epoch=PER_EPOCH, batch_size=BATCH, return_source=True, **kw)


def member_epoch(ds: dw.WindowDataset, epoch: int) -> np.ndarray:
    """A member's own epoch order (one reader), by iterating it."""
    ds.set_epoch(epoch)
    return np.concatenate([b[1].numpy() for b in ds])


def brute_schedule(counts: list[int]) -> list[int]:
    """Members of the epoch's positions: every (member, k) sorted by the key (2k+1)/(2 n), ties by member."""
    keys = sorted((Fraction(2 * k + 1, 2 * n), m) for m, n in enumerate(counts) for k in range(n))
    return [m for _, m in keys]


def brute_epoch(members: dict, counts: list[int], epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """(member label, window index) of every position of mixture ``epoch``, from first principles."""
    order = brute_schedule(counts)
    names = list(members)
    streams = []
    for m, name in enumerate(names):
        size, n = members[name].num_windows, counts[m]
        first, last = epoch * n // size, ((epoch + 1) * n - 1) // size if n else 0
        stream = np.concatenate([member_epoch(members[name], e) for e in range(first, last + 1)])
        streams.append(iter(stream[epoch * n - first * size :]))
    return np.array(order), np.array([next(streams[m]) for m in order], dtype=np.int64)


def flat(batches: list) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([b[2].numpy() for b in batches]), np.concatenate([b[1].numpy() for b in batches])


@pytest.fixture(scope="module")
def expected(members) -> dict:
    counts = [int(c) for c in make(members).counts]
    return {e: brute_epoch(members, counts, e) for e in range(4)}


def test_counts_streams_and_order_over_four_epochs(members, expected):
    mixture = make(members)
    assert list(mixture.counts) == [180, 300, 120] and mixture.num_windows == PER_EPOCH
    assert len(mixture) == -(-PER_EPOCH // BATCH)
    for epoch in range(4):
        mixture.set_epoch(epoch)
        batches = list(mixture)
        assert len(batches) == len(mixture)
        label, index = flat(batches)
        want_label, want_index = expected[epoch]
        assert np.array_equal(label, want_label) and np.array_equal(index, want_index)
        # Exact per-epoch counts; a window's values are its member's rows.
        assert np.bincount(label, minlength=3).tolist() == [180, 300, 120]
        x = np.concatenate([b[0][:, 0, 0].numpy() for b in batches])
        offsets = np.array(list(OFFSETS.values()))[label]
        assert np.array_equal(x, (offsets + index).astype(np.float32))
        for batch in batches:  # per-batch shares: within 2 of exact, far inside the binomial band
            got = np.bincount(batch[2].numpy(), minlength=3)
            share = len(batch[2]) * np.array([180, 300, 120]) / PER_EPOCH
            band = 3 * np.sqrt(share * (1 - share / len(batch[2])))
            assert (np.abs(got - share) <= np.minimum(2, band + 1)).all()


def test_member_windows_never_repeat_inside_a_member_epoch(members, expected):
    names = list(members)
    for m, name in enumerate(names):
        size = members[name].num_windows
        stream = np.concatenate([expected[e][1][expected[e][0] == m] for e in range(4)])
        for lo in range(0, len(stream), size):  # one member epoch: a permutation of the member's windows
            chunk = stream[lo : lo + size]
            assert len(np.unique(chunk)) == len(chunk)
            if len(chunk) == size:
                assert np.array_equal(np.sort(chunk), np.sort(member_epoch(members[name], 0)))
    # the small member repeats 180/23 times an epoch, each pass reshuffled
    small = expected[0][1][expected[0][0] == 0]
    assert not np.array_equal(small[:23], small[23:46])


def test_resume_at_every_interruption_point(members, expected):
    mixture = make(members)
    for epoch in (0, 3):
        mixture.set_epoch(epoch)
        batches = list(mixture)
        for k in range(len(batches) + 1):
            saved = _state_after(members, epoch, k)
            assert saved["batches"] == k
            fresh = make(members)
            fresh.load_state_dict(pickle.loads(pickle.dumps(saved)))
            rest = list(fresh)
            assert len(rest) == len(batches) - k
            for a, b in zip(rest, batches[k:]):
                assert all(torch.equal(u, v) for u, v in zip(a, b))


def _state_after(members: dict, epoch: int, k: int) -> dict:
    mixture = make(members)
    mixture.set_epoch(epoch)
    it = iter(mixture)
    for _ in range(k):
        next(it)
    return mixture.state_dict()


def test_dataloader_workers_yield_the_same_batches(members, expected):
    mixture = make(members)
    mixture.set_epoch(1)
    single = [tuple(t.numpy().tobytes() for t in b) for b in mixture]
    mixture.set_epoch(1)  # each pass takes the next epoch unless set_epoch pins it
    loader = torch.utils.data.DataLoader(mixture, batch_size=None, num_workers=2)
    got = [tuple(t.numpy().tobytes() for t in b) for b in loader]
    assert sorted(got) == sorted(single) and len(got) == len(mixture)
    # loader-scope resume with workers: the rest of the epoch in the uninterrupted order
    state = mixture.state_dict(batches=5, num_workers=2)
    fresh = make(members)
    fresh.load_state_dict(state)
    rest = [
        tuple(t.numpy().tobytes() for t in b)
        for b in torch.utils.data.DataLoader(fresh, batch_size=None, num_workers=2)
    ]
    assert rest == got[5:]


def pairs_of(batches: list) -> list[tuple[int, int]]:
    label, index = flat(batches)
    return sorted(zip(label.tolist(), index.tolist()))


# Persistent workers iterate their copies once per pass (spawned ones: tests/runtime/test_epochs.py).
PERSISTENT = {"num_workers": 2, "persistent_workers": True}


@pytest.mark.parametrize("loader", [{"num_workers": 0}, {"num_workers": 2}, PERSISTENT])
def test_each_pass_takes_the_next_epoch_and_workers_agree(members, expected, loader):
    """Like a WindowDataset: pass k is epoch k in every worker; set_epoch and load_state_dict still win."""
    mixture = make(members)
    it = torch.utils.data.DataLoader(mixture, batch_size=None, **loader)
    passes = [list(it) for _ in range(3)]
    for epoch, got in enumerate(passes):
        want_label, want_index = expected[epoch]
        assert len(got) == len(mixture)
        if loader["num_workers"] == 0:  # the exact order
            assert np.array_equal(flat(got)[0], want_label) and np.array_equal(flat(got)[1], want_index)
        # one epoch's windows, each position once: the workers of the pass agreed on the epoch
        assert pairs_of(got) == sorted(zip(want_label.tolist(), want_index.tolist()))
    assert pairs_of(passes[0]) != pairs_of(passes[1]) != pairs_of(passes[2])
    assert mixture.epoch == 2
    mixture.set_epoch(1)
    assert pairs_of(list(it)) == pairs_of(passes[1])  # set_epoch pins the next pass
    assert pairs_of(list(it)) == pairs_of(passes[2])  # and the passes count on from there
    state = _state_after(members, 3, 5)
    mixture.load_state_dict(state)  # the next pass is the rest of epoch 3, in the uninterrupted order
    # (a new loader: persistent workers keep the copies they were started with, states included)
    rest = list(torch.utils.data.DataLoader(mixture, batch_size=None, num_workers=loader["num_workers"]))
    want_label, want_index = expected[3]
    assert len(rest) == len(mixture) - 5
    assert pairs_of(rest) == sorted(zip(want_label[5 * BATCH :].tolist(), want_index[5 * BATCH :].tolist()))


@pytest.mark.parametrize("world_size", [2, 3])
def test_explicit_ranks_take_equal_exact_slices(members, expected, world_size):
    ranks = [make(members, rank=r, world_size=world_size) for r in range(world_size)]
    for ds in ranks:
        ds.set_epoch(2)
    got = [flat(list(ds)) for ds in ranks]
    assert len({len(ds) for ds in ranks}) == 1
    label = np.concatenate([g[0] for g in got])
    index = np.concatenate([g[1] for g in got])
    share = PER_EPOCH // world_size
    want_label, want_index = expected[2]
    assert np.array_equal(label, want_label[: share * world_size])
    assert np.array_equal(index, want_index[: share * world_size])


def test_bad_arguments_raise_clearly(members):
    with pytest.raises(ConfigError, match="one weight per member"):
        dw.mix(members, {"small": 1.0})
    with pytest.raises(ConfigError, match=">= 0"):
        dw.mix(members, {"small": -1, "medium": 1, "large": 1})
    other = dw.WindowDataset([np.zeros((50, 1), np.float32)], window=5)
    with pytest.raises(ConfigError, match="'other' differs.*window"):
        dw.mix({"small": members["small"], "other": other})
    with pytest.raises(TypeError, match="WindowDataset"):
        dw.mix({"a": [1, 2, 3]})
    state = make(members).state_dict(batches=0, num_workers=1)
    with pytest.raises(ConfigError, match="different dataset"):
        dw.mix(
            members, {"small": 1, "medium": 1, "large": 1}, windows_per_epoch=PER_EPOCH, batch_size=BATCH
        ).load_state_dict(state)


def test_default_weights_follow_member_sizes(members):
    mixture = dw.mix(members)
    assert list(mixture.counts) == [members[n].num_windows for n in members]
    assert mixture.member_epochs(0) == [(0, 0)] * 3


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=4).filter(lambda c: sum(c) > 0), st.data())
def test_schedule_arithmetic_matches_brute_force(counts, data):
    order = brute_schedule(counts)
    n = np.array(counts)
    ks = [sum(1 for m in order[:i] if m == order[i]) for i in range(len(order))]
    assert np.array_equal(positions(n, np.array(order), np.array(ks)), np.arange(len(order)))
    i = data.draw(st.integers(0, len(order)))
    assert prefix_counts(n, i).tolist() == np.bincount(order[:i], minlength=len(counts)).tolist()
    lo = data.draw(st.integers(0, len(order)))
    hi = data.draw(st.integers(lo, len(order)))
    member, k = labels(n, lo, hi)
    assert member.tolist() == order[lo:hi] and k.tolist() == ks[lo:hi]


def test_ddp_two_gloo_ranks(members, expected, tmp_path):
    import sys

    from scale_helpers import ROOT, wait

    child = os.path.join(os.path.dirname(__file__), "mixture_child.py")
    init = f"file://{tmp_path / 'rendezvous'}"
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    procs = [
        forkrun.popen([sys.executable, child, init, str(r), str(tmp_path / f"rank{r}.npz")], env=env) for r in range(2)
    ]
    wait(procs, timeout=180)
    got = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    assert int(got[0]["batches"]) == int(got[1]["batches"]) == -(-(PER_EPOCH // 2) // BATCH)
    label = np.concatenate([g["label"] for g in got])
    index = np.concatenate([g["index"] for g in got])
    # rank 0 holds the first half of the epoch; its workers' blocks are in loader order, so sort per rank
    want_label, want_index = expected[1]
    for r, g in enumerate(got):
        lo, hi = r * 300, (r + 1) * 300
        pairs = sorted(zip(g["label"].tolist(), g["index"].tolist()))
        assert pairs == sorted(zip(want_label[lo:hi].tolist(), want_index[lo:hi].tolist()))
    assert len(label) == len(index) == PER_EPOCH


@pytest.mark.parametrize("world_size,num_workers", [(3, 0), (1, 1)])
def test_elastic_resume_from_two_ranks_with_two_workers(members, expected, world_size, num_workers):
    taken = 4
    before = []
    for r in range(2):
        mixture = make(members, rank=r, world_size=2)
        mixture.set_epoch(3)
        loader = iter(torch.utils.data.DataLoader(mixture, batch_size=None, num_workers=2))
        before += [next(loader) for _ in range(taken)]
        del loader
    state = pickle.loads(pickle.dumps(mixture.state_dict(batches=taken, num_workers=2)))
    after = []
    for r in range(world_size):
        fresh = make(members, rank=r, world_size=world_size)
        fresh.load_state_dict(state)
        counted = len(fresh)  # as after a plain resume: the state's batches, then this rank's of the rest
        after.append(list(torch.utils.data.DataLoader(fresh, batch_size=None, num_workers=num_workers)))
        assert len(after[-1]) == counted - taken and counted != len(make(members, rank=r, world_size=world_size))
    assert len({len(a) for a in after}) == 1
    pairs = [(int(m), int(i)) for b in before + [b for a in after for b in a] for m, i in zip(b[2], b[1])]
    assert len(pairs) == PER_EPOCH  # 600 windows, 2 ranks: none left out
    want_label, want_index = expected[3]
    # a member window repeats inside a mixture epoch when the member is smaller than its share:
    # the multiset of (member, window) is the epoch's, each position exactly once
    assert sorted(pairs) == sorted(zip(want_label.tolist(), want_index.tolist()))
