"""The next pass's first units, read while this pass's last step is drained.

A pass waits for its fill (``PoolPlan.fill``) before its first batch, while the reader idles as the
consumer drains the last step. So on that step (``pipeline.stream``'s ``last``), ``begin`` plans the
likely next pass (the epoch ``set_epoch`` chose, else the next; same reader; nothing skipped) and reads
its first units into that pass's own pool arrays (``runtime.pool.UnitReads``). The next ``iter()``
``claim``s them when its plan and key match, else they are dropped; batches are the same either way.

Released (thread joined at most ``JOIN_SECONDS``) by ``close()``, ``set_epoch`` to another epoch,
``load_state_dict``, the dataset's collection, a fork, a plan that differs, and ``next_pass_seconds``
after the pass ends unclaimed. Off with ``next_pass_seconds=0``, ``prefetch_partitions=0``,
``on_error="skip"``, a device feed, elastic resumes and a DataLoader worker's first pass. Local files
are checked again (``Source.unchanged``) before use; an error while reading ahead is never raised here.
Trade-off: a sooner first batch for memory the pass already had; a mispredicted pass wastes its reads.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dask_windows.planning.pool import PoolPlan
from dask_windows.planning.world import World
from dask_windows.runtime.detect import in_worker
from dask_windows.runtime.pool import UnitReads
from dask_windows.runtime.prefetch import GuardedThread
from dask_windows.settings.tuning import NEXT_PASS_JOIN_SECONDS as JOIN_SECONDS
from dask_windows.settings.tuning import NEXT_PASS_SECONDS

if TYPE_CHECKING:
    from dask_windows.runtime.values import PassValues

__all__ = [
    "JOIN_SECONDS",
    "NEXT_PASS_SECONDS",
    "NextPass",
    "Slot",
    "begin",
    "claim",
    "keep_only",
    "planned",
    "release",
    "release_all",
    "wanted",
]

log = logging.getLogger(__name__)

_LIVE: weakref.WeakSet[_NextPass] = weakref.WeakSet()  # read-aheads not yet taken or released


class _NextPass:
    """One pass's first units, read ahead of its ``iter()``; taken once or released once."""

    def __init__(self, slot: Slot, key: tuple, plan: PoolPlan, reads: UnitReads, seconds: float) -> None:
        self.pid = os.getpid()  # a forked DataLoader worker inherits the attribute, not the threads
        self.key, self.plan, self.seconds = key, plan, seconds
        self.reads: UnitReads | None = reads
        self.done = threading.Event()  # taken or released: the timer stops waiting
        self._lock = threading.Lock()
        self._timer: threading.Thread | None = None
        # Released when its slot goes, that is with the dataset that owns the slot (the slot is watched
        # weakly: the threads hold neither the slot nor the dataset, which can be collected).
        self._finalizer = weakref.finalize(slot, self.release)
        self._finalizer.atexit = False  # at exit the threads are stopped by prefetch's atexit hook
        _LIVE.add(self)

    def take(self) -> bool:
        """Own it (once, from any thread); ``False`` when it was taken or released already, or in a
        forked process (a copy: the threads and locks are the parent's)."""
        if self.pid != os.getpid():
            return False
        with self._lock:
            if self.done.is_set():
                return False
            self.done.set()
        self._finalizer.detach()
        return True

    def release(self) -> None:
        """Stop and join its threads (bounded) and drop its buffers, unless it was taken."""
        if self.take():
            self.shutdown()

    def shutdown(self) -> None:
        """After ``take``: stop the reader, join it at most ``JOIN_SECONDS``."""
        reads, self.reads = self.reads, None
        if reads is not None:
            reads.reader.close(timeout=JOIN_SECONDS)
            reads.source_reader.close()
        timer = self._timer
        if timer is not None and timer is not threading.current_thread():
            timer.join(JOIN_SECONDS)

    def arm(self) -> None:
        """Start counting ``seconds``: released then if nothing took it (a named daemon thread waits)."""
        if self._timer is not None or self.done.is_set():
            return
        timer = GuardedThread(target=_expire, args=(self,), name="dask-windows-next-pass", daemon=True)
        try:
            timer.start()
        except MemoryError:  # no timer would release it (out of memory): let it go now, the pass reads again
            log.debug("the next pass's timer could not start: its first units are released", exc_info=True)
            self.release()
            return
        self._timer = timer

    def failed(self) -> bool:
        """Whether the read ahead raised (the exception waits in the reader's results)."""
        return bool(self.reads is not None and self.reads.reader.failed)

    def partitions_read(self) -> list[int]:
        """Partitions whose units the reader has begun to read."""
        return [] if self.reads is None else self.reads.partitions_read()


