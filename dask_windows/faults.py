"""What happens to a partition that cannot be read: raise, or skip it and keep the batch count.

``on_error="raise"`` (the default) stops at the first unreadable partition
with a message naming it. ``on_error="skip"`` leaves it out, warns
(``SkippedPartitionWarning``, and an INFO log record) and records it:

* at open, a file whose footer cannot be read is left out of the dataset, and
  a partition whose series column cannot be read gets no windows; the epoch
  plan is then made without them. Every rank opens the dataset itself, so
  only failures every rank sees alike are skipped there (a corrupt or
  truncated file): a transient failure that outlasts the retries raises even
  with ``"skip"``, since ranks that left out different partitions would plan
  different epochs (``opening_skip_allowed``);
* while iterating, the plan is already fixed and every rank must still yield
  exactly ``len(ds)`` batches (or DDP hangs). The missing partition's windows
  are replaced by windows drawn, without replacement while there are enough,
  from the other partitions of the same buffer, with a generator derived
  from the buffer's seed: the same failures give the same batches. When no
  partition of a buffer could be read, its windows are owed to the next
  buffer that can; windows still owed at the end are drawn from the reader's
  last readable partition, read again.

Which failures are transient (worth a retry) is decided here too, by
``is_transient``: it walks the exception and its causes and looks at types
and status codes by name, so botocore, aiohttp, gcsfs and adlfs errors are
recognised without importing any of them.

The trade-off: a replacement window is a repeat of a window already in the
epoch, so a skipped partition slightly over-weights its buffer neighbours
for one epoch instead of shortening one rank's epoch; with
``return_index=True`` the repeats are visible as repeated start rows.
"""
from __future__ import annotations

import errno
import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError, SourceReadError

__all__ = [
    "ON_ERROR",
    "SkippedPartition",
    "SkippedPartitionWarning",
    "check_on_error",
    "describe_failure",
    "error_text",
    "guard_scan",
    "is_transient",
    "opening_skip_allowed",
    "record_skip",
    "replacement_picks",
]

log = logging.getLogger(__name__)

TRANSIENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNRESET",
        "ECONNABORTED",
        "ECONNREFUSED",
        "ETIMEDOUT",
        "EPIPE",
        "EAGAIN",
        "EBUSY",  # s3fs: SlowDown / ServiceUnavailable / 503
        "EREMOTEIO",  # s3fs: InternalError / 500
        "ENETUNREACH",
        "ENETRESET",
        "EHOSTUNREACH",
    )
    if hasattr(errno, name)
)

#: Exception class names (anywhere in the MRO) of connection-level failures.
TRANSIENT_TYPES = frozenset(
    {
        "ConnectionError",  # builtin and botocore.exceptions.ConnectionError
        "TimeoutError",
        "HTTPClientError",  # botocore: ConnectionClosedError, ReadTimeoutError, ...
        "IncompleteReadError",
        "IncompleteRead",
        "ClientConnectionError",  # aiohttp
        "ClientPayloadError",
        "ServerTimeoutError",
        "FSTimeoutError",  # fsspec
        "ResponseParserError",
    }
)

#: Exception class names that are never retried, wherever they appear first.
PERMANENT_TYPES = frozenset(
    {"FileNotFoundError", "PermissionError", "IsADirectoryError", "NotADirectoryError", "ArrowInvalid", "KeyError"}
)

#: Service error codes meaning "slow down" or "try again".
TRANSIENT_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "SlowDown",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "BandwidthLimitExceeded",
    }
)


def _status(exc: BaseException) -> int | None:
    """HTTP status carried by ``exc`` (botocore ``response``, ``status``, ``code``, ``status_code``)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int):
            return status
    for attr in ("status_code", "status", "code"):
        value = getattr(exc, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value < 600:
            return value
    return None


def _classify(exc: BaseException) -> bool | None:
    """``True`` transient, ``False`` permanent, ``None`` unknown, for ``exc`` alone."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & PERMANENT_TYPES:
        return False
    if names & TRANSIENT_TYPES:
        return True
    if isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS:
        return True
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and response.get("Error", {}).get("Code") in TRANSIENT_CODES:
        return True
    status = _status(exc)
    if status is not None:
        return status == 429 or status >= 500
    return None


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a failure a later attempt may not see.

    Connection resets and timeouts, throttling (429, ``SlowDown``) and server
    errors (5xx) are transient; a missing object, a denied permission or a
    corrupt file (``ArrowInvalid``) are not. Causes are followed through
    ``__cause__`` / ``__context__`` because wrappers (s3fs, pyarrow) re-raise
    the store's error as their own.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 16:
        seen.add(id(current))
        verdict = _classify(current)
        if verdict is not None:
            return verdict
        current = current.__cause__ or current.__context__
    return False


