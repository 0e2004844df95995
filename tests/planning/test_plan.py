"""Property tests of the plan arithmetic for whole partitions (a pool of ``buffer_partitions`` partitions):
exact shares across ranks and workers, and skipping."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_windows.planning.plan import batches_per_rank, epoch_order, worker_batch_range
from dask_windows.planning.pool import plan_pool, reader_windows
from dask_windows.planning.resume import round_robin
from dask_windows.planning.world import World

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
    """Whole partitions: the pool plan of one unit per partition, ``buffer_partitions`` resident (one run of
    ``counts[p]`` windows at stride 1 and span 1 per partition)."""
    world = World(rank, cfg["world_size"], worker, cfg["num_workers"])
    counts = [int(c) for c in cfg["counts"]]
    first = [np.zeros(1, np.int64) for _ in counts]
    runs = [np.array([c], np.int64) for c in counts]
    bounds = [np.array([0, c], np.int64) for c in counts]
    keys = ("seed", "epoch", "shuffle", "batch_size", "drop_last")
    return plan_pool(
        first, runs, 1, 1, bounds, world, pool_rows=0, skip_batches=skip_batches,
        resident=cfg["buffer_partitions"], **{k: cfg[k] for k in keys},
    )  # fmt: skip


def epoch_positions(cfg: dict, p) -> np.ndarray:
    """Epoch-order position of each window a plan yields, in the order it yields them."""
    counts = np.array(cfg["counts"], dtype=np.int64)
    order = epoch_order(len(counts), cfg["seed"], cfg["epoch"], cfg["shuffle"])
    start_of = dict(zip(order.tolist(), (np.cumsum(counts[order]) - counts[order]).tolist()))
    return np.array([start_of[q] + w for q, w in reader_windows(p)], np.int64)


def batch_stream(cfg: dict, p) -> list[list[int]]:
    """The batches a plan yields, as epoch positions."""
    flat = epoch_positions(cfg, p)
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
            positions = np.sort(epoch_positions(cfg, p))
            assert p.skip == 0 and len(positions) == p.num_windows
            assert len({u.partition for u in p.units}) == len(p.units)  # one unit per partition
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
        for p in (plan(cfg, rank, w) for w in range(nw)):  # at most buffer_partitions partitions resident
            assert p.spread <= cfg["buffer_partitions"] or not p.units
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
    # Partitions whose windows were all drawn before the resume are not read at all.
    assert skipped.units == full.units and skipped.first_unit >= full.first_unit


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
