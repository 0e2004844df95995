"""Statistical and contract tests of dask_windows.ondevice.masks.

Tolerances are derived from each estimator's standard error and set at about
six of them, so a correct implementation fails with negligible probability
while the deviations that matter (tsai's start probability 1/lm, runs that
flow between rows, wrong run means) are many standard errors wide.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dask_windows.ondevice import masks
from dask_windows.ondevice.masks import future_mask, random_mask, subsequence_mask, variable_mask

ALL_MASKS = [random_mask, subsequence_mask, variable_mask, future_mask]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _batch(shape: tuple[int, int, int], dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


def _seeded(seed: int, device: str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _chain_stationary_se(r: float, lm: float, positions: int) -> float:
    """Standard error of the masked share over ``positions`` of independent-row chains."""
    second_eigenvalue = 1.0 - 1.0 / lm - r / (lm * (1.0 - r))
    inflation = (1.0 + second_eigenvalue) / (1.0 - second_eigenvalue)
    return math.sqrt(r * (1.0 - r) * inflation / positions)


def _chi2_critical(df: int, z: float = 4.265) -> float:
    """Upper quantile of chi-square with ``df`` degrees of freedom (Wilson-Hilferty; z=4.265: 1e-5)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def _run_lengths_from_observed_starts(rows: np.ndarray, state: bool, cap: int) -> np.ndarray:
    """Lengths, capped at ``cap``, of the ``state`` runs that start at 1 <= t <= L - cap.

    Whether a run starts at t depends only on the past, so these lengths are
    unbiased draws of the run length distribution (no edge censoring: a run
    starting there is seen for at least ``cap`` steps).
    """
    m = rows == state  # axes: row, time
    length = m.shape[1]
    t = np.arange(length)
    # next_other[i, t]: first position >= t where the state differs (length if none)
    other_at = np.where(~m, t, length)
    next_other = np.minimum.accumulate(other_at[:, ::-1], axis=1)[:, ::-1]
    starts = m[:, 1:] & ~m[:, :-1]  # a run of `state` starts at t + 1
    starts[:, length - cap :] = False
    row, start = np.nonzero(starts)
    start = start + 1
    return np.minimum(next_other[row, start] - start, cap)


# --------------------------------------------------------------------------- subsequence_mask, stateful


