"""``dask-windows inspect --corpus``: what each data set of a corpus holds, leaves out and serves.

Opens each ``PATH`` (or ``NAME=PATH``) as a ``CorpusDataset`` with the settings
given here, mixes them and prints ``CorpusDataset.report`` (``corpus.report``):
series, observations, lengths, what is left out at open and why, missing values
(``--values``: reads the data once) and what one epoch does not serve over
``--world-size`` ranks.
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

__all__: list[str] = []  # internal to the command line


def add_corpus_options(p: argparse.ArgumentParser) -> None:
    """The ``inspect`` flags of a corpus (used with ``--corpus``)."""
    g = p.add_argument_group("corpora (--corpus: each PATH, or NAME=PATH, one data set of list-column series)")
    g.add_argument("--corpus", action="store_true", help="inspect PATHs as data sets of a corpus (CorpusDataset)")
    g.add_argument("--target", default="target", metavar="COL", help="the list column (default: target)")
    g.add_argument("--freq", metavar="F", help="frequency where no freq column gives it")
    g.add_argument("--patch-size", type=int, default=16, metavar="P", help="steps per token (default: 16)")
    g.add_argument("--max-length", type=int, default=512, metavar="L", help="most steps of an item (default: 512)")
    g.add_argument("--min-length", type=int, default=1, metavar="M", help="fewest steps of a series (default: 1)")
    g.add_argument("--sequence-tokens", type=int, metavar="S", help="tokens per sequence (default: L / P)")
    g.add_argument("--channels", choices=("independent", "multivariate"), default="independent", help="the view")
    g.add_argument("--world-size", type=int, default=1, metavar="N", help="ranks dividing the epoch (default: 1)")
    g.add_argument("--epoch", type=int, default=0, metavar="E", help="the epoch counted (default: 0)")
    g.add_argument("--values", action="store_true", help="read every value: missing values, series all missing")


def _members(paths: list[str]) -> list[tuple[str, str]]:
    out = []
    for given in paths:
        name, sep, path = given.partition("=")
        out.append((name, path) if sep and "://" not in name and "/" not in name else (given, given))
    return out


def inspect_corpus(args: argparse.Namespace) -> dict:
    """The corpus report of the parsed ``inspect --corpus`` arguments (``{"text": ...}`` without ``--json``)."""
    from dask_windows.corpus import CorpusDataset, LeftOutSeriesWarning, mix_corpora

    settings: dict[str, Any] = dict(
        patch_size=args.patch_size,
        max_length=args.max_length,
        min_length=args.min_length,
        sequence_tokens=args.sequence_tokens,
        channels=args.channels,
    )
    if args.batch_size is not None:
        settings["batch_size"] = args.batch_size
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeftOutSeriesWarning)  # the report counts them
        members = {
            name: CorpusDataset(path, target=args.target, freq=args.freq, name=name, **settings)
            for name, path in _members(list(args.path))
        }
    ds = members[next(iter(members))] if len(members) == 1 else mix_corpora(members)
    report = ds.report(values=args.values, epoch=args.epoch, world_size=args.world_size)
    return report if args.json else {"text": _text(report)}


def _text(report: dict) -> str:
    lines = []
    for name, d in report["datasets"].items():
        left = d["left_out"]
        lines.append(f"{name}  ({d['path']}, {d['files']:,} files, {d['partitions']:,} partitions)")
        rows = [
            ("series", f"{d['series']:,} ({d['observations']:,} observations, up to {d['channels_max']} channels)"),
            ("lengths", f"{d['length_min']:,} to {d['length_max']:,} steps (median {d['length_median']:,.0f})"),
            (
                "left out",
                f"{left['series']:,} series, {left['observations']:,} observations: {left['empty_rows']:,} empty "
                f"rows, {left['short_series']:,} shorter than min_length, {left['wide_series']:,} with more "
                "channels than a sequence holds",
            ),
            ("items", f"{d['items']:,} ({d['items_per_epoch']:,} per epoch)"),
        ]
        if "missing" in d:
            m = d["missing"]
            rows.append(
                (
                    "missing",
                    f"{m['missing_observations']:,} values in {m['series_with_missing']:,} series "
                    f"({m.get('infinite_observations', 0):,} of them inf or beyond float32, served masked); "
                    f"{m['series_all_missing']:,} series and {m['channels_all_missing']:,} channels with no "
                    "observed value (served fully masked)",
                )
            )
        if "epoch_not_served" in d:
            e = d["epoch_not_served"]
            rows.append(
                (
                    "epoch",
                    f"{e['items']:,} items ({e['observations']:,} observations) in sequences no rank serves, "
                    f"{e['observations_cut_by_context']:,} steps cut by context_length, "
                    f"{e['items_not_drawn']:,} items not drawn, {e['items_repeated']:,} repeated",
                )
            )
        width = max(len(k) for k, _ in rows)
        lines.extend(f"  {k:<{width}}  {v}" for k, v in rows)
    if "epoch" in report:
        e = report["epoch"]
        lines.append(
            f"epoch {e['epoch']} over {e['world_size']} ranks: {e['sequences']:,} sequences, "
            f"{e['sequences_not_served']:,} not served, {e['packing_efficiency']:.1%} of tokens hold an item"
        )
    return "\n".join(lines)