class Slot:
    """Where a dataset keeps its next pass read ahead, and who owns it: one per dataset object (a split, a
    worker's unpickled copy get their own; pickled empty), so a copy never claims or releases another's.
    A forked process inherits the slot but not the threads (each read-ahead is guarded by its pid); the
    read-ahead is released when the slot is collected (watched weakly, never kept alive)."""

    __slots__ = ("__weakref__", "pending")

    def __init__(self) -> None:
        self.pending: _NextPass | None = None

    def take(self) -> _NextPass | None:
        """The read-ahead, no longer held here (``None``: none)."""
        pending, self.pending = self.pending, None
        return pending

    def __reduce__(self) -> Any:
        return Slot, ()


@dataclass(frozen=True, eq=False)
class NextPass:
    """The hook a pass of the pool order calls (``PassValues.next_pass``), built by ``WindowDataset._next_pass``:
    ``claim`` this pass's first units if read ahead, ``wanted`` / ``begin`` the next pass's. It holds the
    dataset's ``slot``, ``spec``, ``source``, ``grid``, ``normalize`` and ``row_offsets`` as values, and as
    callables ``epoch`` (now: the next pass's when ``set_epoch`` chose it), ``worker_passes`` (passes over
    this copy in one DataLoader worker), ``plan(world, skip_batches, epoch)`` and ``pass_values``; never
    the dataset's members."""

    slot: Slot
    spec: Any
    source: Any
    grid: Any
    normalize: Any
    row_offsets: Any
    epoch: Callable[[], int]
    worker_passes: Callable[[], int]
    plan: Callable[[World, int, int], PoolPlan]
    pass_values: Callable[[], PassValues]

    def claim(self, plan: PoolPlan, this_pass: tuple) -> UnitReads | None:
        return claim(self, plan, this_pass)

    def wanted(self, reads: UnitReads, plan: PoolPlan) -> bool:
        return wanted(self, reads, plan)

    def begin(self, epoch: int, world: World) -> _NextPass | None:
        return begin(self, epoch, world)


def _expire(pending: _NextPass) -> None:
    if not pending.done.wait(pending.seconds):
        log.debug("the next pass's first units were not claimed within %.0f s: released", pending.seconds)
        pending.release()


def _key(ahead: NextPass, epoch: int, world: World) -> tuple:
    """What a pass's buffers depend on besides its plan: compared by value, then by identity."""
    return (epoch, world, ahead.spec), (ahead.grid, ahead.source, ahead.normalize, ahead.row_offsets)


