"""What happens to a partition that cannot be read: raise, or skip it and keep the batch count.

``on_error="raise"`` stops at the first unreadable partition, naming it. ``on_error="skip"`` leaves
it out, warns (``SkippedPartitionWarning`` and an INFO record) and records it. At open only what
every rank sees alike (corrupt or missing data) is skipped, since ranks that skipped different
partitions would plan different epochs (``opening_skip_allowed``); while iterating, the lost windows
are replaced by windows of the same buffer drawn from its seed (``replacement_picks``), so every rank
still yields ``len(ds)`` batches, at the cost of repeating a window. ``failures.classify`` sorts
every failure once."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError, SourceReadError
from dask_windows.errors.failures import (
    FAILURE_KINDS,
    classify,
    describe_failure,
    error_text,
    failure_message,
    is_transient,
    is_unreachable,
)

__all__ = [
    "FAILURE_KINDS",
    "ON_ERROR",
    "SkippedPartition",
    "SkippedPartitionWarning",
    "check_on_error",
    "classify",
    "describe_failure",
    "error_text",
    "failure_message",
    "guard_scan",
    "is_transient",
    "is_unreachable",
    "opening_skip_allowed",
    "record_skip",
    "replacement_picks",
    "skip_allowed",
]

log = logging.getLogger(__name__)


def skip_allowed(on_error: str, error: BaseException, opening: bool = False) -> bool:
    """Whether ``on_error="skip"`` may leave out a partition failing with ``error``: corrupt or missing data
    always, a transient failure that outlasted the retries only while iterating (not ``opening``), a
    resource or permission error never (the data is fine, the machine or the access is not)."""
    if on_error != "skip":
        return False
    kind = getattr(error, "kind", None)
    kind = kind if kind in FAILURE_KINDS else classify(_cause(error))
    return kind in ("corrupt", "missing") or (kind == "transient" and not opening)


ON_ERROR = ("raise", "skip")

#: Entropy added to a buffer's seed for drawing replacement windows (keeps its permutation unchanged).
REPLACEMENT_TAG = 0x5C1B


class SkippedPartitionWarning(UserWarning):
    """A partition could not be read and was skipped (``on_error="skip"``)."""


@dataclass(frozen=True)
class SkippedPartition:
    """One partition left out: ``name`` (file or partition), ``stage`` (``"open"``: footer, ``"scan"``: series
    column at open, ``"read"``: while iterating) and the ``error`` as text."""

    name: str
    stage: str
    error: str


def check_on_error(on_error: object) -> str:
    """Validate ``on_error``."""
    if on_error not in ON_ERROR:
        raise ConfigError(f"on_error={on_error!r} must be one of {ON_ERROR}")
    return str(on_error)


def record_skip(skipped: list, name: str, stage: str, error: BaseException) -> SkippedPartition:
    """Warn about partition ``name`` skipped at ``stage`` and append its record to ``skipped``; return the record."""
    where = getattr(error, "where", "")  # the damaged column chunk, where the source could tell
    record = SkippedPartition(name, stage, error_text(_cause(error)) + (f"; {where}" if where else ""))
    skipped.append(record)
    message = f"skipping {name} (on_error='skip', while {_STAGES[stage]}): {record.error}"
    log.info(message)
    warnings.warn(message, SkippedPartitionWarning, stacklevel=3)
    return record


_STAGES = {"open": "reading footers", "scan": "scanning series runs", "read": "iterating"}


def _cause(error: BaseException) -> BaseException:
    """The error a ``SourceReadError`` wraps, else ``error``."""
    return error.__cause__ if isinstance(error, SourceReadError) and error.__cause__ is not None else error


def opening_skip_allowed(on_error: str, error: BaseException) -> bool:
    """Whether a partition failing with ``error`` while the dataset is opened may be skipped (``skip_allowed``)."""
    return skip_allowed(on_error, error, opening=True)


def replacement_picks(available: int, needed: int, rng: np.random.Generator) -> np.ndarray:
    """``(needed,)`` int64 indices of the ``available`` windows standing in for ``needed`` lost ones: distinct
    while ``needed <= available``, else whole rounds of all windows plus a distinct remainder."""
    if needed <= 0:
        return np.zeros(0, np.int64)
    if available <= 0:
        raise ValueError("no window is available to replace lost ones")
    rounds, rest = divmod(needed, available)
    picks = [np.tile(np.arange(available, dtype=np.int64), rounds), rng.permutation(available)[:rest]]
    return np.concatenate(picks).astype(np.int64)


def guard_scan(
    read_runs: Callable[[int], tuple],
    read_bad_rows: Callable[[int], np.ndarray] | None,
    partitions: Sequence[Any],
    skipped: list,
) -> tuple[Callable[[int], tuple], Callable[[int], np.ndarray] | None]:
    """``index.scan_runs``'s callables, skipping unreadable partitions (recorded in ``skipped``): one keeps its
    place and rows but gets no runs, so the global rows of the others do not move."""
    failed: set[int] = set()
    empty = np.zeros(0, np.int64)

    def guarded_runs(i: int) -> tuple:
        try:
            return read_runs(i)
        except SourceReadError as exc:
            if not opening_skip_allowed("skip", exc):
                raise
            failed.add(i)
            record_skip(skipped, partitions[i].name, "scan", exc)
            return empty, empty, empty

    def guarded_bad_rows(i: int) -> np.ndarray:
        if i in failed:
            return empty
        try:
            return read_bad_rows(i)  # type: ignore[misc]
        except SourceReadError as exc:
            if not opening_skip_allowed("skip", exc):
                raise
            record_skip(skipped, partitions[i].name, "scan", exc)
            return np.arange(partitions[i].num_rows, dtype=np.int64)

    return guarded_runs, None if read_bad_rows is None else guarded_bad_rows