@pytest.mark.parametrize("r, lm", [(0.15, 3), (0.3, 5), (0.05, 2), (0.5, 2), (0.15, 10)])
def test_masked_share_is_r_overall_and_at_every_position(r: float, lm: float) -> None:
    m = subsequence_mask(_batch((512, 4, 256)), r=r, lm=lm, generator=_seeded(1)).numpy()
    se = _chain_stationary_se(r, lm, m.size)
    assert abs(m.mean() - r) < 6 * se
    # first, middle and last step: 2048 independent rows each (tsai starts masked with 1/lm)
    per_step_se = math.sqrt(r * (1 - r) / (m.shape[0] * m.shape[1]))
    for step in (0, 1, m.shape[2] // 2, m.shape[2] - 1):
        assert abs(m[:, :, step].mean() - r) < 6 * per_step_se, step


@pytest.mark.parametrize("r, lm", [(0.15, 3), (0.3, 5), (0.1, 1.5)])
def test_mean_run_lengths_are_lm_and_lm_times_odds(r: float, lm: float) -> None:
    m = subsequence_mask(_batch((512, 4, 256)), r=r, lm=lm, generator=_seeded(2)).numpy()
    now, after = m[..., :-1], m[..., 1:]
    # Transition estimates use every step, edge runs included: the chain is
    # memoryless, so the hazard of a run ending is the same at every step.
    end_masked = (now & ~after).sum() / now.sum()
    end_unmasked = (~now & after).sum() / (~now).sum()
    expected_masked, expected_unmasked = 1 / lm, r / (lm * (1 - r))
    assert abs(end_masked - expected_masked) < 6 * math.sqrt(expected_masked * (1 - expected_masked) / now.sum())
    assert abs(end_unmasked - expected_unmasked) < 6 * math.sqrt(
        expected_unmasked * (1 - expected_unmasked) / (~now).sum()
    )
    assert 1 / end_masked == pytest.approx(lm, rel=0.03)
    assert 1 / end_unmasked == pytest.approx(lm * (1 - r) / r, rel=0.03)


@pytest.mark.parametrize("state, mean_length, cap", [(True, 3.0, 16), (False, 17.0, 64)])
def test_run_lengths_are_geometric(state: bool, mean_length: float, cap: int) -> None:
    m = subsequence_mask(_batch((512, 4, 256)), r=0.15, lm=3, generator=_seeded(3)).numpy().reshape(-1, 256)
    lengths = _run_lengths_from_observed_starts(m, state, cap)
    end = 1.0 / mean_length
    k = np.arange(1, cap)
    expected = np.append(end * (1 - end) ** (k - 1), (1 - end) ** (cap - 1)) * lengths.size  # 1..cap-1, >= cap
    observed = np.bincount(lengths, minlength=cap + 1)[1:]
    assert expected.min() >= 5
    chi2 = ((observed - expected) ** 2 / expected).sum()
    assert chi2 < _chi2_critical(df=cap - 1)
    # a fixed-length run (no randomness) would fail the same statistic by far
    assert abs(lengths[lengths < cap].mean() - np.average(k, weights=expected[:-1])) < 0.05 * mean_length


def test_rows_are_independent_unlike_one_chain_over_the_batch() -> None:
    r = 0.15
    m = subsequence_mask(_batch((2048, 4, 64)), r=r, lm=3, generator=_seeded(4)).reshape(-1, 64).numpy()
    # end of one row against the start of the next, as tsai's flattened chain would link them
    both = (m[:-1, -1] & m[1:, 0]).mean()
    assert abs(both - r * r) < 6 * math.sqrt(r * r * (1 - r * r) / (m.shape[0] - 1))


def test_every_call_starts_masked_with_probability_r() -> None:
    r, calls = 0.15, 3000
    generator = _seeded(14)
    first = [subsequence_mask(_batch((1, 1, 4)), r=r, lm=3, generator=generator)[0, 0, 0].item() for _ in range(calls)]
    assert abs(np.mean(first) - r) < 6 * math.sqrt(r * (1 - r) / calls)  # tsai: 1/lm = 0.33


def test_sync_gives_every_variable_of_a_sample_the_same_mask() -> None:
    m = subsequence_mask(_batch((64, 5, 128)), sync=True, generator=_seeded(5))
    assert torch.equal(m, m[:, :1].expand_as(m))
    assert m.is_contiguous()
    assert not torch.equal(m[0], m[1])


def test_without_sync_variables_are_independent() -> None:
    r = 0.15
    m = subsequence_mask(_batch((1024, 2, 256)), r=r, generator=_seeded(6)).numpy()
    both = (m[:, 0] & m[:, 1]).mean()
    se = math.sqrt(r * r * (1 - r * r) / m[:, 0].size) * 2.5  # runs correlate steps within a row
    assert abs(both - r * r) < 6 * se


@pytest.mark.parametrize("first_pairs, spare_share", [(2, 1.0), (17, 0.25)])
def test_extension_of_short_rows_keeps_the_chain_exact(
    monkeypatch: pytest.MonkeyPatch, first_pairs: int, spare_share: float
) -> None:
    """Force the two-stage path: with 2 pairs first every row falls short; with 17, 15% of rows,
    which must find their slots among a quarter of the rows."""
    r, lm, length = 0.15, 3.0, 256
    end_unmasked, end_masked = r / (lm * (1 - r)), 1 / lm
    full = masks._pairs_needed(length, end_unmasked, end_masked, masks._SHORTFALL)
    monkeypatch.setattr(masks, "_run_plan", lambda rows, *args: (first_pairs, int(rows * spare_share), full))
    m = subsequence_mask(_batch((512, 4, length)), r=r, lm=lm, generator=_seeded(7)).numpy()
    assert abs(m.mean() - r) < 6 * _chain_stationary_se(r, lm, m.size)
    assert abs(m[..., -1].mean() - r) < 6 * math.sqrt(r * (1 - r) / m[..., -1].size)
    now, after = m[..., :-1], m[..., 1:]
    assert 1 / ((now & ~after).sum() / now.sum()) == pytest.approx(lm, rel=0.03)
    assert 1 / ((~now & after).sum() / (~now).sum()) == pytest.approx(lm * (1 - r) / r, rel=0.03)


@pytest.mark.parametrize("spare_rows", [1, 2, 3])
def test_spare_slots_go_to_the_short_rows_in_order(spare_rows: int) -> None:
    rows, length = 5, 50
    reach = torch.tensor([50, 10, 50, 20, 50])
    flips = torch.zeros(rows * (length + 1), dtype=torch.uint8)  # one extra slot per row for ends past it
    row_starts = torch.arange(0, rows * (length + 1), length + 1)
    masks._extend_short_rows(flips, reach, row_starts, length, (spare_rows, 40), 0.3, 0.5, _seeded(0))
    inside = flips.view(rows, length + 1)[:, :length]  # axes: row, position
    extended = [row for row in range(rows) if inside[row].any()]
    assert extended == [1, 3][:spare_rows]
    for row in extended:
        assert not inside[row, : reach[row] + 1].any()  # continues after the row's last run end


def test_too_few_spare_rows_leaves_tails_unmasked_without_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(masks, "_run_plan", lambda rows, *args: (1, 1, 200))
    m = subsequence_mask(_batch((8, 2, 300)), r=0.15, lm=3, generator=_seeded(8))
    assert m.shape == (8, 2, 300) and m.dtype == torch.bool


def _exact_shortfall(length: int, end_unmasked: float, end_masked: float, pairs: int) -> float:
    """P(U_1 + .. + U_{n-1} + M_0 + .. + M_{n-1} < length) by convolution."""
    k = np.arange(length + 1)

    def pmf(end: float) -> np.ndarray:
        p = np.zeros(length + 1)
        p[1:] = end * (1 - end) ** (k[1:] - 1)
        return p

    covered = np.zeros(length + 1)
    covered[0] = 1.0
    for _ in range(pairs):
        covered = np.convolve(covered, pmf(end_masked))[: length + 1]
    for _ in range(pairs - 1):
        covered = np.convolve(covered, pmf(end_unmasked))[: length + 1]
    return float(covered[:length].sum())


@pytest.mark.parametrize("length, r, lm", [(512, 0.15, 3), (100, 0.3, 2), (64, 0.5, 1)])
def test_number_of_runs_drawn_meets_the_shortfall_bound(length: int, r: float, lm: float) -> None:
    end_unmasked, end_masked = r / (lm * (1 - r)), 1 / lm
    for shortfall in (masks._FIRST_SHORTFALL, masks._SHORTFALL):
        pairs = masks._pairs_needed(length, end_unmasked, end_masked, shortfall)
        assert pairs <= (length + 2) // 2
        assert _exact_shortfall(length, end_unmasked, end_masked, pairs) <= shortfall
        if pairs > 1:  # and not grossly more than needed
            assert _exact_shortfall(length, end_unmasked, end_masked, max(1, pairs - 4)) > shortfall


def test_spare_rows_bound() -> None:
    assert masks._spare_rows(1024, 2**-10, 2**-40) < 30
    k = masks._spare_rows(1024, 2**-10, 2**-40)
    q = 2**-10
    tail = sum(math.comb(1024, j) * q**j * (1 - q) ** (1024 - j) for j in range(k + 1, 60))
    assert tail <= 2**-40


def test_lm_one_and_r_half_alternates_every_step() -> None:
    m = subsequence_mask(_batch((16, 3, 50)), r=0.5, lm=1, generator=_seeded(9))
    assert torch.all(m[..., 1:] != m[..., :-1])


# --------------------------------------------------------------------------- the other masks


@pytest.mark.parametrize("r", [0.15, 0.5, 0.9, 0.001])
def test_random_mask_share_and_independence(r: float) -> None:
    m = random_mask(_batch((256, 4, 512)), r=r, generator=_seeded(10)).numpy()
    assert abs(m.mean() - r) < 6 * math.sqrt(r * (1 - r) / m.size)
    both = (m[..., 1:] & m[..., :-1]).mean()
    assert abs(both - r * r) < 6 * math.sqrt(r * r * (1 - r * r) / m[..., 1:].size) * 1.5


def test_subsequence_mask_stateless_is_independent_values() -> None:
    r = 0.2
    m = subsequence_mask(_batch((256, 4, 256)), r=r, lm=50, stateful=False, generator=_seeded(11)).numpy()
    assert abs(m.mean() - r) < 6 * math.sqrt(r * (1 - r) / m.size)
    assert abs((m[..., 1:] & m[..., :-1]).mean() - r * r) < 0.005


def test_variable_mask_hides_whole_variables_with_probability_r() -> None:
    r = 0.25
    m = variable_mask(_batch((4096, 4, 32)), r=r, generator=_seeded(12))
    assert torch.equal(m, m[..., :1].expand_as(m))
    hidden = m[..., 0].numpy()
    assert abs(hidden.mean() - r) < 6 * math.sqrt(r * (1 - r) / hidden.size)


@pytest.mark.parametrize("sync", [False, True])
def test_future_mask_hides_a_suffix_of_binomial_length(sync: bool) -> None:
    r, length = 0.2, 100
    m = future_mask(_batch((1024, 3, length)), r=r, sync=sync, generator=_seeded(13))
    assert torch.all(m[..., 1:] >= m[..., :-1])  # once hidden, hidden to the end
    hidden_steps = m.sum(-1).double()
    assert abs(hidden_steps.mean().item() - r * length) < 6 * math.sqrt(r * (1 - r) * length / hidden_steps.numel())
    assert hidden_steps.var().item() == pytest.approx(r * (1 - r) * length, rel=0.2)
    assert torch.equal(m, m[:, :1].expand_as(m)) == sync


# --------------------------------------------------------------------------- contract: shape, device, dtype, seeds


@pytest.mark.parametrize("make", ALL_MASKS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64])
def test_mask_is_bool_shaped_like_the_batch(make, dtype: torch.dtype) -> None:
    x = _batch((3, 2, 17), dtype=dtype)
    m = make(x)
    assert m.dtype == torch.bool and m.shape == x.shape and m.device == x.device and m.is_contiguous()


