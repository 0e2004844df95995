"""The gather (numpy and torch paths) and its reused output arrays against a brute-force oracle.

Every batch a caller still holds - whole, as a view, as ``.numpy()``, modified in place, through
a DataLoader with pinned memory or worker processes - must keep the values it was yielded with,
however many batches come after it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import make_frames, write_parquet

import dask_windows as dw
from dask_windows.runtime import batch as batch_module
from dask_windows.runtime.batch import Gatherer, OutputPool, PathChoice

FEATURES = ["f0", "f1", "f2"]
TARGETS = ["y", "z"]


@pytest.fixture(scope="module")
def frames():
    return make_frames(seed=5, num_files=4, num_series=12, min_len=20, max_len=260)


@pytest.fixture(scope="module")
def full(frames):
    return pd.concat(frames, ignore_index=True)


@pytest.fixture(scope="module")
def root(frames, tmp_path_factory):
    path = tmp_path_factory.mktemp("gather")
    write_parquet(frames, str(path), row_group_size=101)
    return str(path)


@pytest.fixture(params=["torch", "numpy", "alternate"])
def path(request, monkeypatch):
    """Which gather runs: torch for every batch, numpy for every batch, or each in turn."""
    monkeypatch.setattr(batch_module, "_TORCH_MIN_BYTES", 1 << 62 if request.param == "numpy" else 0)
    monkeypatch.setattr(batch_module, "_threads", lambda: 2)  # DataLoader workers run torch with 1 thread
    pick = (lambda self: True) if request.param == "torch" else (lambda self: self.batches % 2 == 0)
    monkeypatch.setattr(PathChoice, "torch_next", pick)
    return request.param


def make(root, **kw):
    args = dict(features=FEATURES, series="sid", window=16, batch_size=24, return_index=True, seed=2)
    args.update(kw)
    return dw.WindowDataset(root, **args)


def expected_x(full, rows, window, layout="NCL"):
    """``(B, C, L)`` or ``(B, L, C)`` features of the windows starting at global ``rows``."""
    feats = full[FEATURES].to_numpy(np.float32)
    out = feats[np.asarray(rows)[:, None] + np.arange(window)]  # (B, L, C)
    return out.transpose(0, 2, 1) if layout == "NCL" else out


def expected_y(full, rows, window, horizon):
    tg = full[TARGETS].to_numpy(np.float32)
    rows = np.asarray(rows)
    if horizon:
        return tg[rows[:, None] + window + np.arange(horizon)].transpose(0, 2, 1)  # (B, T, H)
    return tg[rows + window - 1]


@pytest.mark.parametrize("layout", ["NCL", "NLC"])
@pytest.mark.parametrize("stride,horizon,targets", [(1, 0, False), (1, 0, True), (3, 4, True), (1, 5, True)])
def test_kept_batches_equal_the_oracle(full, root, path, layout, stride, horizon, targets):
    ds = make(root, window=16, stride=stride, horizon=horizon, layout=layout, targets=TARGETS if targets else None)
    kept = list(ds)  # every batch held at once: no array may be reused under them
    assert len(kept) == len(ds) > 10
    rows = np.concatenate([b[-1].numpy() for b in kept])
    assert len(np.unique(rows)) == len(rows) == ds.num_windows
    for batch in kept:
        x, idx = batch[0], batch[-1].numpy()
        assert x.is_contiguous() and x.dtype == torch.float32
        np.testing.assert_array_equal(x.numpy(), expected_x(full, idx, 16, layout))
        if targets:
            np.testing.assert_array_equal(batch[1].numpy(), expected_y(full, idx, 16, horizon))


@pytest.mark.parametrize("keep", ["view", "numpy", "inplace", "storage", "none"])
def test_what_the_caller_keeps_is_never_overwritten(full, root, path, keep):
    ds = make(root, window=16, buffer_partitions=1)  # batches straddle buffers: the carry path too
    kept = []
    checked = 0
    for x, idx in ds:
        # every batch is right when it arrives, whatever was reused for it
        np.testing.assert_array_equal(x.numpy(), expected_x(full, idx.numpy(), 16))
        if keep == "view":
            kept.append((x[0:1], idx[0:1].clone()))
        elif keep == "numpy":
            kept.append((x.numpy(), idx.clone()))
        elif keep == "inplace":
            x.mul_(2)
            kept.append((x, idx.clone()))
        elif keep == "storage":
            kept.append((x.untyped_storage(), x.shape, idx.clone()))
        checked += 1
    assert checked == len(ds) > 10
    for item in kept:
        idx = item[-1].numpy()
        if keep == "storage":
            storage, shape = item[0], item[1]
            x = torch.empty(0).set_(storage).view(shape).numpy()
        else:
            x = np.asarray(item[0])
        scale = 2 if keep == "inplace" else 1
        np.testing.assert_array_equal(x, scale * expected_x(full, idx, 16))


@pytest.mark.filterwarnings("ignore:.*pin_memory:UserWarning")  # pinning needs an accelerator
@pytest.mark.parametrize("loader", [dict(pin_memory=True), dict(num_workers=2), dict(num_workers=1, prefetch_factor=4)])
def test_through_a_dataloader_every_kept_batch_equals_the_oracle(full, root, path, loader):
    ds = make(root, window=16, targets=TARGETS, horizon=3, layout="NLC")
    kept = list(torch.utils.data.DataLoader(ds, batch_size=None, **loader))
    assert len(kept) == len(ds)
    rows = np.concatenate([b[-1].numpy() for b in kept])
    assert len(np.unique(rows)) == ds.num_windows
    for x, y, idx in kept:
        np.testing.assert_array_equal(x.numpy(), expected_x(full, idx.numpy(), 16, "NLC"))
        np.testing.assert_array_equal(y.numpy(), expected_y(full, idx.numpy(), 16, 3))


@pytest.mark.parametrize("layout", ["NCL", "NLC"])
def test_normalisation_is_the_same_on_both_paths(root, monkeypatch, layout):
    monkeypatch.setattr(batch_module, "_threads", lambda: 2)

    def run(threshold, **kw):
        monkeypatch.setattr(batch_module, "_TORCH_MIN_BYTES", threshold)
        return [tuple(t.numpy().copy() for t in b) for b in make(root, layout=layout, **kw)]

    for kw in [dict(normalize="sample"), dict(normalize={"mean": [1, 2, 3], "std": [2, 4, 8]})]:
        by_torch, by_numpy = run(0, **kw), run(1 << 62, **kw)
        assert len(by_torch) == len(by_numpy) > 10
        for a, b in zip(by_torch, by_numpy):
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])


def test_integer_targets_and_arrays_source(monkeypatch):
    monkeypatch.setattr(batch_module, "_TORCH_MIN_BYTES", 0)
    monkeypatch.setattr(batch_module, "_threads", lambda: 2)
    rows = 3_000
    frame = pd.DataFrame(
        {"a": np.arange(rows, dtype=np.float32), "b": -np.arange(rows, dtype=np.float32), "label": np.arange(rows) % 5}
    )
    ds = dw.WindowDataset(frame, features=["a", "b"], targets=["label"], window=40, batch_size=64, return_index=True)
    kept = list(ds)
    assert sum(len(b[0]) for b in kept) == ds.num_windows == rows - 39
    for x, y, idx in kept:
        idx = idx.numpy()
        assert y.dtype == torch.int64
        np.testing.assert_array_equal(x[:, 0].numpy(), idx[:, None] + np.arange(40, dtype=np.float32))
        np.testing.assert_array_equal(x[:, 1].numpy(), -(idx[:, None] + np.arange(40, dtype=np.float32)))
        np.testing.assert_array_equal(y[:, 0].numpy(), (idx + 39) % 5)


@pytest.mark.parametrize("layout", ["NCL", "NLC"])
def test_gatherer_torch_path_equals_fancy_indexing(monkeypatch, layout):
    rng = np.random.default_rng(0)
    channels, rows, window = 5, 3_000, 33
    data = rng.standard_normal((channels, rows)).astype(np.float32)
    x = data if layout == "NCL" else np.ascontiguousarray(data.T)
    mean, std = rng.standard_normal(channels).astype(np.float32), rng.uniform(1, 3, channels).astype(np.float32)
    monkeypatch.setattr(batch_module, "_threads", lambda: 2)
    pool = OutputPool()
    for starts in [rng.integers(0, rows - window + 1, 100), np.array([0, rows - window]), np.zeros(0, np.int64)]:
        for scale in [(None, None), (mean, std)]:
            monkeypatch.setattr(batch_module, "_TORCH_MIN_BYTES", 0)
            got = Gatherer(x, None, window, 0, layout, *scale).features(starts.astype(np.int32), pool)
            monkeypatch.setattr(batch_module, "_TORCH_MIN_BYTES", 1 << 62)
            want = Gatherer(x, None, window, 0, layout, *scale).features(starts)
            assert got.flags.c_contiguous and got.shape == want.shape
            np.testing.assert_array_equal(got, want)


def test_pool_reuses_only_arrays_nobody_references():
    pool = OutputPool(capacity=2)
    a = pool.take((4, 3), np.float32)
    a_id = id(a)
    del a
    assert id(pool.take((4, 3), np.float32)) == a_id  # free again: reused
    assert pool.take((4, 2), np.float32).shape == (4, 2)  # another shape: its own arrays
    holders = {
        "array": lambda arr: arr,
        "tensor": torch.from_numpy,
        "tensor view": lambda arr: torch.from_numpy(arr)[1:2],
        "tensor .numpy()": lambda arr: torch.from_numpy(arr).numpy(),
        "numpy view": lambda arr: arr[0],
        "storage": lambda arr: torch.from_numpy(arr).untyped_storage(),
    }
    for name, hold in holders.items():
        first = pool.take((4, 3), np.float32)
        held = hold(first)
        first_id = id(first)
        del first
        other = pool.take((4, 3), np.float32)
        assert id(other) != first_id, name
        del other
        del held
        assert id(pool.take((4, 3), np.float32)) == first_id, name  # released: reused


def test_pool_hands_out_fresh_arrays_when_all_are_held():
    pool = OutputPool(capacity=2)
    held = [pool.take((8,), np.float32) for _ in range(5)]
    assert len({id(a) for a in held}) == 5
    assert len(pool._arrays[((8,), np.dtype(np.float32).str)]) == 2  # only `capacity` are kept


def test_one_torch_thread_keeps_numpy(monkeypatch):
    x = np.arange(4 * 400, dtype=np.float32).reshape(4, 400)
    monkeypatch.setattr(batch_module, "_TORCH_MIN_BYTES", 0)
    monkeypatch.setattr(PathChoice, "torch_next", lambda self: True)
    for threads, by_torch in [(1, False), (2, True)]:
        monkeypatch.setattr(batch_module, "_threads", lambda threads=threads: threads)
        pool = OutputPool()
        out = Gatherer(x, None, 10, 0, "NCL").features(np.array([0, 5, 390]), pool)
        assert any(a is out for arrays in pool._arrays.values() for a in arrays) == by_torch
        np.testing.assert_array_equal(out[2, 3], x[3, 390:400])


def _drive(choice, seconds_of, batches):
    """Run ``choice`` for ``batches`` batches, each copy taking ``seconds_of(n, by_torch)``."""
    seen = []
    for n in range(batches):
        by_torch = choice.torch_next()
        seen.append(by_torch)
        choice.record(by_torch, seconds_of(n, by_torch))
    return seen


def test_path_choice_keeps_torch_where_it_is_faster():
    choice = PathChoice(warmup=3, probes=3, every=20)
    seen = _drive(choice, lambda n, by_torch: 1.0 if by_torch else 2.0 + (n == 1) * 50, 60)
    assert seen[:6] == [False] * 3 + [True] * 3  # numpy warm-up (an outlier does not count), torch probes
    assert all(seen[6:26])  # kept until the next round
    assert seen[26:29] == [False] * 3 and all(seen[29:52]) and not any(seen[52:55])  # every 20 batches after


def test_path_choice_leaves_a_slow_torch_and_when_it_slows_down():
    choice = PathChoice(warmup=3, probes=3, every=20)
    seen = _drive(choice, lambda n, by_torch: 20.0 if by_torch else 1.0, 290)
    assert seen[:6] == [False] * 3 + [True] * 3 and not any(seen[6:11])  # all 3 probes: 2 wake torch's threads
    # A first lost round is retried 20 // 8 batches after its end; each further loss doubles the wait
    # from 20 batches: 20, 40, then 80 after the round's end.
    assert [n for n, t in enumerate(seen) if t] == [3, 4, 5, 11, 12, 13, 37, 38, 39, 83, 84, 85, 169, 170, 171]
    assert choice.backoff == 8
    choice = PathChoice(warmup=3, probes=3, every=1000)
    seen = _drive(choice, lambda n, by_torch: (0.5 if n < 20 else 3.0) if by_torch else 1.0, 40)
    assert all(seen[3:20]) and not any(seen[25:])  # torch got slower than numpy: back to numpy


def test_path_choice_backs_off_while_torch_loses_and_comes_back_once_it_wins():
    # torch is slow for the first 600 batches (busy cores), then faster (the other jobs ended)
    choice = PathChoice(warmup=3, probes=3, every=20, max_backoff=4)
    seen = _drive(choice, lambda n, by_torch: (20.0 if n < 600 else 0.5) if by_torch else 1.0, 800)
    rounds = [n for n in range(1, 800) if seen[n] and not seen[n - 1]]  # each round's first probe
    gaps = [b - a for a, b in zip(rounds, rounds[1:])]
    # 3 probes + 2 (first loss: soon) + 3 warm-up, then 3 + 20 + 3, 3 + 40 + 3, 3 + 80 + 3 (capped at 4 x 20)
    assert gaps[:4] == [8, 26, 46, 86]
    assert {g for r, g in zip(rounds[1:], gaps[1:]) if r < 600} == {26, 46, 86}
    assert gaps[-1] == 26 and choice.use_torch and choice.backoff == 1  # won: kept, rounds every 20 again


def test_path_choice_does_not_time_copies_into_fresh_arrays_and_retries_soon_after_a_hand_back():
    # A copy into a newly allocated array pays its page faults: not a sample of the copy's speed.
    choice = PathChoice(warmup=3, probes=4, every=80)
    for n in range(7):
        by_torch = choice.torch_next()
        fresh = by_torch and n >= 5  # the last two probes find every pooled array held: new ones
        choice.record(by_torch, 50.0 if fresh else 0.5 if by_torch else 1.0, fresh=fresh)
    assert choice.use_torch  # the two fresh copies (50x numpy's) neither ended the round nor counted
    # Kept torch slows down for a burst: handed back, and tried again 80 // 8 batches later.
    seen = _drive(choice, lambda n, by_torch: (3.0 if n < 6 else 0.5) if by_torch else 1.0, 40)
    back = seen.index(False)
    assert 0 < back < 6 and not any(seen[back : back + 3]) and all(seen[back + 13 : back + 17])
    assert all(seen[back + 17 :])  # won that round: kept


def test_path_choice_is_not_put_off_by_torch_starting_its_threads_or_one_slow_copy():
    # Measured on 2 idle cores: the first torch copy of a round paid ~10 ms for starting torch's
    # threads (numpy's median 0.28 ms, torch's 0.17 ms), and once in a while a copy waits ~5 ms for
    # the builder thread. Neither may send the stream back to the slower numpy copy.
    def seconds_of(n, by_torch):
        if not by_torch:
            return 0.28
        return 10.0 if n == 16 else 5.0 if n % 100 == 50 else 0.17

    seen = _drive(PathChoice(warmup=16, probes=6, every=2048), seconds_of, 1000)
    assert seen[:16] == [False] * 16 and all(seen[16:])
    # A sustained slow-down still hands back (three capped copies in a row lift the mean past 1.25x).
    seen = _drive(
        PathChoice(warmup=16, probes=6, every=2048), lambda n, t: (0.17 if n < 200 else 1.0) if t else 0.28, 260
    )
    assert all(seen[16:200]) and not any(seen[210:])
