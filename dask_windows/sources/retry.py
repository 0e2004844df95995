"""Retrying transient storage errors with capped exponential backoff, under a deadline.

Which errors are transient is decided by ``faults.is_transient``; anything else raises at once.
The delay of try ``k`` is ``min(max_delay, base_delay * 2**k)`` times a jitter in ``[0.5, 1)``
derived from the object's name (no clock or pid). With a ``timeout`` each attempt runs on a
helper thread waited on for the time left, so a stalled endpoint ends in ``DeadlineExceeded``;
local files are read without it. The trade-off: a store down for longer than the total backoff
fails the read; raise ``retries`` rather than waiting without bound."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from dask_windows.errors import ConfigError
from dask_windows.errors.faults import is_transient, is_unreachable
from dask_windows.runtime.prefetch import GuardedThread
from dask_windows.settings.tuning import DEFAULT_TIMEOUT, RETRIES, RETRY_BASE_DELAY, RETRY_MAX_DELAY

__all__ = ["DEFAULT_TIMEOUT", "DeadlineExceeded", "RetryPolicy", "resolve_retry", "with_deadline"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class DeadlineExceeded(TimeoutError):
    """A storage call (with its retries) did not finish within its ``timeout``."""


def _bounded(fn: Callable[[], T], seconds: float, what: str) -> T:
    """``fn()`` on a helper thread, waited on for at most ``seconds``; ``DeadlineExceeded`` past it."""
    box: dict = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc
        finally:
            done.set()

    GuardedThread(target=run, name="dask_windows-deadline", daemon=True).start()
    if not done.wait(max(seconds, 0.0)):
        raise DeadlineExceeded(
            f"no answer from the store for {what} within the deadline ({seconds:.3g} s left of timeout=)"
        )
    if "error" in box:
        raise box["error"]
    return box["value"]


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a storage call is tried: ``retries`` after the first attempt, the
    first delay ``base_delay`` doubling up to ``max_delay`` seconds, the ``transient`` predicate, and
    the ``timeout`` of one call in seconds, retries included (``None``: no deadline)."""

    retries: int = RETRIES
    base_delay: float = RETRY_BASE_DELAY
    max_delay: float = RETRY_MAX_DELAY
    transient: Callable[[BaseException], bool] = is_transient
    timeout: float | None = None

    def __post_init__(self) -> None:
        if self.timeout is not None and (isinstance(self.timeout, bool) or not self.timeout > 0):
            raise ConfigError(f"timeout={self.timeout!r} must be a number of seconds > 0 (or None: no deadline)")
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

    @property
    def open_timeout(self) -> float | None:
        """Deadline of one call made while opening a dataset (listing, footers): twice ``timeout``."""
        return None if self.timeout is None else 2 * self.timeout

    def unbounded(self) -> RetryPolicy:
        """This policy without a deadline (local files)."""
        return self if self.timeout is None else replace(self, timeout=None)

    def call(self, fn: Callable[[], T], what: str, timeout: float | None = None) -> T:
        """Run ``fn()`` (a storage call on object ``what``), retrying transient failures, within ``timeout``
        (default ``self.timeout``; past it ``DeadlineExceeded``, no retry). The last failure propagates
        unchanged, with ``attempts`` set on it when it can be."""
        attempt = 0
        seconds = self.timeout if timeout is None else timeout
        deadline = None if seconds is None else time.monotonic() + seconds
        while True:
            try:
                return fn() if deadline is None else _bounded(fn, deadline - time.monotonic(), what)
            except Exception as exc:
                attempt += 1
                late = isinstance(exc, DeadlineExceeded) or (deadline is not None and time.monotonic() >= deadline)
                # a connection refused was already retried by the client (botocore, s3fs): report it now
                if attempt > self.retries or late or not self.transient(exc) or is_unreachable(exc):
                    with contextlib.suppress(AttributeError):  # exceptions with __slots__
                        exc.attempts = attempt  # type: ignore[attr-defined]
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
                time.sleep(wait if deadline is None else max(0.0, min(wait, deadline - time.monotonic())))


def resolve_retry(retries: int | RetryPolicy | None) -> RetryPolicy:
    """A ``RetryPolicy`` from ``WindowDataset(retries=...)``: an int of retries, a policy, or ``None`` (default)."""
    if retries is None:
        return RetryPolicy()
    if isinstance(retries, RetryPolicy):
        return retries
    if isinstance(retries, bool) or not isinstance(retries, int):
        raise ConfigError(f"retries={retries!r} must be an int >= 0 (retries after the first attempt) or a RetryPolicy")
    return RetryPolicy(retries=retries)


def with_deadline(policy: RetryPolicy, timeout: float | None) -> RetryPolicy:
    """``policy`` with ``WindowDataset(timeout=...)``: the given seconds, the policy's own, or ``DEFAULT_TIMEOUT``."""
    if isinstance(timeout, bool) or (timeout is not None and not isinstance(timeout, (int, float))):
        raise ConfigError(f"timeout={timeout!r} must be a number of seconds > 0")
    if timeout is None:
        timeout = policy.timeout if policy.timeout is not None else DEFAULT_TIMEOUT
    return RetryPolicy(policy.retries, policy.base_delay, policy.max_delay, policy.transient, float(timeout))
