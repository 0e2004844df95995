"""Property tests of the plan arithmetic: exact shares across ranks and workers, and skipping."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_windows.planning.plan import batches_per_rank, epoch_order, plan_reader, rng_for, worker_batch_range
from dask_windows.planning.resume import round_robin
from dask_windows.planning.world import World
from dask_windows.runtime.buffer import permute_windows

configs = st.fixed_dictionaries(
    {
        "counts": st.lists(st.integers(0, 40), min_size=1, max_size=8),
        "world_size": st.integers(1, 4),
        "num_workers": st.integers(1, 4),
        "batch_size": st.integers(1, 9),
        "drop_last": st.booleans(),
        "shuffle": st.booleans(),
        "buffer_partitions": st.integers(1, 3),
        "seed": st.integers(0, 3),
        "epoch": st.integers(0, 3),
    }
)


def plan(cfg: dict, rank: int, worker: int, skip_batches: int = 0):
    world = World(rank, cfg["world_size"], worker, cfg["num_workers"])
    keys = ("seed", "epoch", "shuffle", "batch_size", "drop_last", "buffer_partitions")
    return plan_reader(np.array(cfg["counts"]), world, skip_batches=skip_batches, **{k: cfg[k] for k in keys})


def epoch_positions(cfg: dict, p) -> np.ndarray:
    """Epoch-order position of each window a plan covers (skip included), in plan order."""
    counts = np.array(cfg["counts"], dtype=np.int64)
    order = epoch_order(len(counts), cfg["seed"], cfg["epoch"], cfg["shuffle"])
    start_of = dict(zip(order.tolist(), (np.cumsum(counts[order]) - counts[order]).tolist()))
    segments = [seg for group in p.buffers for seg in group]
    pieces = [start_of[s.partition] + np.arange(s.lo, s.hi) for s in segments]
    return np.concatenate(pieces) if pieces else np.zeros(0, np.int64)


def batch_stream(cfg: dict, p) -> list[list[int]]:
    """The batches a plan yields, as epoch positions, drawn the way ``buffer.stream`` draws them."""
    counts = np.array(cfg["counts"], dtype=np.int64)
    order = epoch_order(len(counts), cfg["seed"], cfg["epoch"], cfg["shuffle"])
    start_of = dict(zip(order.tolist(), (np.cumsum(counts[order]) - counts[order]).tolist()))
    drawn = []
    for group, entropy in zip(p.buffers, p.buffer_seeds):
        windows = np.concatenate([start_of[s.partition] + np.arange(s.lo, s.hi) for s in group])
        if cfg["shuffle"]:
            permute_windows(windows, rng_for(*entropy))
        drawn.append(windows)
    flat = np.concatenate(drawn)[p.skip : p.skip + p.num_windows] if drawn else np.zeros(0, np.int64)
    b = cfg["batch_size"]
    return [flat[i : i + b].tolist() for i in range(0, len(flat), b)]


@settings(max_examples=300, deadline=None)
@given(configs)
def test_readers_split_the_epoch_exactly(cfg):
    total = sum(cfg["counts"])
    ws, nw, b = cfg["world_size"], cfg["num_workers"], cfg["batch_size"]
    share = total // ws
    num_batches = batches_per_rank(total, ws, b, cfg["drop_last"])
    used = min(share, num_batches * b)
    seen = []
    for rank in range(ws):
        rank_batches, rank_positions = 0, []
        blocks = [worker_batch_range(num_batches, w, nw) for w in range(nw)]
        last_with_batches = max((w for w, (b0, b1) in enumerate(blocks) if b1 > b0), default=-1)
        for worker in range(nw):
            p = plan(cfg, rank, worker)
            positions = epoch_positions(cfg, p)
            assert p.skip == 0 and len(positions) == p.num_windows
            # Only the rank's last worker with batches may end with a partial batch.
            if worker == last_with_batches:
                assert (p.num_batches - 1) * b < p.num_windows <= p.num_batches * b
            else:
                assert p.num_windows == p.num_batches * b
            rank_batches += p.num_batches
            rank_positions.append(positions)
        assert rank_batches == num_batches  # the same on every rank: len(ds)
        got = np.concatenate(rank_positions)
        # Workers take contiguous blocks of the rank's slice of the epoch order, in worker order.
        np.testing.assert_array_equal(got, np.arange(rank * share, rank * share + used))
        seen.append(got)
    union = np.concatenate(seen)
    assert len(np.unique(union)) == len(union)  # no window read by two readers
    assert len(union) == ws * used and total - len(union) == total % ws + ws * (share - used)


@settings(max_examples=300, deadline=None)
@given(configs, st.data())
def test_skip_batches_drops_the_first_batches(cfg, data):
    rank = data.draw(st.integers(0, cfg["world_size"] - 1))
    worker = data.draw(st.integers(0, cfg["num_workers"] - 1))
    full = plan(cfg, rank, worker)
    k = data.draw(st.integers(0, full.num_batches + 2))
    skipped = plan(cfg, rank, worker, skip_batches=k)
    assert batch_stream(cfg, skipped) == batch_stream(cfg, full)[k:]
    assert skipped.num_batches == max(full.num_batches - k, 0)
    # Buffers wholly inside the skipped batches are not read at all.
    skipped_windows = min(k, full.num_batches) * cfg["batch_size"]
    sizes = [sum(s.num_windows for s in group) for group in full.buffers]
    finished = int(np.searchsorted(np.cumsum(sizes), skipped_windows, side="right"))
    assert skipped.buffers == full.buffers[finished:]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=1, max_size=5), st.data())
def test_round_robin_matches_the_dataloader_order(per_worker, data):
    # An in-order DataLoader asks workers 0, 1, ..., W-1, 0, ... and skips those that ran out.
    order, left, w = [], list(per_worker), 0
    while any(left):
        if left[w]:
            order.append(w)
            left[w] -= 1
        w = (w + 1) % len(per_worker)
    taken = data.draw(st.integers(0, len(order)))
    consumed, next_worker = round_robin(per_worker, taken)
    assert consumed.tolist() == [order[:taken].count(w) for w in range(len(per_worker))]
    if taken < len(order):
        assert next_worker == order[taken]
        # A resumed loader asks worker 0 first: rotating roles to start at next_worker continues the order.
        roles = [(next_worker + i) % len(per_worker) for i in range(len(per_worker))]
        left, resumed, i = [n - c for n, c in zip(per_worker, consumed)], [], 0
        while any(left):
            role = roles[i]
            if left[role]:
                resumed.append(role)
                left[role] -= 1
            i = (i + 1) % len(roles)
        assert resumed == order[taken:]