def _same(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and len(a[1]) == len(b[1]) and all(x is y for x, y in zip(a[1], b[1]))


def wanted(ahead: NextPass, reads: UnitReads, plan: PoolPlan) -> bool:
    """Whether the pass of ``plan``, served by ``reads``, reads the next pass's first units ahead: not with a
    device feed, without a reader thread, with ``on_error="skip"``, nor in a DataLoader worker's first pass."""
    spec = ahead.spec
    if spec.next_pass_seconds <= 0 or spec.on_error != "raise" or not reads.background or reads.device is not None:
        return False
    return not in_worker() or ahead.worker_passes() >= 2


def begin(ahead: NextPass, epoch: int, world: World) -> _NextPass | None:
    """Start reading the first units of ``world``'s pass after ``epoch``'s (over the epoch ``set_epoch``
    chose meanwhile, else ``epoch + 1``), on the consumer's thread. Returns the read-ahead (``arm`` it
    when this pass ends) or ``None``; never raises: what goes wrong is left for the pass to meet."""
    opened: UnitReads | None = None  # closed if starting fails
    try:
        release(ahead.slot)  # an earlier one no pass took
        pinned = ahead.epoch()  # this pass's epoch, or the one set_epoch chose since it began
        epoch = pinned if pinned != epoch else epoch + 1
        plan = ahead.plan(world, 0, epoch)
        values = ahead.pass_values()  # (the threads hold these values, not the dataset)
        if plan.num_windows <= 0 or values.device is not None or not values.reads.spec.prefetch_partitions:
            return None
        # its first units (its fill), into the next pass's own pool arrays
        opened = UnitReads(values, plan, first_units=plan.fill or plan.spread)
    except Exception:  # the pass reads it again and raises then, if it still fails
        log.debug("reading the next pass's first units ahead failed; the pass will read them", exc_info=True)
        if opened is not None:
            opened.close()
        return None
    pending = _NextPass(ahead.slot, _key(ahead, epoch, world), plan, opened, ahead.spec.next_pass_seconds)
    ahead.slot.pending = pending
    return pending


def planned(ahead: NextPass, epoch: int, world: World, skip: int) -> PoolPlan | None:
    """The plan the read-ahead was started from, when it is the plan of this pass (``skip`` batches
    skipped, none for a read-ahead); else ``None``. Plans are pure: the same key, the same plan."""
    pending = ahead.slot.pending
    if not isinstance(pending, _NextPass) or skip or pending.pid != os.getpid():
        return None
    return pending.plan if _same(pending.key, _key(ahead, epoch, world)) else None


def claim(ahead: NextPass, plan: PoolPlan, this_pass: tuple) -> UnitReads | None:
    """The reads of ``plan`` started ahead for the pass ``this_pass`` (``(epoch, World)``) of ``ahead``'s
    dataset, or ``None`` (what was read is dropped)."""
    pending = ahead.slot.take()
    if not isinstance(pending, _NextPass):
        return None
    if pending.pid != os.getpid():
        return None  # a forked process's copy: the threads are the parent's
    if not pending.take():
        return None  # released meanwhile (timer)
    reads = pending.reads
    same = _same(pending.key, _key(ahead, *this_pass)) and (pending.plan is plan or pending.plan == plan)
    if not same or reads is None or pending.failed() or not _unchanged(ahead, pending):
        pending.shutdown()
        return None
    pending.reads = None
    return reads


def _unchanged(ahead: NextPass, pending: _NextPass) -> bool:
    """Whether the files read ahead are still those the dataset opened (``Source.unchanged``)."""
    check = getattr(ahead.source, "unchanged", None)
    return check is None or bool(check(pending.partitions_read()))


def keep_only(slot: Slot, epoch: int) -> None:
    """Release the read-ahead kept in ``slot`` unless it is for a pass over ``epoch`` (``set_epoch``)."""
    pending = slot.pending
    if isinstance(pending, _NextPass) and pending.key[0][0] != epoch:
        release(slot)


def release(slot: Slot) -> None:
    """Stop the read-ahead kept in ``slot``, if any, and drop its buffers (``close``, ``load_state_dict``)."""
    pending = slot.take()
    if isinstance(pending, _NextPass) and pending.pid == os.getpid():
        pending.release()


def release_all() -> None:
    """Release every read-ahead of this process: before a fork, and between tests."""
    for pending in list(_LIVE):
        if pending.pid == os.getpid():
            pending.release()


# A process forked (DataLoader workers started by fork after a pass in this process) while a reader
# is inside pyarrow would inherit its locks held; so no read-ahead thread runs at a fork.
os.register_at_fork(before=release_all)
