"""What a corpus holds and what it does not serve, per data set: ``inspect`` for corpora.

``corpus_report(ds)`` counts every series and observation left out at open, served without an
observed value (``values=True``: one pass over the data) and not served in an epoch
(docs/corpora.md). The report carries ``checksum``, a SHA-256 of the rest, so a saved report
edited by hand is refused by ``verify_report``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from dask_windows.corpus.work import reader_work
from dask_windows.errors import DataError
from dask_windows.planning.division import reader_share
from dask_windows.planning.world import World

CorpusDataset = Any  # corpus.dataset's class (not imported: it imports this module)
Member = Any

__all__ = ["corpus_report", "missing_per_channel", "report_checksum", "verify_report"]


def missing_per_channel(
    values: np.ndarray, starts: np.ndarray, lengths: np.ndarray, channels: np.ndarray
) -> np.ndarray:
    """``(sum channels,)`` NaN values of each channel of each row of one partition's flat values.

    Row ``r``'s channel ``c`` is ``values[starts[r] + c * lengths[r] :][: lengths[r]]``.
    """
    per = np.asarray(channels, np.int64)
    row = np.repeat(np.arange(len(per)), per)
    c = np.arange(int(per.sum()), dtype=np.int64) - np.repeat(np.cumsum(per) - per, per)
    lo = np.asarray(starts, np.int64)[row] + c * np.asarray(lengths, np.int64)[row]
    hi = lo + np.asarray(lengths, np.int64)[row]
    cum = np.concatenate([[0], np.cumsum(np.isnan(values), dtype=np.int64)])
    return cum[hi] - cum[lo]


def _missing(member: Member) -> dict[str, int]:
    """Missing observations, all-missing series and all-missing channels of one data set (reads it)."""
    source = member.source
    missing = series_all = series_some = channels_all = infinite = 0
    for p in range(source.num_partitions):
        a, b = int(source.partition_series[p]), int(source.partition_series[p + 1])
        lengths, channels = source.lengths[a:b], source.channels[a:b]
        decoded = source.read(p)
        if decoded.infinite is not None:  # served masked (NaN in decoded.values): counted apart too
            infinite += int(np.count_nonzero(decoded.infinite))
        per_channel = missing_per_channel(decoded.values, decoded.starts, lengths, channels)
        size = np.repeat(lengths, channels)
        row = np.repeat(np.arange(b - a), channels)
        per_series = np.bincount(row, weights=per_channel, minlength=b - a).astype(np.int64)
        whole = lengths * channels
        real = whole > 0
        missing += int(per_channel.sum())
        series_all += int((real & (per_series == whole)).sum())
        series_some += int((real & (per_series > 0)).sum())
        channels_all += int(((size > 0) & (per_channel == size)).sum())
    return {
        "missing_observations": missing,
        "series_with_missing": series_some,
        "series_all_missing": series_all,
        "channels_all_missing": channels_all,
        "infinite_observations": infinite,
    }


def _epoch_losses(ds: CorpusDataset, epoch: int, world_size: int) -> dict[str, np.ndarray]:
    """Per data set: items and observations of ``epoch`` that no rank of ``world_size`` serves."""
    s = ds.settings
    plan = ds.plan(epoch)
    m = len(ds.members)
    q = len(plan.sequence_ptr) - 1
    width = np.zeros(len(plan.item), np.int64)  # (N,) channels of each item
    for k, member in enumerate(ds.members):
        at = plan.member == k
        width[at] = member.units.width[plan.unit[at]]
    steps = (plan.stop - plan.start) * width  # (N,) observations (and padding of missing values) of each item
    served_seq = np.zeros(q, bool)
    cut = np.zeros(m, np.int64)
    for rank in range(world_size):
        share = reader_share(q, World(rank, world_size), s.batch_size, s.drop_last)
        served_seq[share.lo : share.hi] = True
        if s.context_length is not None and not s.pack and share.hi > share.lo:
            work = reader_work(plan, ds.members, s, epoch, share.lo, share.hi, 0)
            entries = plan.entries[plan.sequence_ptr[share.lo] : plan.sequence_ptr[share.hi]]
            kept = (work.stop - work.start) * work.width
            cut += np.bincount(work.member, weights=steps[entries] - kept, minlength=m).astype(np.int64)
    per_entry = np.repeat(served_seq, np.diff(plan.sequence_ptr))  # (N,) in sequence order
    dropped = plan.entries[~per_entry]
    return {
        "items": np.bincount(plan.member[dropped], minlength=m).astype(np.int64),
        "observations": np.bincount(plan.member[dropped], weights=steps[dropped], minlength=m).astype(np.int64),
        "cut": cut,
        "sequences": np.asarray([q - int(served_seq.sum())]),
    }


def corpus_report(
    ds: CorpusDataset, *, values: bool = False, epoch: int | None = None, world_size: int | None = None
) -> dict[str, Any]:
    """``{"datasets": {name: {...}}, "epoch": {...}, "settings": {...}}``: what each data set of ``ds`` holds,
    leaves out and serves in ``epoch`` divided between ``world_size`` ranks (defaults: the dataset's).

    ``values=True`` also reads every value, to count missing observations and fully masked series.
    """
    s = ds.settings
    epoch = ds.epoch if epoch is None else int(epoch)
    world_size = ds.world_size if world_size is None else int(world_size)
    out: dict[str, Any] = {"datasets": {}, "settings": {k: getattr(s, k) for k in s.__dataclass_fields__}}
    if ds.num_items:
        losses = _epoch_losses(ds, epoch, world_size)
    for k, (member, count) in enumerate(zip(ds.members, ds.counts)):
        source, left = member.source, member.left_out
        lengths, channels = source.lengths, source.channels
        real = lengths > 0
        null = (channels == 0) | (lengths == 0)  # null rows and empty lists
        observed = lengths * channels
        entry: dict[str, Any] = {
            "path": source.name,
            "files": len(source.files),
            "partitions": source.num_partitions,
            "series": len(lengths),
            "observations": int(observed.sum()),
            "length_min": int(lengths[real].min()) if real.any() else 0,
            "length_median": float(np.median(lengths[real])) if real.any() else 0.0,
            "length_max": int(lengths.max(initial=0)),
            "channels_max": int(channels.max(initial=0)),
            "freqs": list(source.freqs),
            "left_out": {
                "empty_rows": int(null.sum()),
                "short_series": left.short - int(null.sum()),
                "short_observations": left.short_steps,
                "wide_series": left.wide,
                "wide_observations": left.wide_steps,
                "series": left.series,
                "observations": left.short_steps + left.wide_steps,
            },
            "items": member.units.num_items,
            "items_per_epoch": int(count),
        }
        entry["served_series"] = entry["series"] - left.series
        if values:
            entry["missing"] = _missing(member)
        if ds.num_items:
            entry["epoch_not_served"] = {
                "items": int(losses["items"][k]),
                "observations": int(losses["observations"][k]),
                "observations_cut_by_context": int(losses["cut"][k]),
                "items_not_drawn": max(member.units.num_items - int(count), 0),
                "items_repeated": max(int(count) - member.units.num_items, 0),
            }
        out["datasets"][member.name] = entry
    if ds.num_items:
        out["epoch"] = {
            "epoch": epoch,
            "world_size": world_size,
            "sequences": ds.num_sequences(epoch),
            "sequences_not_served": int(losses["sequences"][0]),
            "packing_efficiency": ds.packing_efficiency(epoch),
        }
    out["checksum"] = report_checksum(out)
    return out


def report_checksum(report: dict[str, Any]) -> str:
    """SHA-256 of a report's content (all but its ``checksum``), as JSON with sorted keys: tuples and lists alike."""
    content = {k: v for k, v in report.items() if k != "checksum"}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def verify_report(report: Any, where: str = "the corpus report") -> dict[str, Any]:
    """``report`` if its ``checksum`` matches its content, else ``DataError`` naming ``where`` it came from."""
    if not isinstance(report, dict) or "datasets" not in report:
        raise DataError(f"{where} is not a corpus report; make one with CorpusDataset.report()")
    if "checksum" not in report:
        raise DataError(f"{where} has no checksum; make it again with CorpusDataset.report()")
    if report_checksum(report) != report["checksum"]:
        raise DataError(
            f"{where} does not match its checksum: it was edited after it was made; make it again with "
            "CorpusDataset.report() (or dask-windows inspect --corpus --json)"
        )
    return report
