"""How well a dataset's batches mix, measured beside a global shuffle of the same windows.

Without reading data, the plan and the grid give each batch's global start rows (``plan_batches``), and
the dataset is cut into ``blocks`` equal row blocks. ``batch_statistics`` over a reader's first batches:
``distinct_blocks`` a batch touches, ``tv_distance`` of its block histogram from the dataset's, ``lag1``
correlation of consecutive batches' mean block, ``effective_batch_size`` (``B`` for an ideal shuffle).
``mixing_report`` sets them beside a global shuffle's with a verdict and advice. Fault replacement
(``on_error="skip"``) is not simulated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dask_windows.planning.plan import rng_for
from dask_windows.planning.pool import pool_starts
from dask_windows.planning.world import World

__all__ = [
    "MixingStats",
    "batch_statistics",
    "block_histogram",
    "format_report",
    "global_shuffle_statistics",
    "inspect_mixing",
    "mixing_report",
    "plan_batches",
    "spread_places",
]


@dataclass(frozen=True)
class MixingStats:
    """Mixing statistics of a sequence of batches (see the module docstring)."""

    batches: int
    distinct_blocks: float
    tv_distance: float
    lag1: float
    effective_batch_size: float


def plan_batches(
    ds: Any, epoch: int | None = None, rank: int = 0, max_batches: int | None = None
) -> Iterator[np.ndarray]:
    """Global start rows of each batch one reader (``rank``, no DataLoader workers) yields, from the plan
    and the grid alone: the rows ``return_index=True`` yields when no partition is skipped."""
    spec, grid = ds.spec, ds.grid
    world = World(rank, ds.world_size, 0, 1)
    saved, ds.epoch = ds.epoch, ds.epoch if epoch is None else epoch
    try:
        plan = ds._plan(world)
    finally:
        ds.epoch = saved
    # the pool order (planning.pool; whole partitions are a pool of buffer_partitions of them)
    yield from _cut(
        pool_starts(plan, grid.first, grid.counts, grid.stride, ds.row_offsets), spec.batch_size, max_batches
    )


def _cut(steps: Iterator[np.ndarray], batch_size: int, max_batches: int | None) -> Iterator[np.ndarray]:
    """Batches of ``batch_size`` cut from consecutive arrays, the last one possibly short."""
    carry, emitted = np.zeros(0, np.int64), 0
    for step in steps:
        starts = np.concatenate([carry, step])
        full = len(starts) // batch_size * batch_size
        for b in range(0, full, batch_size):
            yield starts[b : b + batch_size]
            emitted += 1
            if max_batches is not None and emitted >= max_batches:
                return
        carry = starts[full:]
    if len(carry):
        yield carry


def spread_places(ds: Any) -> tuple[Callable[[np.ndarray], np.ndarray], int] | None:
    """For data ``dask-windows convert`` spread over its files: each stored row's place in the data.

    A stored row's place is its row in (series, time) order, from the manifest's runs. Returns
    ``(place, rows)``: a function of ``(N,)`` global stored rows to their places, and the data's (owned)
    rows; ``None`` for other data, or when a partition is not a whole file of the manifest.
    """
    source = getattr(ds, "source", None)
    manifest = (getattr(source, "_manifest", None) or {}).get("manifest") or {}
    if manifest.get("version", 1) < 2:
        return None
    by_path = {f["path"]: f["runs"] for f in manifest["files"]}
    owned: dict[Any, int] = {}
    for runs in by_path.values():
        for run in runs:
            owned[run[2]] = owned.get(run[2], 0) + run[4]
    series_start, rows = {}, 0
    for key in sorted(owned):
        series_start[key], rows = rows, rows + owned[key]
    starts, shifts = [], []  # per run: its first global stored row, and place minus stored row
    for p, part in enumerate(ds.partitions):
        path = str(part.key[0]) if isinstance(part.key, tuple) else ""
        name = next((n for n in by_path if path == n or path.endswith("/" + n)), None)
        if name is None or part.num_rows != sum(run[1] for run in by_path[name]):
            return None
        for run in by_path[name]:
            first = int(ds.row_offsets[p]) + run[0]
            starts.append(first)
            shifts.append(series_start[run[2]] + run[3] - first)
    order = np.argsort(starts, kind="stable")
    first_rows = np.asarray(starts, np.int64)[order]  # (R,) sorted
    shift = np.asarray(shifts, np.int64)[order]  # (R,)

    def place(stored: np.ndarray) -> np.ndarray:
        stored = np.asarray(stored, np.int64)
        return stored + shift[np.maximum(np.searchsorted(first_rows, stored, "right") - 1, 0)]

    return place, rows


def block_histogram(ds: Any, blocks: int = 100, places: Any = None) -> np.ndarray:
    """``(blocks,)`` windows of the dataset whose start row falls in each of ``blocks`` equal row blocks.

    Exact, from each run's first window and count: O(runs * blocks), no window listed. ``places``
    (``spread_places``): blocks of the data's (series, time) order instead of stored rows.
    """
    total = int(sum(p.num_rows for p in ds.partitions)) if places is None else places[1]
    edges = (np.arange(blocks + 1, dtype=np.int64) * total + blocks - 1) // blocks  # first row of each block
    out = np.zeros(blocks, np.int64)
    stride = ds.grid.stride
    for p, (first, counts) in enumerate(zip(ds.grid.first, ds.grid.counts)):
        keep = counts > 0
        f = (np.asarray(first, np.int64)[keep] + ds.row_offsets[p])[:, None]  # (R, 1) first start row
        if places is not None:  # a run lies within one manifest run, whose rows keep their order
            f = places[0](f)
        c = np.asarray(counts, np.int64)[keep][:, None]
        if not len(f):
            continue
        # Windows k of a run with f + k * stride < edge: ceil((edge - f) / stride), clipped to [0, c].
        below = np.clip(-((f - edges[None, :]) // stride), 0, c)  # (R, blocks + 1)
        out += np.diff(below, axis=1).sum(axis=0)
    return out


def batch_statistics(
    batches: list[np.ndarray], histogram: np.ndarray, total_rows: int, place: Callable | None = None
) -> MixingStats:
    """Statistics of ``batches`` (global start rows; ``place`` maps them to the data's order) against the
    dataset's block ``histogram``."""
    blocks = len(histogram)
    p, _, var_window = _block_spread(histogram)
    batches = [b for b in batches if len(b)]
    distinct, tv, means = [], [], []
    for rows in batches:
        rows = np.asarray(rows, np.int64) if place is None else place(rows)
        block = np.minimum(rows * blocks // max(total_rows, 1), blocks - 1)
        q = np.bincount(block, minlength=blocks) / len(block)
        distinct.append(np.count_nonzero(q))
        tv.append(0.5 * np.abs(q - p).sum())
        means.append(block.mean())
    return _summarise(distinct, tv, np.array(means), var_window)


def _block_spread(histogram: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """``(p, centres, var)``: the dataset's block distribution, block numbers and one window's block variance."""
    p = histogram / max(histogram.sum(), 1)
    centres = np.arange(len(histogram), dtype=np.float64)
    return p, centres, float(np.sum(p * (centres - np.sum(p * centres)) ** 2))


def _summarise(distinct: list, tv: list, means: np.ndarray, var_window: float) -> MixingStats:
    lag1 = float(np.corrcoef(means[:-1], means[1:])[0, 1]) if len(means) > 2 and means.std() > 0 else 0.0
    var_batch = float(means.var()) if len(means) > 1 else 0.0
    return MixingStats(
        batches=len(means),
        distinct_blocks=float(np.mean(distinct)) if distinct else 0.0,
        tv_distance=float(np.mean(tv)) if tv else 0.0,
        lag1=lag1,
        effective_batch_size=var_window / var_batch if var_batch > 0 else float("inf"),
    )


def global_shuffle_statistics(histogram: np.ndarray, batch_size: int, num_batches: int, seed: int = 0) -> MixingStats:
    """The reference: ``num_batches`` batches of ``batch_size`` windows drawn from the whole dataset."""
    p, centres, var_window = _block_spread(histogram)
    counts = rng_for(seed, 0x313C).multinomial(batch_size, p, size=max(num_batches, 3))  # (batches, blocks)
    q = counts / batch_size
    return _summarise(
        list(np.count_nonzero(counts, axis=1)), list(0.5 * np.abs(q - p).sum(axis=1)), q @ centres, var_window
    )


def mixing_report(ds: Any, max_batches: int = 2000, blocks: int = 100, epoch: int | None = None) -> dict:
    """The mixing statistics of ``ds`` as configured, a global shuffle's, a verdict and advice.

    Nothing is read; ``max_batches`` of rank 0's epoch are measured over ``blocks`` equal row blocks.
    Returns ``{"loader": MixingStats dict, "global": ..., "verdict", "advice", "settings"}``.
    """
    places = spread_places(ds)
    histogram = block_histogram(ds, blocks, places)
    total = int(sum(p.num_rows for p in ds.partitions)) if places is None else places[1]
    batches = list(plan_batches(ds, epoch, 0, max_batches))
    loader = batch_statistics(batches, histogram, total, None if places is None else places[0])
    reference = global_shuffle_statistics(histogram, ds.spec.batch_size, loader.batches, ds.spec.seed)
    spec = ds.spec
    b = spec.batch_size
    in_buffer = spec.buffer_partitions  # whole partitions per buffer (the pool order: see below)
    settings = {
        "batch_size": b,
        "buffer_partitions": spec.buffer_partitions,
        "pieces_per_partition": spec.pieces_per_partition,
        "partitions": len(ds.partitions),
        "windows": ds.num_windows,
        "blocks_of": "stored rows" if places is None else "the data's (series, time) order (spread layout)",
    }
    eff = loader.effective_batch_size
    effective = f"effective batch size {eff:.0f} of {b}" + (
        ": above the batch size because each batch is drawn more evenly over the data than random draws are"
        if eff > 1.05 * b
        else ""
    )
    remedy = _remedy(ds, places is not None, in_buffer)
    near = (
        loader.distinct_blocks >= 0.95 * reference.distinct_blocks
        and loader.tv_distance <= 1.05 * reference.tv_distance
    )
    # consecutive independent batches: their lag-1 correlation is noise of about 1 / sqrt(batches)
    if eff >= 0.9 * b and near and abs(loader.lag1) < max(0.05, 3 / np.sqrt(max(loader.batches, 1))):
        verdict = f"mixes like a global shuffle ({effective})"
        advice = "nothing to change"
    elif eff >= 0.5 * b and loader.distinct_blocks >= 0.75 * reference.distinct_blocks:
        verdict = f"mixes well ({effective}; a global shuffle: {reference.effective_batch_size:.0f})"
        advice = (
            f"a batch draws on its buffer's {in_buffer} partitions ({loader.distinct_blocks:.1f} of {blocks} row "
            f"blocks; a global shuffle: {reference.distinct_blocks:.1f}; lag-1 {loader.lag1:.2f}): {remedy}"
        )
    elif eff >= 0.5 * b and spec.shuffle:
        verdict = (
            f"batches are unbiased ({effective}) but each draws on few places of the data "
            f"({loader.distinct_blocks:.1f} of {blocks} row blocks; a global shuffle: {reference.distinct_blocks:.1f})"
        )
        advice = (
            f"{remedy}: with few places per batch, training on many series was measured 10-13% worse (docs/mixing.md)"
        )
    elif not spec.shuffle:
        verdict = f"not shuffled (shuffle=False): batches follow the data's order ({effective})"
        advice = "pass shuffle=True for training"
    else:
        verdict = (
            f"mixes poorly: a batch holds about {eff:.0f} independent places of the data, not {b} "
            f"({loader.distinct_blocks:.1f} of {blocks} row blocks; a global shuffle: {reference.distinct_blocks:.1f})"
        )
        advice = remedy
        if len(ds.partitions) < 2 * b and places is None:
            advice += f"; with {len(ds.partitions)} partitions, smaller partitions (partition_bytes=) help too"
    out = {"loader": asdict(loader), "global": asdict(reference), "verdict": verdict, "advice": advice}
    pool = ds._pool_summary() if hasattr(ds, "_pool_summary") else None
    if pool is not None:  # the pool order: its reads, memory and places per batch
        out["pool"] = pool = {k: float(v) if isinstance(v, np.floating) else v for k, v in pool.items()}
        settings["buffer_bytes"] = spec.buffer_bytes
        if "nothing to change" not in advice and spec.shuffle:
            need = ds._advised_budget()  # the figure the PoolWarning gives, checked against the plan
            raise_to = (
                f"raise buffer_bytes (now {spec.buffer_bytes:,}) to about {need:,} bytes, which holds about "
                f"{min(2 * b, pool['units'])} of them,"
                if need
                else "no buffer_bytes makes it mix like a global shuffle:"
            )
            out["advice"] = (
                f"a batch draws on the {pool['resident_units']} units resident at once ({pool['unit_rows']:,} rows "
                f"at most each): {raise_to} "
                + (
                    "or drop buffer_bytes: this data is convert's spread layout, which mixes in whole partitions"
                    if places is not None
                    else "or rewrite the data with `dask-windows convert` (its spread layout mixes at one read per epoch)"
                )
            )
    out["settings"] = settings
    return out


def _remedy(ds: Any, spread: bool, in_buffer: int) -> str:
    """What raises the places a batch of the order of (pieces of) whole partitions draws on, for this data."""
    partitions = len(ds.partitions)
    if spread:  # convert's own output: whole partitions are already the order it was written for
        fewer = "convert again with a smaller --chunk-rows (more, shorter chunks in each file)"
        if in_buffer >= partitions:
            return fewer
        return (
            f"raise buffer_partitions (now {in_buffer} of {partitions} files: every file holds chunks of every "
            f"part of the data, and a batch draws on the files in its buffer), or {fewer}"
        )
    if getattr(ds.source, "default_pieces_per_partition", None) is None:  # pieces_per_partition was asked for
        return (
            f"drop pieces_per_partition for the default pool order (a buffer here holds {in_buffer} partitions: a "
            "batch touches at most that many places of the data), or rewrite the data with `dask-windows convert`"
        )
    return (  # a source read in whole partitions by default (Dask frames)
        f"raise buffer_partitions (now {in_buffer} of {partitions} partitions: a batch touches at most that many "
        "places of the data), or write the data with `dask-windows convert` (its spread layout mixes in whole "
        "partitions)"
    )


def format_report(report: dict) -> str:
    """The report as a small text table."""
    lines = [
        f"{'order':<16}{'batches':>8}{'distinct blocks':>17}{'TV distance':>13}{'lag-1':>8}{'effective B':>13}",
    ]
    for name, key in (("this loader", "loader"), ("global shuffle", "global")):
        s = report[key]
        lines.append(
            f"{name:<16}{s['batches']:>8}{s['distinct_blocks']:>17.1f}{s['tv_distance']:>13.3f}"
            f"{s['lag1']:>8.2f}{s['effective_batch_size']:>13.1f}"
        )
    pool = report.get("pool")
    if pool is not None:
        lines.append(
            f"reads per epoch: each of {pool['units']:,} units (row groups) decoded once; resident: "
            f"{pool['resident_units']:,} units, {pool['pool_bytes'] / 2**20:,.1f} MiB of a budget of "
            f"{pool['budget_bytes'] / 2**20:,.1f} MiB; a batch draws on about {pool['places_per_batch']:.0f} units "
            f"(a global shuffle: {pool['places_global']:.0f})"
        )
    lines.append(f"verdict: {report['verdict']}")
    lines.append(f"advice: {report['advice']}")
    return "\n".join(lines)


def inspect_mixing(path: str, summary: dict, **settings: Any) -> dict:
    """``mixing_report`` of the Parquet dataset at ``path`` as ``dask-windows inspect`` describes it.

    ``summary``: ``inspect_dataset``'s report; ``settings``: ``WindowDataset`` keywords of the order.
    """
    from dask_windows.dataset import WindowDataset
    from dask_windows.errors import ConfigError

    if summary.get("window") is None:
        raise ConfigError("--mixing needs the window settings: pass --window (and --stride, --horizon)")
    features = list(summary.get("features") or ())[:1] or list(summary.get("targets") or ())[:1]
    if not features:
        raise ConfigError(f"{path} has no numeric column to stand in as a feature; pass --features")
    ds = WindowDataset(
        path,
        features=features,
        targets=list(summary.get("targets") or ()) if summary.get("horizon") else None,
        series=summary.get("series_column"),
        window=summary["window"],
        stride=summary.get("stride", 1),
        horizon=summary.get("horizon", 0),
        **settings,
    )
    return mixing_report(ds)
