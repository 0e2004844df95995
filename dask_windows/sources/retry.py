"""Retrying transient storage errors with capped exponential backoff.

Object stores fail in passing: a connection is reset, a request is throttled
(HTTP 429 / ``SlowDown``), a server answers 5xx. Such a failure is retried a
few times with growing delays; anything else (a missing object, a denied
permission, a corrupt file) is raised at once, because trying again cannot
help and only delays the message the user needs.

Which errors are transient is decided in one place, ``faults.is_transient``.
The delay of try ``k`` is
``min(max_delay, base_delay * 2**k)`` scaled by a jitter in ``[0.5, 1)`` derived
from the object's name, so ranks retrying the same object do not stampede in
step and a rerun waits the same time (no clock or pid enters it).

The trade-off: a store that is down for longer than the total backoff
(about ``base_delay * 2**retries``) fails the read; raise ``retries`` for flaky
links rather than hiding outages behind unbounded waits.
"""
from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from dask_windows.errors import ConfigError
from dask_windows.faults import is_transient

__all__ = ["RetryPolicy", "resolve_retry"]

log = logging.getLogger(__name__)

T = TypeVar("T")

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