@pytest.mark.parametrize("make", ALL_MASKS)
def test_same_generator_seed_gives_the_same_mask(make) -> None:
    x = _batch((8, 3, 200))
    first, again, other = (make(x, generator=_seeded(seed)) for seed in (42, 42, 43))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


@pytest.mark.parametrize("make", ALL_MASKS)
@pytest.mark.parametrize("shape", [(0, 4, 16), (2, 0, 16), (2, 3, 0), (1, 1, 1), (2, 1, 2)])
def test_degenerate_shapes(make, shape: tuple[int, int, int]) -> None:
    assert make(_batch(shape)).shape == shape


@pytest.mark.parametrize("make", ALL_MASKS)
def test_works_under_no_grad_and_on_tensors_that_require_grad(make) -> None:
    x = torch.zeros(4, 2, 32, requires_grad=True)
    with torch.no_grad():
        assert make(x).shape == x.shape
    assert not make(x).requires_grad


@pytest.mark.parametrize("make", ALL_MASKS)
@pytest.mark.parametrize("r", [0.0, 1.0, -0.1, 1.5, float("nan")])
def test_r_outside_the_open_unit_interval_is_refused(make, r: float) -> None:
    with pytest.raises(ValueError, match=r"r=.* outside \(0, 1\)"):
        make(_batch((2, 2, 8)), r=r)


