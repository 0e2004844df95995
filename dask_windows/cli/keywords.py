"""``WindowDataset``'s keywords on the command line: :data:`OPTIONS`, one row per keyword of
``settings.config.KEYWORDS``, gives the dataset flags and what error messages name; a keyword
without a flag says why."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dask_windows.settings.config import KEYWORDS

__all__: list[str] = []  # internal to the command line


def _size(text: str) -> int:
    from dask.utils import parse_bytes

    return int(parse_bytes(text))


@dataclass(frozen=True)
class Option:
    """One keyword of ``WindowDataset`` on the command line: its ``add_argument`` settings (``type``
    ``"count"`` or ``"size"``: ``cli.options``'s), those ``bench`` replaces, how the parsed ``value``
    becomes the dataset's, or ``why`` it has no flag."""

    keyword: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    bench: Mapping[str, Any] = field(default_factory=dict)
    value: Callable[[Any], Any] | None = None
    why: str = ""

    @property
    def flag(self) -> str | None:
        """``--the-keyword``, or ``None`` when the command line does not set it."""
        return None if self.why else "--" + self.keyword.replace("_", "-")


def _flag(keyword: str, bench: Mapping[str, Any] | None = None, value: Any = None, **settings: Any) -> Option:
    """The row of a keyword a flag sets (``bench``: the settings that differ in ``bench``)."""
    return Option(keyword, settings, bench or {}, value)


OPTIONS: tuple[Option, ...] = (
    _flag(
        "features",
        {"required": True, "help": "columns stacked as x (required)"},
        nargs="+",
        metavar="COL",
        help="columns stacked as x (default: every numeric column but series, time and targets)",
    ),
    _flag(
        "series",
        {"required": True, "help": "the series column (required)"},
        metavar="COL",
        help="the series column (default: the manifest's; none without one)",
    ),
    _flag(
        "window",
        {"required": True, "help": "rows per window"},
        type=int,
        metavar="L",
        help="rows per window (default: no window counts)",
    ),
    _flag("stride", type=int, default=1, metavar="S", help="rows between consecutive window starts"),
    _flag("horizon", type=int, default=0, metavar="H", help="rows after each window that its targets cover"),
    _flag("targets", nargs="+", metavar="COL", help="columns stacked as y (default: none)"),
    _flag("batch_size", type=int, default=256, metavar="B", help="windows per batch"),
    _flag("buffer_partitions", type=int, default=2, metavar="N", help="partitions decoded together"),
    _flag("prefetch_partitions", type=int, default=1, metavar="N", help="partitions read ahead"),
    _flag(
        "pieces_per_partition",
        type=int,
        metavar="K",
        help="1: whole partitions (default: the pool order); above 1: deprecated",
    ),
    _flag("buffer_bytes", type=int, metavar="N", help="the pool order's memory budget per rank (default: 1 GiB)"),
    _flag(
        "nan",
        choices=("raise", "drop"),
        default="raise",
        help="windows holding NaN: raise an error, or drop them (as WindowDataset's nan=)",
    ),
    _flag(
        "on_error",
        choices=("raise", "skip"),
        default="raise",
        help="unreadable files: raise an error, or skip them (as WindowDataset's on_error=)",
    ),
    _flag(
        "retries",
        type="count",
        default=3,
        metavar="N",
        help="retries of transient storage errors (as WindowDataset's retries=)",
    ),
    _flag(
        "partition_bytes",
        value=_size,
        type="size",
        metavar="BYTES",
        help="split Parquet files with more uncompressed bytes at row groups (default: the loader's, 256MiB)",
    ),
    Option("layout", why="the shape of x only: the figures and counts are the same for NCL and NLC"),
    Option("return_index", why="one more int64 tensor per batch: counts and figures do not depend on it"),
    Option("normalize", why="scaling of the values, a Python dict or a stats file: Python's WindowDataset takes it"),
    Option("workflow", why="a fitted Python object: the fit command fits one, Python's WindowDataset applies it"),
    Option("drop_last", why="changes the last batch only; inspect and bench report whole epochs"),
    Option("shuffle", why="always on, as in training; counts and figures do not depend on the order"),
    Option("seed", why="0; counts and figures do not depend on the order's seed"),
    Option("rank", why="the command line runs one process: rank 0 of 1"),
    Option("world_size", why="the command line runs one process: rank 0 of 1"),
    Option("device", why="batches are gathered on the host; the device path is measured in Python"),
    Option("storage_options", why="a dict of fsspec options: credentials come from the environment"),
    Option("partition_rows", why="numpy arrays only; the command line reads files"),
    Option("threads", why="the loader's default (16) opens local files and object stores well"),
    Option("timeout", why="the loader's default (60 s a read): a stalled read fails with its name"),
    Option("strict", why="inspect and bench report suspect data as warnings either way"),
    Option("cache_dir", why="a local cache across epochs: one command is one pass"),
    Option("cache_bytes", why="goes with cache_dir"),
    Option("index", why="the dataset index beside a folder is used when there is one (dask-windows index writes it)"),
    Option("next_pass_seconds", why="one command is one pass: nothing to read ahead for"),
)

#: The dataset's keywords that a flag sets, and the flag (error messages name it).
FLAGS: dict[str, str] = {o.keyword: o.flag for o in OPTIONS if o.flag is not None}


def dataset_keywords(args: argparse.Namespace) -> dict:
    """The ``WindowDataset`` keywords the parsed flags give (those not given are left out)."""
    out = {}
    for option in OPTIONS:
        value = getattr(args, option.keyword, None) if option.flag else None
        if value is not None:  # else the dataset's own default (or, for inspect, the manifest's series)
            out[option.keyword] = option.value(value) if option.value is not None else value
    return out


def check_table() -> list[str]:
    """What the table gets wrong against ``KEYWORDS`` (empty: nothing); the package's tests call it."""
    mine = [o.keyword for o in OPTIONS]
    problems = [f"{k}: a WindowDataset keyword without a command-line decision" for k in KEYWORDS if k not in mine]
    return problems + [f"{k}: not a WindowDataset keyword" for k in mine if k not in KEYWORDS]
