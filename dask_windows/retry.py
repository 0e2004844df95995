"""Retrying transient storage errors with capped exponential backoff.

Object stores fail in passing: a connection is reset, a request is throttled
(HTTP 429 / ``SlowDown``), a server answers 5xx. Such a failure is retried a
few times with growing delays; anything else (a missing object, a denied
permission, a corrupt file) is raised at once, because trying again cannot
help and only delays the message the user needs.

The classification walks the exception and its causes and looks at types and
status codes by name, so botocore, aiohttp, gcsfs and adlfs errors are
recognised without importing any of them. The delay of try ``k`` is
``min(max_delay, base_delay * 2**k)`` scaled by a jitter in ``[0.5, 1)`` derived
from the object's name, so ranks retrying the same object do not stampede in
step and a rerun waits the same time (no clock or pid enters it).

The trade-off: a store that is down for longer than the total backoff
(about ``base_delay * 2**retries``) fails the read; raise ``retries`` for flaky
links rather than hiding outages behind unbounded waits.
"""
from __future__ import annotations

import errno
import logging
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from dask_windows.errors import ConfigError

__all__ = ["RetryPolicy", "describe_failure", "error_text", "is_transient", "resolve_retry"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: ``errno`` values of failures that a later attempt may not see.
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


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a storage call is tried.

    Attributes:
        retries: Attempts after the first one (``0`` never retries).
        base_delay: Seconds before the first retry; doubles with each retry.
        max_delay: Cap of one delay, in seconds.
        transient: Predicate deciding whether an exception is worth another try.
    """

    retries: int = 3
    base_delay: float = 0.2
    max_delay: float = 5.0
    transient: Callable[[BaseException], bool] = is_transient

    def __post_init__(self) -> None:
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ConfigError(f"retries={self.retries!r} must be an int >= 0 (0 means no retry)")
        if not self.base_delay >= 0 or not self.max_delay >= 0:
            raise ConfigError(
                f"retry delays must be >= 0 seconds; got base_delay={self.base_delay!r}, max_delay={self.max_delay!r}"
            )

    def delay(self, attempt: int, what: str) -> float:
        """Seconds to wait after failed attempt ``attempt`` (0-based) on object ``what``."""
        jitter = 0.5 + (zlib.crc32(f"{what}#{attempt}".encode()) % 1000) / 2000
        return min(self.max_delay, self.base_delay * 2**attempt) * jitter

    def call(self, fn: Callable[[], T], what: str) -> T:
        """Run ``fn()``, retrying transient failures; the last failure propagates unchanged.

        Args:
            fn: The storage call.
            what: The object it touches, for logs and the backoff jitter.

        Returns:
            What ``fn`` returned.

        Raises:
            Exception: Whatever ``fn`` raised on its last attempt or on a permanent failure;
                ``attempts`` (an int) is set on it when it can be, for the caller's message.
        """
        attempt = 0
        while True:
            try:
                return fn()
            except Exception as exc:
                attempt += 1
                if attempt > self.retries or not self.transient(exc):
                    try:
                        exc.attempts = attempt  # type: ignore[attr-defined]
                    except AttributeError:  # pragma: no cover - exceptions with __slots__
                        pass
                    raise
                wait = self.delay(attempt - 1, what)
                log.warning(
                    "transient error reading %s (try %d of %d): %s: %s; retrying in %.2fs",
                    what,
                    attempt,
                    self.retries + 1,
                    type(exc).__name__,
                    exc,
                    wait,
                )
                time.sleep(wait)


def resolve_retry(retries: int | RetryPolicy | None) -> RetryPolicy:
    """A ``RetryPolicy`` from ``WindowDataset(retries=...)``: an int of retries, a policy, or ``None`` (default)."""
    if retries is None:
        return RetryPolicy()
    if isinstance(retries, RetryPolicy):
        return retries
    if isinstance(retries, bool) or not isinstance(retries, int):
        raise ConfigError(f"retries={retries!r} must be an int >= 0 (retries after the first attempt) or a RetryPolicy")
    return RetryPolicy(retries=retries)


def error_text(exc: BaseException) -> str:
    """``"Type: message"`` of ``exc`` on one line, for messages that quote it."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def describe_failure(exc: BaseException) -> str:
    """``"after N tries"`` when a policy retried ``exc``, else an empty string."""
    attempts = getattr(exc, "attempts", 1)
    return f" after {attempts} tries" if isinstance(attempts, int) and attempts > 1 else ""