@pytest.mark.parametrize("make", ALL_MASKS)
@pytest.mark.parametrize("r", [True, "0.1", None])
def test_r_of_the_wrong_type_is_refused(make, r: object) -> None:
    with pytest.raises(TypeError, match="r="):
        make(_batch((2, 2, 8)), r=r)


@pytest.mark.parametrize("make", ALL_MASKS)
def test_batch_must_be_a_3d_tensor(make) -> None:
    with pytest.raises(TypeError, match="torch.Tensor"):
        make(np.zeros((2, 2, 8)))
    with pytest.raises(ValueError, match="must have 3 dims"):
        make(torch.zeros(2, 8))


@pytest.mark.parametrize("make", ALL_MASKS)
def test_generator_must_be_a_generator(make) -> None:
    with pytest.raises(TypeError, match="torch.Generator"):
        make(_batch((2, 2, 8)), generator=0)


def test_lm_is_validated() -> None:
    x = _batch((2, 2, 8))
    for lm in (0.5, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=f"lm={lm!r} is below 1 or not finite"):
            subsequence_mask(x, lm=lm)
    with pytest.raises(ValueError, match=r"mean unmasked run .* below 1"):
        subsequence_mask(x, r=0.8, lm=2)
    with pytest.raises(TypeError, match="lm="):
        subsequence_mask(x, lm="3")
    assert subsequence_mask(x, r=0.8, lm=2, stateful=False).shape == x.shape