def error_text(exc: BaseException) -> str:
    """``"Type: message"`` of ``exc`` on one line, for messages that quote it."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def describe_failure(exc: BaseException) -> str:
    """``"after N tries"`` when a policy retried ``exc``, else an empty string."""
    attempts = getattr(exc, "attempts", 1)
    return f" after {attempts} tries" if isinstance(attempts, int) and attempts > 1 else ""


ON_ERROR = ("raise", "skip")

#: Entropy added to a buffer's seed for drawing replacement windows (keeps its permutation unchanged).
REPLACEMENT_TAG = 0x5C1B


class SkippedPartitionWarning(UserWarning):
    """A partition could not be read and was skipped (``on_error="skip"``)."""


@dataclass(frozen=True)
class SkippedPartition:
    """One partition left out.

    Attributes:
        name: The file or partition.
        stage: ``"open"`` (footer), ``"scan"`` (series column at open) or ``"read"`` (while iterating).
        error: The error, as text.
    """

    name: str
    stage: str
    error: str


def check_on_error(on_error: object) -> str:
    """Validate ``on_error``."""
    if on_error not in ON_ERROR:
        raise ConfigError(f"on_error={on_error!r} must be one of {ON_ERROR}")
    return str(on_error)


def record_skip(skipped: list, name: str, stage: str, error: BaseException) -> SkippedPartition:
    """Warn about a skipped partition and append it to ``skipped``.

    Args:
        skipped: Where skips are counted (``WindowDataset.skipped``).
        name: The file or partition.
        stage: ``"open"``, ``"scan"`` or ``"read"``.
        error: Why it could not be read.

    Returns:
        The record appended.
    """
    cause = error.__cause__ if isinstance(error, SourceReadError) and error.__cause__ is not None else error
    record = SkippedPartition(name, stage, error_text(cause))
    skipped.append(record)
    message = f"skipping {name} (on_error='skip', while {_STAGES[stage]}): {record.error}"
    log.info(message)
    warnings.warn(message, SkippedPartitionWarning, stacklevel=3)
    return record


_STAGES = {"open": "reading footers", "scan": "scanning series runs", "read": "iterating"}


def opening_skip_allowed(on_error: str, error: BaseException) -> bool:
    """Whether a partition failing with ``error`` while the dataset is opened may be skipped.

    Only with ``on_error="skip"`` and only for failures that every rank sees alike: a
    transient error (see ``retry.is_transient``) may hit one rank and not another.
    """
    cause = error.__cause__ if isinstance(error, SourceReadError) and error.__cause__ is not None else error
    return on_error == "skip" and not is_transient(cause)


def replacement_picks(available: int, needed: int, rng: np.random.Generator) -> np.ndarray:
    """Which of ``available`` windows stand in for ``needed`` lost ones.

    Distinct picks while ``needed <= available``; beyond that, whole rounds of all
    windows plus a distinct remainder, so no window repeats more often than needed.

    Args:
        available: Windows that could be read.
        needed: Windows lost.
        rng: Generator derived from the buffer's seed.

    Returns:
        ``(needed,)`` int64 indices into the available windows.
    """
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
    """The open-time scan callables of ``index.scan_runs``, skipping unreadable partitions.

    A partition whose series column (or, with ``nan="drop"``, feature columns) cannot be
    read gets no runs, hence no windows; it keeps its place and row count, so the global
    rows of the others do not move. Each skip is recorded in ``skipped``.

    Args:
        read_runs: ``i -> (starts, lengths, keys)``.
        read_bad_rows: ``i -> rows no window may hold``, or ``None``.
        partitions: The source's partitions (for names and row counts).
        skipped: Where skips are recorded.
    """
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
