"""Where ``convert`` puts each row: every series in chunks spread over all output files (pure numpy).

A batch mixes only what a few resident files hold, so the canonical (series, time) order is cut into
chunks dealt over the files (each cycle of ``F`` chunks in a seeded order, inside a file in
golden-ratio steps). A chunk is stored with the next ``span - 1`` rows of its series, so no window
is lost or repeated at a cut; the price is at most a quarter more rows stored (docs/converted.md).
"""

from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass
from typing import Any

import numpy as np

from dask_windows.settings.tuning import CONVERT_SPAN as DEFAULT_SPAN
from dask_windows.settings.tuning import MIN_CHUNK_PER_OVERLAP, TARGET_CHUNKS_PER_FILE

__all__ = [
    "DEFAULT_SPAN",
    "LAYOUTS",
    "SpreadPlan",
    "auto_chunk_rows",
    "canonical_rows",
    "plan_spread",
    "read_converted",
]

LAYOUTS = ("spread", "contiguous")
_LAYOUT_SEED = 0x5EED


@dataclass(frozen=True)
class SpreadPlan:
    """Where every chunk goes, per chunk ``(M,)``: its first canonical row, one past its last owned and
    stored (with the overlap) row, its output ``file`` and ``slot`` there."""

    chunk_lo: np.ndarray
    chunk_hi: np.ndarray
    stored_hi: np.ndarray
    file: np.ndarray
    slot: np.ndarray
    num_files: int
    span: int


