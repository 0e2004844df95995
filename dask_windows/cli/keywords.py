"""``WindowDataset``'s keywords on the command line: one table, a decision for every keyword.

``inspect`` and ``bench`` open a ``WindowDataset``; instead of listing its settings in each
command, the parser's options and the keywords handed to the dataset both come from
:data:`OPTIONS`, one row per keyword of ``dask_windows.settings.config.KEYWORDS``: the flag and its
argparse settings (per command where they differ), or the reason the keyword has no flag. A
test checks that every keyword has a row, so a keyword added to ``WindowDataset`` needs a
decision here. The table costs a little indirection; in return a flag's name, help, default and
conversion live in one place, and the error messages name the flags from the same table.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dask_windows.settings.config import KEYWORDS

__all__: list[str] = []  # internal to the command line


def _size(text: str | None) -> int | None:
    from dask.utils import parse_bytes

    return None if text is None else int(parse_bytes(text))


@dataclass(frozen=True)
class Option:
    """One keyword of ``WindowDataset`` on the command line.

    Attributes:
        keyword: The dataset's keyword (also the parsed argument's ``dest``).
        flag: Its flag, or ``None`` when the command line does not set it (``why`` says why).
        settings: ``add_argument`` settings shared by the commands (``type`` ``"count"`` or
            ``"size"``: the command line's argument types of those names).
        per_command: Settings of one command that replace the shared ones.
        value: Turns the parsed text into the dataset's value (sizes), else it is passed as parsed.
        why: Why a keyword has no flag.
    """

    keyword: str
    flag: str | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    per_command: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    value: Callable[[Any], Any] | None = None
    why: str = ""


def _no_flag(keyword: str, why: str) -> Option:
    return Option(keyword, why=why)


OPTIONS: tuple[Option, ...] = (
    Option(
        "features",
        "--features",
        {"nargs": "+", "metavar": "COL"},
        {
            "inspect": {"help": "columns stacked as x (default: every numeric column but series, time and targets)"},
            "bench": {"required": True, "help": "columns stacked as x (required)"},
        },
    ),
    Option(
        "series",
        "--series",
        {"metavar": "COL"},
        {
            "inspect": {"help": "the series column (default: the manifest's; none without one)"},
            "bench": {"required": True, "help": "the series column (required)"},
        },
    ),
    Option(
        "window",
        "--window",
        {"type": int, "metavar": "L"},
        {
            "inspect": {"help": "rows per window (default: no window counts)"},
            "bench": {"required": True, "help": "rows per window"},
        },
    ),
    Option(
        "stride",
        "--stride",
        {"type": int, "default": 1, "metavar": "S", "help": "rows between consecutive window starts"},
    ),
    Option(
        "horizon",
        "--horizon",
        {"type": int, "default": 0, "metavar": "H", "help": "rows after each window that its targets cover"},
    ),
    Option("targets", "--targets", {"nargs": "+", "metavar": "COL", "help": "columns stacked as y (default: none)"}),
    Option("batch_size", "--batch-size", {"type": int, "default": 256, "metavar": "B", "help": "windows per batch"}),
    Option(
        "buffer_partitions",
        "--buffer-partitions",
        {"type": int, "default": 2, "metavar": "N", "help": "partitions decoded together"},
    ),
    Option(
        "prefetch_partitions",
        "--prefetch-partitions",
        {"type": int, "default": 1, "metavar": "N", "help": "partitions read ahead"},
    ),
    Option(
        "pieces_per_partition",
        "--pieces-per-partition",
        {"type": int, "metavar": "K", "help": "1: whole partitions (default: the pool order); above 1: deprecated"},
    ),
    Option(
        "buffer_bytes",
        "--buffer-bytes",
        {"type": int, "metavar": "N", "help": "the pool order's memory budget per rank (default: 1 GiB)"},
    ),
    Option(
        "nan",
        "--nan",
        {
            "choices": ("raise", "drop"),
            "default": "raise",
            "help": "windows holding NaN: raise an error, or drop them (as WindowDataset's nan=)",
        },
    ),
    Option(
        "on_error",
        "--on-error",
        {
            "choices": ("raise", "skip"),
            "default": "raise",
            "help": "unreadable files: raise an error, or skip them (as WindowDataset's on_error=)",
        },
    ),
    Option(
        "retries",
        "--retries",
        {
            "type": "count",
            "default": 3,
            "metavar": "N",
            "help": "retries of transient storage errors (as WindowDataset's retries=)",
        },
    ),
    Option(
        "partition_bytes",
        "--partition-bytes",
        {
            "type": "size",
            "metavar": "BYTES",
            "help": "split Parquet files with more uncompressed bytes at row groups (default: the loader's, 256MiB)",
        },
        value=_size,
    ),
    _no_flag("layout", "the shape of x only: the figures and counts are the same for NCL and NLC"),
    _no_flag("return_index", "one more int64 tensor per batch: counts and figures do not depend on it"),
    _no_flag("normalize", "scaling of the values, a Python dict or a stats file: Python's WindowDataset takes it"),
    _no_flag("workflow", "a fitted Python object: the fit command fits one, Python's WindowDataset applies it"),
    _no_flag("drop_last", "changes the last batch only; inspect and bench report whole epochs"),
    _no_flag("shuffle", "always on, as in training; counts and figures do not depend on the order"),
    _no_flag("seed", "0; counts and figures do not depend on the order's seed"),
    _no_flag("rank", "the command line runs one process: rank 0 of 1"),
    _no_flag("world_size", "the command line runs one process: rank 0 of 1"),
    _no_flag("device", "batches are gathered on the host; the device path is measured in Python"),
    _no_flag("storage_options", "a dict of fsspec options: credentials come from the environment"),
    _no_flag("partition_rows", "numpy arrays only; the command line reads files"),
    _no_flag("threads", "the loader's default (16) opens local files and object stores well"),
    _no_flag("timeout", "the loader's default (60 s a read): a stalled read fails with its name"),
    _no_flag("strict", "inspect and bench report suspect data as warnings either way"),
    _no_flag("cache_dir", "a local cache across epochs: one command is one pass"),
    _no_flag("cache_bytes", "goes with cache_dir"),
    _no_flag("index", "the dataset index beside a folder is used when there is one (dask-windows index writes it)"),
    _no_flag("next_pass_seconds", "one command is one pass: nothing to read ahead for"),
)

#: The keywords of ``OPTIONS`` by name.
BY_KEYWORD: dict[str, Option] = {option.keyword: option for option in OPTIONS}

#: The dataset's keywords that a flag sets, and the flag (error messages name it).
FLAGS: dict[str, str] = {option.keyword: option.flag for option in OPTIONS if option.flag is not None}


def dataset_keywords(args: argparse.Namespace) -> dict:
    """The ``WindowDataset`` keywords the parsed flags give (those not given are left out)."""
    out = {}
    for option in OPTIONS:
        if option.flag is None or not hasattr(args, option.keyword):
            continue
        value = getattr(args, option.keyword)
        if value is None:
            continue  # the dataset's own default (or, for inspect, the manifest's series)
        out[option.keyword] = option.value(value) if option.value is not None else value
    return out


def check_table() -> list[str]:
    """What the table gets wrong against ``KEYWORDS`` (empty: nothing); the package's tests call it."""
    problems = [
        f"{k}: a WindowDataset keyword without a command-line decision" for k in KEYWORDS if k not in BY_KEYWORD
    ]
    problems += [f"{k}: not a WindowDataset keyword" for k in BY_KEYWORD if k not in KEYWORDS]
    problems += [f"{o.keyword}: no flag and no reason" for o in OPTIONS if o.flag is None and not o.why]
    return problems
