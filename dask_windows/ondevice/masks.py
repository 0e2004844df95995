"""Masks for masked-value pretraining, made by torch ops on the batch's device (docs/masks.md).

Every function takes a ``(B, C, L)`` batch ``x`` (only its shape and device are read), a share
``r`` in ``(0, 1)`` and an optional ``torch.Generator`` on ``x.device``, and returns a boolean tensor
shaped like ``x``, ``True`` where a value is hidden; bad arguments raise ``TypeError`` or ``ValueError``.

The trade-off of :func:`subsequence_mask`: runs are drawn as whole geometric lengths and placed by
one scatter and one cumulative sum, with no host synchronisation (CUDA-graph safe); the number of
runs is fixed in advance by a Chernoff bound, so a row's tail is left unmasked with probability
below ``2**-39``.
"""

from __future__ import annotations

import functools
import math
import numbers

import numpy as np
import torch

from dask_windows.ondevice._mask_checks import _check_mask_args

__all__ = ["future_mask", "random_mask", "subsequence_mask", "variable_mask"]


def random_mask(x: torch.Tensor, r: float = 0.15, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """Hides each value independently with probability ``r`` (rounded to a multiple of ``2**-16``, or of
    ``2**-32`` when ``r`` or ``1 - r`` is below ``2**-8``)."""
    x, r = _check_mask_args(x, r, generator, "random_mask")
    return _coin_flips(x.shape, r, x.device, generator)


def _coin_flips(
    shape: torch.Size | tuple[int, ...], r: float, device: torch.device, generator: torch.Generator | None
) -> torch.Tensor:
    numel = math.prod(shape)
    # 16-bit draws resolve r to 2**-16; keep the relative error of r and 1-r under 2**-8.
    bits = 16 if min(r, 1.0 - r) >= 2.0**-8 else 32
    words = _random_words((-(-numel * bits // 64),), device, generator)
    draws = words.view(torch.int16 if bits == 16 else torch.int32)[:numel]
    return (draws < _threshold(r, bits)).view(shape)


def subsequence_mask(
    x: torch.Tensor,
    r: float = 0.15,
    lm: float = 3,
    stateful: bool = True,
    sync: bool = False,
    *,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Hides alternating runs of values along time (Zerveas et al., KDD 2021).

    ``stateful=True``: each row is a stationary two-state Markov chain along time, geometric runs of
    mean ``lm`` (masked) and ``lm * (1 - r) / r`` (unmasked); runs never flow from one row into the
    next. ``stateful=False``: every value hidden independently (``lm`` ignored). ``sync=True``: all
    variables of a sample share one mask.

    Raises:
        TypeError: Also when ``lm`` is not a number.
        ValueError: Also when ``lm`` is below 1 or, with ``stateful=True``,
            the mean unmasked run ``lm * (1 - r) / r`` would be below 1.
    """
    x, r = _check_mask_args(x, r, generator, "subsequence_mask")
    if isinstance(lm, bool) or not isinstance(lm, numbers.Real):
        raise TypeError(f"subsequence_mask: lm={lm!r} must be a real number >= 1, the mean masked run length")
    lm = float(lm)
    if not 1.0 <= lm < math.inf:
        raise ValueError(
            f"subsequence_mask: lm={lm!r} is below 1 or not finite; lm is the mean length of a "
            "masked run and a run holds at least one value, so pass a finite lm >= 1 (e.g. lm=3)"
        )
    if stateful and lm * (1.0 - r) / r < 1.0:
        raise ValueError(
            f"subsequence_mask: with r={r!r} and lm={lm!r} the mean unmasked run "
            f"lm*(1-r)/r = {lm * (1.0 - r) / r:.3g} is below 1, which no run can be; "
            f"raise lm to at least r/(1-r) = {r / (1.0 - r):.3g} or lower r"
        )
    batch, variables, length = x.shape
    rows = batch if sync else batch * variables
    if not stateful:
        mask = _coin_flips((rows, length), r, x.device, generator)
    elif rows == 0 or length == 0:
        mask = torch.zeros(rows, length, dtype=torch.bool, device=x.device)
    else:
        mask = _markov_runs(rows, length, r, lm, x.device, generator)
    if sync:
        return mask.view(batch, 1, length).expand(batch, variables, length).contiguous()
    return mask.view(batch, variables, length)


def _markov_runs(
    rows: int, length: int, r: float, lm: float, device: torch.device, generator: torch.Generator | None
) -> torch.Tensor:
    """Returns a ``(rows, length)`` boolean mask of stationary alternating runs."""
    end_unmasked = r / (lm * (1.0 - r))  # chance that an unmasked run ends after a step
    end_masked = 1.0 / lm  # chance that a masked run ends after a step
    pairs, spare_rows, spare_pairs = _run_plan(rows, length, end_unmasked, end_masked)
    # Flips of the state at each (row, position), flattened with one extra slot per row: run ends
    # past the row's window are clamped onto it, so no end lands in the next row.
    flips = torch.zeros(rows * (length + 1), dtype=torch.uint8, device=device)
    dtype = _position_dtype(flips.numel())
    row_starts = torch.arange(0, rows * (length + 1), length + 1, device=device, dtype=dtype)
    draws = _random_words((rows, 1 + pairs), device, generator).view(torch.int32)  # axes: row, draw
    starts_masked = draws[:, 0] < _threshold(r, 32)  # draws[:, 1] is left unused
    runs = _geometric_runs(draws[:, 2:], end_unmasked, end_masked, dtype)  # axes: row, kind, pair
    first = runs[:, 0, 0]
    first.mul_(starts_masked.logical_not())  # a row that starts masked has no leading unmasked run
    first.add_(row_starts)  # the running sums below then give flat positions in `flips`
    reach = _run_ends_(runs) - row_starts  # axes: row; how far the row's runs go
    torch.minimum(runs, (row_starts + length)[:, None, None], out=runs)  # infinite runs too
    flips.index_fill_(0, runs.view(-1).to(torch.int64), 1)
    if spare_rows and device.type == "cpu":
        # The host may wait for the CPU: serve exactly the short rows (about one call in ten has any).
        spare_rows = int((reach < length).sum())
    if spare_rows:
        spares = (spare_rows, spare_pairs)
        _extend_short_rows(flips, reach, row_starts, length, spares, end_unmasked, end_masked, generator)
    # An odd number of flips so far means a masked position; the extra slot of each row is not read.
    parity = torch.cumsum(flips.view(rows, length + 1)[:, :length], 1, dtype=torch.uint8).bitwise_and_(1)
    return parity.view(torch.bool)


def _extend_short_rows(
    flips: torch.Tensor,
    reach: torch.Tensor,
    row_starts: torch.Tensor,
    length: int,
    spares: tuple[int, int],
    end_unmasked: float,
    end_masked: float,
    generator: torch.Generator | None,
) -> None:
    """Continues, in ``flips`` (rows of ``length + 1`` slots), the first ``spare_rows`` rows whose runs
    stop at ``reach < length`` with ``spare_pairs`` more run pairs (found by a search in the running
    count of short rows, so nothing waits for the device)."""
    spare_rows, spare_pairs = spares
    rows = reach.numel()
    device = reach.device
    short_so_far = (reach < length).cumsum(0)  # axes: row
    # Slot s serves the first row where the count reaches s + 1; `rows` means no such row.
    slot_rows = torch.searchsorted(short_so_far, torch.arange(1, spare_rows + 1, device=device))
    idle = slot_rows >= rows
    slot_rows.clamp_max_(rows - 1)
    dtype = _position_dtype(flips.numel())
    reach, row_starts = reach.to(dtype), row_starts.to(dtype)
    draws = _random_words((spare_rows, spare_pairs), device, generator).view(torch.int32)
    runs = _geometric_runs(draws, end_unmasked, end_masked, dtype)  # axes: slot, kind, pair
    slot_starts = row_starts[slot_rows]
    # An idle slot starts past its row's window: all its ends land on the row's extra slot.
    runs[:, 0, 0].add_(torch.where(idle, length, reach[slot_rows]).add_(slot_starts))
    _run_ends_(runs)
    torch.minimum(runs, (slot_starts + length)[:, None, None], out=runs)  # ends past the row: its extra slot
    flips.index_fill_(0, runs.view(-1).to(torch.int64), 1)


def _run_ends_(runs: torch.Tensor) -> torch.Tensor:
    """Turns ``(n, 2, pairs)`` run lengths (axes: row, (unmasked, masked), pair) into run ends, in
    place; returns the end of each row's last run."""
    unmasked, masked = runs[:, 0], runs[:, 1]
    masked.add_(unmasked).cumsum_(1)
    unmasked[:, 1:].add_(masked[:, :-1])
    return masked[:, -1].clone()


def _random_words(shape: tuple[int, ...], device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
    """Uniform int64 words; on the CPU one draw of the torch generator seeds numpy's (faster) PCG64."""
    if device.type != "cpu" or math.prod(shape) == 0:
        return torch.empty(shape, dtype=torch.int64, device=device).random_(-(2**63), None, generator=generator)
    seed = int(torch.empty((), dtype=torch.int64).random_(-(2**63), None, generator=generator).item())
    words = np.random.PCG64(seed & 0xFFFF_FFFF_FFFF_FFFF).random_raw(math.prod(shape))
    return torch.from_numpy(words.view(np.int64)).view(shape)


def _threshold(r: float, bits: int) -> int:
    """A signed ``bits``-bit uniform draw is below this with probability ``r``."""
    return min(round(r * 2.0**bits), 2**bits - 1) - 2 ** (bits - 1)


def _position_dtype(slots: int) -> torch.dtype:
    """float32 counts positions exactly below 2**24 and is faster than int64; float64 beyond."""
    return torch.float32 if slots < 2**24 else torch.float64


def _geometric_runs(draws: torch.Tensor, end_unmasked: float, end_masked: float, dtype: torch.dtype) -> torch.Tensor:
    """Turns ``(n, 2 * pairs)`` uniform int32 draws into ``(n, 2, pairs)`` geometric run lengths on
    ``{1, 2, ...}`` (axes: row, (unmasked, masked), pair); one in about ``2**32`` is infinite, which
    the caller's clamp to the window handles."""
    # u = draw / 2**32 + 1/2 is uniform on [0, 1); 1 + floor(log(u) / log(1 - end)) is geometric.
    logs = draws.to(dtype).mul_(2.0**-32).add_(0.5).log_().view(draws.shape[0], 2, -1)
    for kind, end in enumerate((end_unmasked, end_masked)):
        if end >= 1.0:  # every run lasts one step (and log(0) * 0 would be nan)
            logs[:, kind].fill_(0.0)
        else:
            logs[:, kind].mul_(1.0 / math.log1p(-end))
    return logs.floor_().add_(1.0)


# Stage one draws enough runs for all but about this share of rows ...
_FIRST_SHORTFALL = 2.0**-10
# ... and either stage may fail (a row's tail stays unmasked) with at most this chance per row.
_SHORTFALL = 2.0**-40


@functools.lru_cache(maxsize=256)
def _run_plan(rows: int, length: int, end_unmasked: float, end_masked: float) -> tuple[int, int, int]:
    """``(pairs, spare_rows, spare_pairs)``: run pairs every row draws, and slots of more pairs for the
    rows that fall short (none where they would cost more than drawing enough for every row)."""
    full = _pairs_needed(length, end_unmasked, end_masked, _SHORTFALL)
    first = _pairs_needed(length, end_unmasked, end_masked, _FIRST_SHORTFALL)
    spare_rows = _spare_rows(rows, _FIRST_SHORTFALL, _SHORTFALL)
    if first == full or rows * first + spare_rows * full >= rows * full:
        return full, 0, 0
    return first, spare_rows, full


def _spare_rows(rows: int, short_chance: float, target: float) -> int:
    """Smallest ``k`` with ``P(Binomial(rows, short_chance) > k) <= target`` (Chernoff)."""
    for k in range(rows):
        share = (k + 1) / rows
        if share <= short_chance:
            continue
        divergence = share * math.log(share / short_chance)
        if share < 1.0:
            divergence += (1.0 - share) * math.log((1.0 - share) / (1.0 - short_chance))
        if rows * divergence >= -math.log(target):
            return k
    return rows


@functools.lru_cache(maxsize=256)
def _pairs_needed(length: int, end_unmasked: float, end_masked: float, shortfall: float) -> int:
    """Fewest (unmasked, masked) run pairs covering ``length`` but with probability at most ``shortfall``.

    ``n`` pairs cover at least ``S = U_1 + ... + U_{n-1} + M_0 + ... + M_{n-1}`` positions; the
    Chernoff bound ``P(S < length) <= exp(t (length - 1)) E[exp(-t S)]``, minimised over ``t > 0``,
    must not exceed ``shortfall``. ``(length + 2) // 2`` pairs always reach the end.
    """
    always_enough = (length + 2) // 2
    target = math.log(shortfall)

    def log_mgf(t: float, end: float) -> float:  # log E[exp(-t X)], X geometric with success `end`
        if end >= 1.0:
            return -t
        return math.log(end) - t - math.log(-math.expm1(math.log1p(-end) - t))

    def log_bound(n: int) -> float:
        def at(t: float) -> float:
            return t * (length - 1) + (n - 1) * log_mgf(t, end_unmasked) + n * log_mgf(t, end_masked)

        low, high = 0.0, 64.0  # the exponent is convex in t: ternary search
        for _ in range(100):
            a, b = low + (high - low) / 3, high - (high - low) / 3
            if at(a) <= at(b):
                high = b
            else:
                low = a
        return min(0.0, at((low + high) / 2))

    low, high = 1, always_enough
    while low < high:
        middle = (low + high) // 2
        if log_bound(middle) <= target:
            high = middle
        else:
            low = middle + 1
    return low


def variable_mask(x: torch.Tensor, r: float = 0.15, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """Hides whole variables: each (sample, variable) pair with probability ``r`` (a sample may have all
    or none hidden)."""
    x, r = _check_mask_args(x, r, generator, "variable_mask")
    batch, variables, length = x.shape
    hidden = torch.rand(batch, variables, 1, device=x.device, generator=generator) < r
    return hidden.expand(batch, variables, length).contiguous()


def future_mask(
    x: torch.Tensor, r: float = 0.15, sync: bool = False, *, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Hides the end of each row: the last ``k`` steps, ``k ~ Binomial(L, r)``; ``sync=True``: all variables
    of a sample hide the same steps."""
    x, r = _check_mask_args(x, r, generator, "future_mask")
    batch, variables, length = x.shape
    rows = batch if sync else batch * variables
    trials = torch.full((rows, 1), float(length), device=x.device)
    hidden_steps = torch.binomial(trials, torch.full_like(trials, r), generator=generator)
    steps = torch.arange(length, device=x.device, dtype=trials.dtype)
    mask = steps >= (length - hidden_steps)  # axes: row, time
    if sync:
        return mask.view(batch, 1, length).expand(batch, variables, length).contiguous()
    return mask.view(batch, variables, length)