def auto_chunk_rows(total_rows: int, num_files: int, span: int) -> int:
    """Rows per chunk: ``TARGET_CHUNKS_PER_FILE`` chunks per file, but at least 4 overlaps long."""
    if num_files <= 1:
        return max(int(total_rows), 1)
    per_file = -(-int(total_rows) // num_files)
    return max(per_file // TARGET_CHUNKS_PER_FILE, MIN_CHUNK_PER_OVERLAP * max(span - 1, 1), 1)


def _coprime_step(k: int) -> int:
    """A step near ``k / golden ratio`` coprime with ``k`` (a low-discrepancy order of ``0..k-1``)."""
    if k <= 2:
        return 1
    step = max(1, round(k / ((1 + 5**0.5) / 2)))
    while math.gcd(step, k) != 1:
        step += 1
    return step


def plan_spread(
    series_rows: np.ndarray, num_files: int, span: int, chunk_rows: int | None = None, seed: int = _LAYOUT_SEED
) -> SpreadPlan:
    """Cut the canonical row order (``series_rows``: ``(S,)`` rows of each series) into chunks and
    deal them over ``num_files`` files, so that every window of ``span`` rows survives the cuts."""
    series_rows = np.asarray(series_rows, np.int64)
    total = int(series_rows.sum())
    num_files = max(1, int(num_files))
    chunk = int(chunk_rows or auto_chunk_rows(total, num_files, span))
    num_chunks = max(1, -(-total // chunk)) if total else 0
    lo = np.arange(num_chunks, dtype=np.int64) * chunk
    hi = np.minimum(lo + chunk, total)
    # Overlap: the chunk's last series continues for up to span - 1 rows past its end.
    series_end = np.cumsum(series_rows)  # (S,) canonical row one past each series
    last_series = np.searchsorted(series_end, hi - 1, side="right")  # (M,) series of each chunk's last row
    ends = series_end[np.minimum(last_series, len(series_end) - 1)] if len(series_end) else hi
    stored_hi = np.minimum(hi + max(span - 1, 0), ends)
    # The deal: cycle c (chunks c*F .. c*F+F-1) gives each file one chunk, in a seeded random order.
    files = np.empty(num_chunks, np.int64)
    cycles = -(-num_chunks // num_files) if num_chunks else 0
    rng = np.random.Generator(np.random.PCG64(seed))
    for c in range(cycles):
        a, b = c * num_files, min((c + 1) * num_files, num_chunks)
        files[a:b] = rng.permutation(num_files)[: b - a]
    # Inside a file its k-th chunk (cycle order) goes to slot p with k = p * step mod K.
    slots = np.empty(num_chunks, np.int64)
    for f in range(num_files):
        mine = np.flatnonzero(files == f)  # (K,) chunks of file f in cycle order
        k = len(mine)
        if not k:
            continue
        step = _coprime_step(k)
        order = (np.arange(k, dtype=np.int64) * step) % k  # (K,) cycle index stored at each slot
        slots[mine[order]] = np.arange(k, dtype=np.int64)
    return SpreadPlan(lo, hi, stored_hi, files, slots, num_files, int(span))


def file_runs(plan: SpreadPlan, series_rows: np.ndarray, keys: list, f: int) -> tuple[int, list[list[Any]]]:
    """Rows and manifest runs ``[start, rows, key, origin, owned]`` of output file ``f``."""
    series_end = np.cumsum(np.asarray(series_rows, np.int64))
    series_start = series_end - series_rows
    mine = np.flatnonzero(plan.file == f)
    mine = mine[np.argsort(plan.slot[mine])]
    runs: list[list[Any]] = []
    at = 0
    for m in mine.tolist():
        lo, hi, top = int(plan.chunk_lo[m]), int(plan.chunk_hi[m]), int(plan.stored_hi[m])
        s = int(np.searchsorted(series_end, lo, side="right"))
        while lo < top:
            end = min(int(series_end[s]), top)
            origin = lo - int(series_start[s])
            runs.append([at, end - lo, keys[s], origin, max(0, min(end, hi) - lo)])
            at += end - lo
            lo, s = end, s + 1
    return at, runs


def segments_of(plan: SpreadPlan, lo: int, hi: int) -> np.ndarray:
    """Stored pieces of canonical rows ``[lo, hi)`` (one sorted bucket): ``(N, 5)`` int64 rows
    ``(file, slot, canonical start, bucket row, rows)``, sorted by file then slot."""
    a = np.maximum(plan.chunk_lo, lo)
    b = np.minimum(plan.stored_hi, hi)
    hit = np.flatnonzero(b > a)
    out = np.stack([plan.file[hit], plan.slot[hit], a[hit], a[hit] - lo, b[hit] - a[hit]], axis=1)
    return out[np.lexsort((out[:, 1], out[:, 0]))] if len(out) else out.reshape(0, 5)


def read_converted(path: str, columns: list | None = None, storage_options: dict | None = None) -> Any:
    """A converted dataset as one pandas DataFrame in canonical (series, time) order, overlap rows dropped."""
    import fsspec
    import pandas as pd
    import pyarrow.parquet as pq

    from dask_windows.sources.manifest import read_manifest

    fs, root = fsspec.core.url_to_fs(path, **(storage_options or {}))
    root = root.rstrip("/")
    manifest = read_manifest(root, fs)
    if manifest is None:
        raise FileNotFoundError(f"{path} has no dask_windows manifest; it was not written by `dask-windows convert`")
    frames, kept, offset = [], [np.zeros(0, np.int64)], 0
    for entry in manifest["files"]:
        with fs.open(posixpath.join(root, entry["path"]), "rb") as src:
            table = pq.read_table(src, columns=columns)
        # the owned rows of each run: run[4] in version 2, the whole run (run[1]) in version 1
        owned = [np.arange(run[0], run[0] + run[4 if len(run) >= 5 else 1], dtype=np.int64) for run in entry["runs"]]
        keep = np.concatenate(owned) if owned else np.zeros(0, np.int64)
        frames.append(table.take(keep).to_pandas())
        kept.append(keep + offset)
        offset += entry["rows"]
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    order = np.argsort(canonical_rows(manifest, np.concatenate(kept)), kind="stable")
    return out.iloc[order].reset_index(drop=True)


def output_files(total_rows: int, target_rows: int, span: int, chunk_rows: int | None = None) -> tuple[int, int]:
    """``(num_files, chunk_rows)``: files near ``target_rows`` rows with their overlap, each at least one chunk."""
    if total_rows <= 0:
        return 0, 1
    files = max(1, -(-total_rows // max(target_rows, 1)))
    for _ in range(4):  # the overlap adds rows, so a few more files; converges at once in practice
        chunk = int(chunk_rows or auto_chunk_rows(total_rows, files, span))
        files = min(files, max(1, -(-total_rows // chunk)))  # every file gets a chunk
        stored = total_rows + (-(-total_rows // chunk)) * max(span - 1, 0)
        more = min(max(1, -(-stored // max(target_rows, 1))), max(1, -(-total_rows // chunk)))
        if more <= files:
            break
        files = more
    return files, int(chunk_rows or auto_chunk_rows(total_rows, files, span))


def canonical_rows(manifest: dict, rows: np.ndarray) -> np.ndarray:
    """``(N,)`` global rows of a converted dataset (as ``return_index=True`` yields them) as rows sorted by
    (series, time); overlap rows map to the row they repeat."""
    rows = np.asarray(rows, np.int64)
    if manifest["version"] == 1:
        return rows
    import pandas as pd

    runs = [r for f in manifest["files"] for r in f["runs"]]
    offsets = np.cumsum([0] + [f["rows"] for f in manifest["files"]])[:-1]  # (F,) global row of each file
    run_file = np.repeat(np.arange(len(manifest["files"])), [len(f["runs"]) for f in manifest["files"]])
    start = offsets[run_file] + np.array([r[0] for r in runs], np.int64)  # (R,) global row of each run
    values = pd.Series([r[2] for r in runs], dtype=object)
    ranks = pd.Index(pd.unique(values)).sort_values()
    codes = ranks.get_indexer(values)  # (R,) canonical rank of each run's series
    owned = np.array([r[4] for r in runs], np.int64)
    series_rows = np.bincount(codes, weights=owned, minlength=len(ranks)).astype(np.int64)
    series_start = np.cumsum(series_rows) - series_rows  # (S,) canonical row of each series
    base = series_start[codes] + np.array([r[3] for r in runs], np.int64) - start  # (R,) canonical minus global row
    run = np.searchsorted(start, rows, side="right") - 1
    return rows + base[run]
