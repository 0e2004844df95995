"""The interleave of a mixture's epoch, as pure integer arithmetic.

An epoch of ``N`` windows, ``counts[m]`` of member ``m``, is ordered by Webster's (Sainte-Laguë)
apportionment: window ``k`` of member ``m`` has key ``(2k + 1) / (2 counts[m])``, windows listed by key
(ties: lower member first), so any batch holds ``B * counts[m] / N`` windows of member ``m`` give or take
two. Positions are a closed form, exact in integers: nothing is materialised, every reader agrees.
"""

from __future__ import annotations

import numpy as np

__all__ = ["labels", "member_counts", "positions", "prefix_counts"]

_INT64_SAFE = 2**30  # counts below this keep (2k + 1) * n inside int64


def member_counts(weights: np.ndarray, windows_per_epoch: int) -> np.ndarray:
    """``(M,)`` windows of each member in an epoch, summing to ``windows_per_epoch`` exactly: largest
    remainders (Hamilton), the windows left one each to the largest fractional parts (ties: lower member)."""
    w = np.asarray(weights, dtype=np.float64)
    share = w / w.sum() * windows_per_epoch  # (M,) exact shares
    counts = np.floor(share).astype(np.int64)
    left = int(windows_per_epoch - counts.sum())
    if left > 0:
        order = np.lexsort((np.arange(len(w)), -(share - counts)))  # largest remainder first, lower member on ties
        counts[order[:left]] += 1
    return counts


def _ints(counts: np.ndarray) -> np.ndarray:
    n = np.asarray(counts, dtype=np.int64)
    return n if n.max(initial=0) < _INT64_SAFE else n.astype(object)


def positions(counts: np.ndarray, member: np.ndarray, k: np.ndarray) -> np.ndarray:
    """``(E,)`` int64 epoch positions of windows ``k`` (``0 <= k < counts[member]``) of members ``member``."""
    n = _ints(counts)
    member = np.asarray(member, dtype=np.int64)
    key = (2 * np.asarray(k, dtype=np.int64).astype(n.dtype) + 1)[:, None]  # (E, 1)
    x = key * n[None, :]  # (E, M): the window's key scaled by each other member's 2 n'
    own = np.maximum(n[member], 1)[:, None]  # (E, 1); a member of no windows is never asked for
    # Windows k' of member m' with key (2k'+1)/n' below / at most the window's (2k+1)/n.
    below = np.clip(-((own - x) // (2 * own)), 0, n[None, :])
    at_most = np.clip((x - own) // (2 * own) + 1, 0, n[None, :])
    earlier = np.arange(len(n))[None, :] < member[:, None]  # ties go to the lower member
    pos = below.sum(axis=1) + np.where(earlier, at_most - below, 0).sum(axis=1)
    return np.asarray(pos, dtype=np.int64)


def prefix_counts(counts: np.ndarray, i: int) -> np.ndarray:
    """``(M,)`` windows of each member among the first ``i`` positions of the epoch."""
    n = np.asarray(counts, dtype=np.int64)
    members = np.arange(len(n))
    lo, hi = np.zeros(len(n), np.int64), n.copy()  # answer in [lo, hi]
    while (lo < hi).any():  # largest c with positions(m, c - 1) < i, per member
        mid = (lo + hi + 1) // 2
        ok = positions(n, members, np.maximum(mid - 1, 0)) < i
        ok |= mid == 0
        lo = np.where((lo < hi) & ok, mid, lo)
        hi = np.where((lo < hi) & ~ok, mid - 1, hi)
    return lo


def labels(counts: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """``(member, k)``, ``(hi - lo,)`` int64 each: members of epoch positions ``[lo, hi)`` and numbers inside."""
    a, b = prefix_counts(counts, lo), prefix_counts(counts, hi)
    member = np.repeat(np.arange(len(a)), b - a)
    k = np.concatenate([np.arange(x, y) for x, y in zip(a, b)]) if len(a) else np.zeros(0, np.int64)
    order = np.argsort(positions(counts, member, k), kind="stable")
    return member[order], k[order].astype(np.int64)
