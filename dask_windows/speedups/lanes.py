"""Two lanes: a run of full batches copied on the consumer's thread and on one helper thread at once.

numpy releases the GIL while it copies a fancy index, so two threads can each copy a batch. A run of full
batches is cut into *units* (consecutive batches, one gather into a fresh array of at least
``UNIT_BYTES``); the helper (``Lanes``) copies every odd unit, at most ``AHEAD`` ahead, and each stream
times spans on one lane and on two (``LaneChoice``), keeping the faster. Trade-off: up to three units
alive besides the caller's batches (a kept batch holds its unit, never overwritten), a thread per run;
the bits never depend on the lane. Only with two usable CPUs and torch allowed several threads, by
default for made batches of at least ``LANE_DEFAULT_BATCH_BYTES``; ``DASK_WINDOWS_LANES=1``: any size,
``0``: never (docs/performance.md).
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from dask_windows.runtime.prefetch import GuardedThread
from dask_windows.settings.tuning import LANE_AHEAD_UNITS as AHEAD
from dask_windows.settings.tuning import LANE_DEFAULT_BATCH_BYTES as DEFAULT_BATCH_BYTES
from dask_windows.settings.tuning import LANE_MIN_UNITS as MIN_UNITS
from dask_windows.settings.tuning import LANE_UNIT_BYTES as UNIT_BYTES
from dask_windows.settings.tuning import THREAD_WATCH_SECONDS, switches

__all__ = ["LaneChoice", "Lanes", "lane_batches", "lanes_wanted", "made_batches", "unit_batches", "worth"]

log = logging.getLogger(__name__)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def lanes_wanted(batch_bytes: int, made: bool = True) -> bool:
    """Whether a run of batches of ``batch_bytes`` may be gathered on two lanes.

    ``made``: batches made of several arrays (``made_batches``); ``False``: features alone.
    ``DASK_WINDOWS_LANES=1``: any size, features alone too; ``0``: never; unset: made batches from
    ``LANE_DEFAULT_BATCH_BYTES``. Always only with two usable CPUs and torch allowed several threads.
    """
    asked = switches().lanes
    if asked is False or usable_cpus() < 2:
        return False
    if asked is None and (not made or batch_bytes < DEFAULT_BATCH_BYTES):  # docs/performance.md
        return False
    import torch  # its thread count is the user's say on parallelism (1 in DataLoader workers)

    return torch.get_num_threads() > 1


def unit_batches(size: int, batch_bytes: int) -> int:
    """Batches per unit: enough for ``UNIT_BYTES``, at least one."""
    return max(1, -(-UNIT_BYTES // batch_bytes))


def worth(runs: Any, windows: int, size: int, made: bool = True) -> bool:
    """Whether a run of ``windows`` windows in batches of ``size`` goes on two lanes (``runs``: a ``batch._Runs``;
    ``made``: as ``lanes_wanted``'s)."""
    batch_bytes = size * runs.channels * runs.window * runs.runs.itemsize
    units = windows // size // unit_batches(size, batch_bytes)
    return units >= MIN_UNITS and lanes_wanted(batch_bytes, made)


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_HELPER, _CONSUMER = 1, 0  # who claimed a handed unit (``Lanes._owners``)


def _lane(gather: Callable[[int], Any], tickets: queue.SimpleQueue, results: queue.SimpleQueue, owners: dict) -> None:
    """The helper: gather each unit handed over in ``tickets`` into ``results``, until ``None``.

    A unit the consumer claimed first (``owners``, ``dict.setdefault`` being atomic) is skipped.
    """
    while True:
        u = tickets.get()
        if u is None:
            return
        if owners.setdefault(u, _HELPER) != _HELPER:  # taken back: the consumer gathers it
            del owners[u]
            continue
        try:
            item = gather(u)
        except BaseException as exc:  # relayed to the consumer, never swallowed
            results.put(_Failure(exc))
            return
        results.put(item)
        del item


class Lanes:
    """Units ``0 .. units - 1`` (``gather(u)``, called once per ``u`` from either thread) gathered by the
    consumer and one helper thread named ``name``, taken in order. While ``both`` is set the consumer hands
    the helper every odd unit (at most ``ahead`` not yet taken) and gathers the rest; a handed unit the
    helper has not begun is taken back (one atomic ``dict.setdefault`` each side settles who claimed it).
    """

    def __init__(
        self, gather: Callable[[int], Any], units: int, ahead: int = AHEAD, name: str = "dask-windows-lane"
    ) -> None:
        self._gather, self._units, self._ahead = gather, units, ahead
        self._tickets: queue.SimpleQueue = queue.SimpleQueue()  # units handed to the helper; None: stop
        self._results: queue.SimpleQueue = queue.SimpleQueue()  # the helper's units, in the order handed
        self._handed: collections.deque[int] = collections.deque()  # units handed over, not yet taken
        self._decided = 0  # units below it are the helper's (handed) or the consumer's
        self.both = True  # whether the helper is handed units
        self.limit = units  # units from here on are not handed over (the end of a span on both lanes)
        # Kept here: ``close`` may run while the interpreter exits, when module globals are gone.
        self._finalizing, self._current_thread = sys.is_finalizing, threading.current_thread
        self._owners: dict[int, int] = {}  # handed units claimed by the helper or taken back by the consumer
        args = (gather, self._tickets, self._results, self._owners)
        self._thread = GuardedThread(target=_lane, args=args, name=name, daemon=True)
        self._thread.start()

    def take(self, u: int) -> Any:
        """Unit ``u`` (one past the last taken): from the helper, or gathered here."""
        handed = self._handed
        if self.both:
            while len(handed) < self._ahead:
                v = max(self._decided, u + 1)
                v += 1 - v % 2  # the helper's units are the odd ones
                if v >= self.limit or v >= self._units:
                    break
                self._tickets.put(v)
                handed.append(v)
                self._decided = v + 1
        if handed and handed[0] == u:
            handed.popleft()
            if self._owners.setdefault(u, _CONSUMER) == _HELPER:  # begun there: wait for it
                del self._owners[u]
                item = self._result(u)
                if isinstance(item, _Failure):
                    raise item.exc
                return item
            # Not begun (the helper is busy or waits for a core): gathered here, skipped there.
        self._decided = max(self._decided, u + 1)
        return self._gather(u)

    def _result(self, u: int) -> Any:
        """The helper's next unit (``u``); ``MemoryError`` if the helper ended without it."""
        while True:
            try:
                return self._results.get(timeout=THREAD_WATCH_SECONDS)
            except queue.Empty:
                if self._thread.is_alive() or not self._results.empty():
                    continue
                raise MemoryError(
                    f"the lane thread {self._thread.name!r} ended without unit {u} or an error (it failed where it "
                    "could not report, as when memory runs out); give the process more memory, or set "
                    "DASK_WINDOWS_LANES=0 to gather on one thread"
                ) from None

    def close(self) -> None:
        """Stop the helper after the unit it is copying and join it; nothing it gathered is kept."""
        for u in self._handed:  # units not begun are skipped, so the helper stops after its current one
            self._owners.setdefault(u, _CONSUMER)
        self._tickets.put(None)
        # At exit a daemon thread may already be stopped for good: joining it would never return.
        if self._thread is not self._current_thread() and not self._finalizing():
            self._thread.join()
        self._handed.clear()
        while not self._results.empty():
            self._results.get()


class LaneChoice:
    """Whether a stream's runs use both lanes: a round times ``probes`` units alone, then ``probes`` on both
    lanes (wall clock from the third unit), and keeps the faster for the next ``every`` units; each further
    round lost in a row by both lanes doubles that span (up to ``32 * every``)."""

    def __init__(self, probes: int = 16, every: int = 512) -> None:
        self.probes, self.every = probes, every
        self.both = True
        self._phase = 0  # 0: the alone probe next, 1: the both probe, 2: the winner's span
        self._alone = 0.0  # seconds per unit of the alone probe
        self._lost = 0  # rounds in a row both lanes lost

    def span(self, left: int) -> tuple[bool, int, bool]:
        """The next span of at most ``left`` units: on both lanes or not, its units, whether timed."""
        if self.probes <= 2:  # no rounds: always the current choice
            return self.both, left, False
        if self._phase == 0:
            return False, min(self.probes, left), True
        if self._phase == 1:
            return True, min(self.probes, left), True
        return self.both, min(self.every * self.backoff, left), False

    def give_up(self) -> None:
        """One lane from now on (the helper thread could not start)."""
        self.probes, self.both = 0, False

    def record(self, both: bool, units: int, seconds: float) -> None:
        """Count a span of ``units`` units timed at ``seconds`` (its first two left out)."""
        if self.probes <= 2:
            return
        if self._phase == 2:
            self._phase = 0
            return
        if units <= 2:  # a span cut short by the end of a run: not a measurement
            return
        per_unit = seconds / (units - 2)
        if self._phase == 0:
            self._alone, self._phase = per_unit, 1
        else:
            self.both, self._phase = per_unit < self._alone, 2
            self._lost = 0 if self.both else self._lost + 1

    @property
    def backoff(self) -> int:
        """The winner's span is ``every * backoff`` units: doubled by each round lost in a row after the first, up to 32."""
        return min(2 ** max(self._lost - 1, 0), 32)


def _timed(batches: Iterator[np.ndarray], spent: list[float], skip: int) -> Iterator[np.ndarray]:
    """``batches``; ``spent[0]``: the wall seconds from the ``skip``-th batch taken to the last one taken
    (the caller's work between batches included: a helper slowing the caller counts against the lanes)."""
    for _ in range(skip):
        x = next(batches, None)
        if x is None:
            return
        yield x
    began = time.perf_counter()
    yield from batches
    spent[0] = time.perf_counter() - began


def lane_batches(
    runs: Any,
    run: np.ndarray,
    size: int,
    choice: LaneChoice | None = None,
    ahead: int = AHEAD,
    alone: Callable[[np.ndarray], Iterator[np.ndarray]] | None = None,
) -> Iterator[np.ndarray]:
    """The batches of ``run`` (``len(run)`` a multiple of ``size``) that ``runs`` (a ``batch._Runs``) gathers,
    spans of units on the consumer alone (``alone(part)``, default ``runs.batches``) or on both lanes (one
    index of ``runs.runs`` per unit), as ``choice`` says: the same bits as ``runs.batches(run, size)``."""
    if alone is None:

        def alone(part: np.ndarray) -> Iterator[np.ndarray]:
            return runs.batches(part, size)

    channels, window = runs.channels, runs.window
    shape = (size, channels, window) if runs.offsets is not None else (size, window, channels)
    per = unit_batches(size, size * channels * window * runs.runs.itemsize)
    units = -(-(len(run) // size) // per)

    def gather(u: int) -> np.ndarray:
        part = run[u * per * size : (u + 1) * per * size]
        if runs.offsets is None:
            index = part
        else:
            # (windows, C) -> (windows * C,): each window's runs, channel by channel
            index = (part[:, None] + runs.offsets).reshape(-1)
        return runs.runs[index].reshape(-1, *shape)  # (batches of the unit, *batch shape)

    spans = lambda first, end: alone(run[first * per * size : end * per * size])
    yield from _spans(units, per, gather, spans, choice or LaneChoice(), ahead)


def made_batches(
    make: Callable[[np.ndarray], Any],
    runs: Any,
    run: np.ndarray,
    size: int,
    choice: LaneChoice | None = None,
    ahead: int = AHEAD,
) -> Iterator[Any]:
    """``make(run[a : a + size])`` for each batch of ``run`` (``len(run)`` a multiple of ``size``), in order:
    the units and spans of ``lane_batches(runs, run, size)``, ``make`` called once per batch on the lane
    that takes its unit (from either thread)."""
    per = unit_batches(size, size * runs.channels * runs.window * runs.runs.itemsize)
    units = -(-(len(run) // size) // per)

    def gather(u: int) -> list:
        return [make(run[a : a + size]) for a in range(u * per * size, min((u + 1) * per * size, len(run)), size)]

    def alone(first: int, end: int) -> Iterator[Any]:
        for a in range(first * per * size, min(end * per * size, len(run)), size):
            yield make(run[a : a + size])

    yield from _spans(units, per, gather, alone, choice or LaneChoice(), ahead)


def _spans(
    units: int,
    per: int,
    gather: Callable[[int], Any],
    alone: Callable[[int, int], Iterator[Any]],
    choice: LaneChoice,
    ahead: int,
) -> Iterator[Any]:
    """The items of units ``0 .. units - 1``, ``per`` a unit: spans of units on both lanes (``gather(u)``, a
    sequence of the unit's items, on either thread) or on the consumer alone (``alone(first, end)``), as
    ``choice`` says; the helper thread ends with the spans, however they end."""

    def both_lanes(lanes: Lanes, first: int, end: int) -> Iterator[Any]:
        lanes.limit = end
        for u in range(first, end):
            unit = lanes.take(u)
            for k in range(len(unit)):
                yield unit[k]
            del unit

    lanes: Lanes | None = None
    try:
        u = 0
        while u < units:
            both, span, timed = choice.span(units - u)
            if both and lanes is None:
                try:
                    lanes = Lanes(gather, units, ahead)
                except MemoryError as exc:  # no helper thread (out of memory): this stream gathers on one lane
                    log.warning("gathering on one thread: %s", exc)
                    choice.give_up()
                    both, span, timed = choice.span(units - u)
            if both and lanes is not None:
                batches = both_lanes(lanes, u, u + span)
            else:
                batches = alone(u, u + span)
            if timed:
                spent = [0.0]
                yield from _timed(batches, spent, 2 * per)
                choice.record(both, span, spent[0])
            else:
                yield from batches
                choice.record(both, span, 0.0)
            u += span
    finally:
        if lanes is not None:
            lanes.close()
