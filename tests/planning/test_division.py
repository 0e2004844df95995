"""The division of an epoch between ranks and workers (``planning.division``) against brute force.

The reference cuts a Python list of the epoch's positions with slices: shares per rank, batches
per share, blocks of batches per worker. Every caller (the piece and pool orders, mixtures,
corpora, resume, elastic resume) divides by ``reader_share``; the second test pins it to the
formulas each of them carried before it was written once.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_windows.errors import ConfigError
from dask_windows.planning.division import (
    batches_per_rank,
    reader_share,
    reader_span,
    round_robin,
    worker_batch_range,
    worker_batches,
)
from dask_windows.planning.world import World


def brute_division(total: int, ws: int, nw: int, b: int, drop_last: bool, balanced: bool) -> dict:
    """``{(rank, worker): [batch, ...]}``, each batch a list of epoch positions, by slicing a list."""
    units = list(range(total))
    sizes = [total // ws] * ws
    if balanced:
        wide = [total // ws + (r < total % ws) for r in range(ws)]
        if min(wide) >= -(-max(wide) // b):  # every rank fills as many non-empty batches
            sizes = wide
    num_batches = -(-max(sizes) // b) if balanced else sizes[0] // b if drop_last else -(-sizes[0] // b)
    out, at = {}, 0
    for rank, size in enumerate(sizes):
        share, at = units[at : at + size], at + size
        if balanced:  # num_batches batches of one unit, then filled in order up to b: full ones first
            lengths, extra = [1] * num_batches, size - num_batches
            for j in range(num_batches):
                lengths[j] += min(b - 1, extra)
                extra -= min(b - 1, extra)
            cuts = np.cumsum([0, *lengths]).tolist()
            batches = [share[cuts[j] : cuts[j + 1]] for j in range(num_batches)]
        else:
            batches = [share[i : i + b] for i in range(0, len(share), b)][:num_batches]
        for worker in range(nw):
            out[rank, worker] = batches[worker * num_batches // nw : (worker + 1) * num_batches // nw]
    return out


topologies = st.fixed_dictionaries(
    {
        "total": st.integers(0, 120),
        "ws": st.integers(1, 5),
        "nw": st.integers(1, 4),
        "b": st.integers(1, 9),
        "drop_last": st.booleans(),
        "balanced": st.booleans(),
    }
).filter(lambda c: not (c["balanced"] and c["drop_last"]))


@settings(max_examples=150, deadline=None)
@given(topologies)
def test_reader_share_matches_brute_force_and_the_contract(cfg):
    total, ws, nw, b = cfg["total"], cfg["ws"], cfg["nw"], cfg["b"]
    reference = brute_division(total, ws, nw, b, cfg["drop_last"], cfg["balanced"])
    seen: list[int] = []
    per_rank = []
    for rank in range(ws):
        rank_batches = 0
        for worker in range(nw):
            share = reader_share(total, World(rank, ws, worker, nw), b, cfg["drop_last"], balanced=cfg["balanced"])
            want = reference[rank, worker]
            got = list(range(share.lo, share.hi))
            assert got == [u for batch in want for u in batch]  # a contiguous stretch
            assert share.sizes().tolist() == [len(batch) for batch in want]
            assert share.num_batches == len(want)
            assert all(share.start_after(k) == share.lo + sum(share.sizes()[:k]) for k in range(len(want) + 1))
            assert share.start_after(len(want) + 3) == share.hi
            rank_batches += share.num_batches
            seen += got
            assert all(0 < len(batch) <= b for batch in want)  # no empty batch, none too long
        per_rank.append(rank_batches)
        assert rank_batches == share.rank_batches
    assert len(set(per_rank)) == 1  # every rank yields the same number of batches
    assert len(seen) == len(set(seen))  # every unit at most once over all ranks x workers
    if cfg["balanced"] and share.left_out == 0:
        assert sorted(seen) == list(range(total))  # every unit exactly once
    if not cfg["balanced"]:
        assert share.left_out == total % ws
        if not cfg["drop_last"]:
            assert sorted(seen) == list(range(total - total % ws))  # all but the remainder, exactly once
        assert per_rank[0] == batches_per_rank(total, ws, b, cfg["drop_last"])
    else:
        assert share.left_out in (0, total % ws)


# --- the formulas each caller carried before the division was written once (results must not change) ---


def old_plan_span(total, world, b, drop_last, skip):  # plan.reader_span, pool order
    share = total // world.world_size
    n = share // b if drop_last else -(-share // b)
    used = min(share, n * b)
    b0, b1 = world.worker * n // world.num_workers, (world.worker + 1) * n // world.num_workers
    return world.rank * share + b0 * b, world.rank * share + min(b1 * b, used), b1 - b0, min(max(skip, 0), b1 - b0)


def old_reader_range(total, world, b, drop_last, skip):  # mixture.reader_range, corpus reader_sequences
    share = total // world.world_size
    n = share // b if drop_last else -(-share // b)
    used = min(share, n * b)
    b0, b1 = world.worker * n // world.num_workers, (world.worker + 1) * n // world.num_workers
    hi = world.rank * share + min(b1 * b, used)
    return min(world.rank * share + (b0 + skip) * b, hi), hi


def old_elastic_divide(total, world, b):  # elastic._rank_layout, _batch_bounds, divide: (a, b, sizes)
    shares = np.full(world.world_size, total // world.world_size, dtype=np.int64)
    shares[: total % world.world_size] += 1
    n = -(-int(shares.max()) // b)
    if int(shares.min()) < n:
        shares[:] = total // world.world_size
        n = -(-int(shares[0]) // b)
    j = np.arange(n + 1, dtype=np.int64)
    bounds = np.minimum(j * b, int(shares[world.rank]) - (n - j))
    b0, b1 = world.worker * n // world.num_workers, (world.worker + 1) * n // world.num_workers
    base = int(shares[: world.rank].sum())
    return base + int(bounds[b0]), base + int(bounds[b1]), np.diff(bounds[b0 : b1 + 1]).tolist(), n


def old_state_sizes(total, world, b, drop_last):  # elastic.rest_from_state: a reader's batch sizes
    n = total // world.world_size // b if drop_last else -(-(total // world.world_size) // b)
    b0, b1 = world.worker * n // world.num_workers, (world.worker + 1) * n // world.num_workers
    lo, hi, _, _ = old_plan_span(total, world, b, drop_last, 0)
    sizes = [b] * (b1 - b0)
    if sizes:
        sizes[-1] = (hi - lo) - b * (len(sizes) - 1)
    return sizes


@settings(max_examples=150, deadline=None)
@given(topologies, st.data())
def test_every_caller_gets_what_it_computed_before(cfg, data):
    total, ws, nw, b, drop_last = cfg["total"], cfg["ws"], cfg["nw"], cfg["b"], cfg["drop_last"]
    world = World(data.draw(st.integers(0, ws - 1)), ws, data.draw(st.integers(0, nw - 1)), nw)
    skip = data.draw(st.integers(0, 12))
    share = reader_share(total, world, b, drop_last)
    assert reader_span(total, world, b, drop_last, skip) == old_plan_span(total, world, b, drop_last, skip)
    assert (share.start_after(skip), share.hi) == old_reader_range(total, world, b, drop_last, skip)
    assert share.sizes().tolist() == old_state_sizes(total, world, b, drop_last)
    rest = reader_share(total, world, b, balanced=True)
    lo, hi, sizes, n = old_elastic_divide(total, world, b)
    assert (rest.lo, rest.hi, rest.sizes().tolist(), rest.rank_batches) == (lo, hi, sizes, n)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 40), st.integers(1, 5), st.data())
def test_round_robin_over_the_worker_blocks_is_the_dataloader_prefix(num_batches, nw, data):
    """A rank's batches in worker blocks, asked for in turn: after k batches each worker yielded the first
    ``round_robin(worker_batches(n, W), k)[0][w]`` of its block, and no batch twice."""
    blocks = [list(range(*worker_batch_range(num_batches, w, nw))) for w in range(nw)]
    assert worker_batches(num_batches, nw) == [len(block) for block in blocks]
    assert sorted(x for block in blocks for x in block) == list(range(num_batches))
    order, left, w = [], [list(block) for block in blocks], 0
    while any(left):
        if left[w]:
            order.append(left[w].pop(0))
        w = (w + 1) % nw
    taken = data.draw(st.integers(0, num_batches))
    consumed, _ = round_robin(worker_batches(num_batches, nw), taken)
    assert sorted(order[:taken]) == sorted(x for block, c in zip(blocks, consumed) for x in block[:c])


def test_bad_divisions_raise():
    with pytest.raises(ConfigError, match="balanced"):
        reader_share(10, World(), 3, True, balanced=True)
    with pytest.raises(ConfigError, match="batch_size=0"):
        reader_share(10, World(), 0)
    with pytest.raises(ConfigError, match=r"batches=5 must be in \[0, 4\]"):
        round_robin([2, 2], 5)