@CUDA
@pytest.mark.parametrize("make", ALL_MASKS)
def test_on_cuda_the_mask_stays_on_the_device_without_host_sync(make) -> None:
    x = _batch((64, 4, 512), device="cuda")
    make(x, generator=_seeded(0, "cuda"))  # warm up: lazy init may synchronise
    generator = _seeded(0, "cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        m = make(x, generator=generator)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert m.is_cuda and m.dtype == torch.bool and m.shape == x.shape
    assert torch.equal(m, make(x, generator=_seeded(0, "cuda")))


@CUDA
def test_cuda_subsequence_mask_statistics() -> None:
    m = subsequence_mask(_batch((512, 4, 256), device="cuda"), r=0.15, lm=3).cpu().numpy()
    assert abs(m.mean() - 0.15) < 6 * _chain_stationary_se(0.15, 3, m.size)
    assert abs(m[..., 0].mean() - 0.15) < 6 * math.sqrt(0.15 * 0.85 / m[..., 0].size)


@CUDA
def test_cuda_generator_on_the_cpu_is_refused() -> None:
    with pytest.raises(ValueError, match="generator lives on cpu"):
        random_mask(_batch((2, 2, 8), device="cuda"), generator=_seeded(0))


@CUDA
def test_subsequence_mask_can_be_captured_in_a_cuda_graph() -> None:
    x = _batch((32, 4, 128), device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        subsequence_mask(x)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = subsequence_mask(x)
    graph.replay()
    first = captured.clone()
    graph.replay()
    torch.cuda.synchronize()
    assert captured.shape == x.shape and not torch.equal(first, captured)


def test_positions_in_float64_past_float32_exactness(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of 2**24 slots or more count positions in float64: same statistics."""
    assert masks._position_dtype(2**24 - 1) == torch.float32 and masks._position_dtype(2**24) == torch.float64
    monkeypatch.setattr(masks, "_position_dtype", lambda slots: torch.float64)
    r, lm = 0.15, 3.0
    m = subsequence_mask(_batch((512, 4, 256)), r=r, lm=lm, generator=_seeded(21)).numpy()
    assert abs(m.mean() - r) < 6 * _chain_stationary_se(r, lm, m.size)
    now, after = m[..., :-1], m[..., 1:]
    assert 1 / ((now & ~after).sum() / now.sum()) == pytest.approx(lm, rel=0.03)
    assert 1 / ((~now & after).sum() / (~now).sum()) == pytest.approx(lm * (1 - r) / r, rel=0.03)


def test_cpu_random_words_follow_and_advance_the_generator() -> None:
    generator = _seeded(5)
    first, second = (masks._random_words((64, 3), torch.device("cpu"), generator) for _ in range(2))
    assert not torch.equal(first, second)  # the generator advanced
    again = masks._random_words((64, 3), torch.device("cpu"), _seeded(5))
    assert torch.equal(first, again) and first.dtype == torch.int64 and first.shape == (64, 3)
    bits = first.view(-1).numpy().view(np.uint64)
    assert 0.4 < np.unpackbits(bits.view(np.uint8)).mean() < 0.6
