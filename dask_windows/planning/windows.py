"""Where a partition's windows start, computed from its series runs alone.

A *run* is a maximal stretch of one series' rows inside a partition. A run of
``n`` rows holds ``max(0, (n - span) // stride + 1)`` windows (``span = window +
horizon``), from its first row by ``stride``: O(runs) memory per partition,
never O(windows in the dataset).
"""

from __future__ import annotations

import numpy as np

__all__ = ["find_runs", "join_runs", "split_runs_at", "window_starts", "windows_per_run"]


def find_runs(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(run_starts, run_lengths)``, int64: maximal runs of equal consecutive values of ``keys``."""
    n = len(keys)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    keys = np.asarray(keys)
    change = keys[1:] != keys[:-1]
    if keys.dtype.kind == "f":  # NaN != NaN: a NaN key run is still one run
        change &= ~(np.isnan(keys[1:]) & np.isnan(keys[:-1]))
    starts = np.concatenate([[0], np.flatnonzero(change) + 1]).astype(np.int64)
    lengths = np.diff(np.append(starts, n)).astype(np.int64)
    return starts, lengths


def join_runs(pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(starts, lengths, keys)`` of the whole from each chunk's (starts in whole-partition rows): a run
    split only by a chunk edge becomes one run again."""
    pieces = [p for p in pieces if len(p[0])]
    if not pieces:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    starts = np.concatenate([p[0] for p in pieces])
    lengths = np.concatenate([p[1] for p in pieces])
    keys = np.concatenate([p[2] for p in pieces])
    # A run continues across a chunk edge when the key repeats; only the first run of a chunk can.
    same = np.zeros(len(starts), dtype=bool)
    at = 0
    for p in pieces[:-1]:
        at += len(p[0])
        same[at] = keys[at] == keys[at - 1] or (
            keys.dtype.kind == "f" and np.isnan(keys[at]) and np.isnan(keys[at - 1])
        )
    if not same.any():
        return starts, lengths, keys
    group = np.cumsum(~same) - 1  # (runs,) index of the joined run each piece belongs to
    joined = np.zeros(int(group[-1]) + 1, np.int64)
    np.add.at(joined, group, lengths)
    keep = ~same
    return starts[keep], joined, keys[keep]


def split_runs_at(
    run_starts: np.ndarray, run_lengths: np.ndarray, bad_rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(run_starts, run_lengths)`` of the runs cut at the sorted ``bad_rows`` (removed), no empty piece."""
    if len(bad_rows) == 0:
        return run_starts, run_lengths
    ends = run_starts + run_lengths
    # Boundaries: each run's start/end, plus every bad row splitting into [.., bad) and [bad+1, ..).
    cut_lo = np.concatenate([run_starts, bad_rows + 1])
    cut_hi = np.concatenate([ends, bad_rows])
    lo = np.sort(cut_lo)
    hi = np.sort(cut_hi)
    keep = hi > lo
    # Each piece must lie inside one run: a piece [lo, hi) crossing a run end is impossible
    # because every run end and start is itself a cut.
    return lo[keep].astype(np.int64), (hi - lo)[keep].astype(np.int64)


def windows_per_run(run_lengths: np.ndarray | list[int], span: int, stride: int) -> np.ndarray:
    """``(R,)`` windows each run holds for a window of ``span`` rows stepping by ``stride``."""
    run_lengths = np.asarray(run_lengths, dtype=np.int64)
    return np.maximum(0, (run_lengths - span) // stride + 1)


def window_starts(run_starts: np.ndarray, counts_per_run: np.ndarray, stride: int, lo: int, hi: int) -> np.ndarray:
    """``(hi - lo,)`` int64 partition rows where windows ``lo .. hi-1`` start (numbered run by run)."""
    ends = np.cumsum(counts_per_run)  # (R,) window number just past each run
    first_run = int(np.searchsorted(ends, lo, side="right"))
    last_run = int(np.searchsorted(ends, hi, side="left")) + 1
    ends = ends[first_run:last_run]
    counts = np.asarray(counts_per_run[first_run:last_run], dtype=np.int64)
    begins = ends - counts  # (r,) number of each run's first window
    take = np.minimum(ends, hi) - np.maximum(begins, lo)  # (r,) windows wanted from each run
    # Row of window k of run j is run_starts[j] + (k - begins[j]) * stride: a per-run base plus k * stride.
    base = np.asarray(run_starts[first_run:last_run], dtype=np.int64) - begins * stride
    out = np.repeat(base, np.maximum(take, 0))
    out += np.arange(lo, hi, dtype=np.int64) * stride
    return out
