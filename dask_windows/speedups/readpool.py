"""Reading and decoding in worker processes while this process gathers batches (``read_workers``).

``ReadPool(read, num_workers)`` starts ``num_workers`` processes once; each
receives ``read`` (a ``_ReadBuffer`` over the pass's ``runtime.values.ReadValues``,
never the dataset) once, then runs ``read(key)`` for every key submitted to it
and sends the result back. ``PoolReads`` is the read backend seam
(``runtime.seams``) the dataset wires for ``read_workers``; ``BufferReads`` is
what a pass reads from: a whole buffer per task, decoded by one worker (its
units on two reader threads) into one array of the buffer's rows, so the hand-off is one array per
buffer (tens of MB, once) and the builder has nothing to join.

Why not the usual ``DataLoader(ds, num_workers=W)``: there every worker
gathers its own batches and each batch crosses to this process (a copy per
batch, see ``slots``). For windows, where the gather is a memcpy-speed
operation, moving decoded rows once and gathering here costs less.

Sharing (``handoff``): a worker decodes into arrays allocated in shared
memory and sends their file descriptors inside the result message, so nothing
is ever named in ``/dev/shm`` and no byte is copied for the hand-off in the
worker; each object of a result travels once.

Lifetime: one pool per ``PoolReads`` (one per dataset object), started lazily
by its first pass and kept for later passes, epochs and concurrent iterators
(tasks are independent tickets); closed by ``WindowDataset.close()``, when the
backend (with its dataset) is collected, or at exit. A dead worker fails the tasks it held with a
``RuntimeError`` naming it (never a hang); the next pass starts a new pool.

The trade-off: the gather stays on this process's thread, so workers help when
reading/decoding is the bottleneck (compressed files, object stores) and at
best keep up at stride 1 from the page cache. Each pass reads its first
buffer here (reader threads, as with ``read_workers=0``) while the pool starts
or warms, so the first batch does not wait for them; later buffers go to the workers,
``read_workers`` buffers ahead, so memory holds up to ``read_workers + 2``
buffers (docs/memory.md). Workers start by ``forkserver`` (forking a process
that runs pyarrow or fsspec threads can deadlock), so a script needs the
``if __name__ == "__main__":`` guard; each runs one torch and one Arrow thread.
"""

from __future__ import annotations

import atexit
import itertools
import multiprocessing
import os
import pickle
import signal
import socket
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection, wait
from types import SimpleNamespace
from typing import Any

import torch

from dask_windows.faults import SkippedPartitionWarning
from dask_windows.runtime.detect import in_worker
from dask_windows.runtime.prefetch import GuardedThread, PrefetchClosed, Prefetcher
from dask_windows.runtime.reading import READ_THREADS, BufferArena, read_unit
from dask_windows.runtime.values import ReadValues
from dask_windows.sources import PartitionReader
from dask_windows.speedups.handoff import pack, recv, release, send, shared_empty, unlink_leftovers, unpack
from dask_windows.speedups.main_guard import check_main_guard
from dask_windows.workerwatch import (
    READ_DEADLINE_SECONDS,
    ReadWorkerStalled,
    stalled_message,
    watch_training_process,
)

__all__ = ["BufferReads", "PoolReads", "ReadPool", "close_pool", "pool_for"]

_PRELOAD = ["numpy", "pyarrow.parquet", "torch", "dask_windows.runtime.values", "dask_windows.speedups.readpool"]


# -- the pool ---------------------------------------------------------------------------------------


def _work(blob: bytes, tasks: Connection, results: socket.socket, training_pid: int | None = None) -> None:
    """A worker's loop: ``(ticket, key)`` in, ``(ticket, ok, value)`` out, until ``None`` or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the training process, which closes us
    watch_training_process(training_pid)  # a forkserver child: ends with the training process (workerwatch)
    read = pickle.loads(blob)
    torch.set_num_threads(1)
    try:
        import pyarrow

        pyarrow.set_cpu_count(1)
    except ImportError:  # pragma: no cover - pyarrow is a dependency
        pass
    send(results, (None, True, os.getpid()), [])  # ready
    while True:
        try:
            task = tasks.recv()
        except EOFError:
            return
        if task is None:
            return
        ticket, key = task
        fds: list[int] = []
        try:
            try:
                message = (ticket, True, pack(read(key), {}, fds))
            except Exception as exc:  # re-raised as itself in the consumer
                message, fds = (ticket, False, exc), []
            try:
                send(results, message, fds)
            except (pickle.PicklingError, TypeError, AttributeError, ValueError) as exc:  # its text travels
                send(results, (ticket, False, RuntimeError(f"{type(exc).__name__}: {exc}")), [])
        finally:
            release()  # this process's references end here; the message holds the memory


class _Ticket:
    """One submitted key: its result, or the exception to raise, once ``done``."""

    __slots__ = ("done", "error", "value", "worker")

    def __init__(self, worker: int) -> None:
        self.worker = worker
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None


class ReadPool:
    """``num_workers`` processes running ``read(key)`` for submitted keys; results shared as tensors.

    Args:
        read: A picklable callable, sent to each worker once when it starts.
        num_workers: Worker processes (>= 1).
        multiprocessing_context: How workers start (``"forkserver"``, ``"spawn"`` or ``"fork"``).
    """

    def __init__(
        self, read: Callable[[Any], Any], num_workers: int, multiprocessing_context: str | None = "forkserver"
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers={num_workers} must be >= 1 for a ReadPool; use Prefetcher for 0")
        check_main_guard(multiprocessing_context)  # a worker would run an unguarded script again
        context = multiprocessing.get_context(multiprocessing_context)
        if multiprocessing_context == "forkserver":
            context.set_forkserver_preload(_PRELOAD)  # imported once by the server, forked ready
        self.pid = os.getpid()
        self.changed = threading.Condition()  # tickets done, workers ready or gone
        self._heard = [time.monotonic()] * num_workers  # when each worker last sent anything (read_deadline)
        self.workers_ready: set[int] = set()
        self.broken: str | None = None
        self._tickets: dict[int, _Ticket] = {}
        self._numbers = itertools.count()
        self.submitted = 0  # keys submitted in all
        self._load = [0] * num_workers  # tickets in flight per worker
        pipes = [(*context.Pipe(duplex=False), *socket.socketpair()) for _ in range(num_workers)]
        self._tasks: list[Connection] = [task_w for _, task_w, _, _ in pipes]
        self._results: list[socket.socket] = [result_r for _, _, result_r, _ in pipes]
        self.processes: list[Any] = [None] * num_workers
        # Started on a thread: the first start waits for the forkserver to import torch and pyarrow
        # (seconds), while this process reads its first buffer itself.
        # ``read`` travels pickled: neither the thread nor the Process objects keep the dataset alive.
        blob = pickle.dumps(read, protocol=pickle.HIGHEST_PROTOCOL)
        self._thread = GuardedThread(
            target=self._run, args=(context, blob, pipes), name="dask-windows-readpool", daemon=True
        )
        self._thread.start()

    @property
    def ready(self) -> bool:
        """Whether a worker has started and waits for keys."""
        return bool(self.workers_ready)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until every worker has started (or the pool broke); whether they all did."""
        with self.changed:
            self.changed.wait_for(lambda: len(self.workers_ready) == len(self._load) or self.broken, timeout)
            return len(self.workers_ready) == len(self._load)

    def submit(self, key: Any) -> int:
        """Send ``key`` to the least busy started worker; returns its ticket for ``result``."""
        with self.changed:
            if self.broken:
                raise RuntimeError(self.broken)
            choice = sorted(self.workers_ready) or range(len(self._load))
            worker = min(choice, key=self._load.__getitem__)
            number = next(self._numbers)
            self._tickets[number] = _Ticket(worker)
            self._load[worker] += 1
            self.submitted += 1
            try:
                self._tasks[worker].send((number, key))
            except OSError:  # it died before its exit was seen (``_gone`` follows): the read fails as there
                proc = self.processes[worker]
                name = f"{proc.name} (pid {proc.pid})" if proc is not None else f"number {worker}"
                self._tickets[number].done = True
                self._tickets[number].error = RuntimeError(
                    f"read worker {name} exited unexpectedly before it took a read "
                    "(killed, out of memory, or crashed in native code); the next pass starts new read "
                    "workers, or use read_workers=0 to read in this process"
                )
        return number

    def result(self, number: int, cancelled: threading.Event | None = None, deadline: float | None = None) -> Any:
        """Wait for ticket ``number``; its value, or its exception raised here.

        Args:
            number: The ticket.
            cancelled: Set to stop waiting (see ``wake``).
            deadline: Seconds the worker holding the ticket may send nothing while this waits;
                past it the worker is killed and ``ReadWorkerStalled`` raised. ``None``: no deadline.

        Raises:
            PrefetchClosed: ``cancelled`` was set while waiting (see ``wake``).
            ReadWorkerStalled: The worker holding the ticket sent nothing for ``deadline`` seconds.
            RuntimeError: The worker holding the ticket died, or the pool was closed.
        """
        waiting_since = time.monotonic()
        with self.changed:
            ticket = self._tickets[number]
            while not ticket.done and not (cancelled is not None and cancelled.is_set()):
                if deadline is None:
                    self.changed.wait()
                    continue
                left = max(waiting_since, self._heard[ticket.worker]) + deadline - time.monotonic()
                if left <= 0:
                    self._stalled(ticket.worker, deadline)
                    break
                self.changed.wait(left)
            if not ticket.done:
                raise PrefetchClosed("the read was cancelled while waiting for a read worker")
            del self._tickets[number]
        if ticket.error is not None:
            raise ticket.error
        payload, fds = ticket.value
        try:
            return unpack(payload, {}, fds)
        finally:
            for fd in fds:
                os.close(fd)

    def discard(self, number: int) -> None:
        """Forget a ticket whose result is no longer wanted (dropped now, or when it arrives)."""
        with self.changed:
            ticket = self._tickets.get(number)
            if ticket is not None and ticket.done:
                del self._tickets[number]
                for fd in ticket.value[1] if ticket.value is not None else ():
                    os.close(fd)
            elif ticket is not None:
                ticket.value = _DISCARD

    def wake(self) -> None:
        """Wake every ``result`` waiting, so that those whose ``cancelled`` is set return."""
        with self.changed:
            self.changed.notify_all()

    def _run(self, context: Any, blob: bytes, pipes: list[tuple]) -> None:
        """The pool's thread: start the workers, then receive results and deaths until all are gone."""
        live: dict[int, socket.socket] = {}
        for i, (task_r, _, result_r, result_w) in enumerate(pipes):
            with self.changed:
                if self.broken:
                    break
            proc = context.Process(
                target=_work, args=(blob, task_r, result_w, self.pid), name=f"dask-windows-read-{i}", daemon=True
            )
            try:
                proc.start()
            except Exception as exc:  # the dataset could not be sent, or no process could start
                with self.changed:
                    self.broken = self.broken or f"read workers could not start: {type(exc).__name__}: {exc}"
                    self._fail(lambda ticket: True)
                break
            finally:
                task_r.close()
                result_w.close()
            with self.changed:
                self.processes[i] = proc
            live[i] = result_r
        del pipes
        owner = {sock.fileno(): i for i, sock in live.items()}
        sentinels = {proc.sentinel: i for i, proc in enumerate(self.processes) if proc is not None}
        while live:
            for ready in wait([*live.values(), *(s for s, i in sentinels.items() if i in live)]):
                i = sentinels[ready] if isinstance(ready, int) else owner[ready.fileno()]  # type: ignore[union-attr]
                if i not in live:
                    continue
                sock = live[i]
                if isinstance(ready, int):  # the process ended: what it sent is still read, then EOF
                    del sentinels[ready]
                    sock.settimeout(5)
                try:
                    (number, ok, value), fds = recv(sock)
                except Exception:  # EOF, a torn message or a timeout after its death: the worker is gone
                    del live[i]
                    sock.close()
                    self._gone(i)
                    continue
                with self.changed:
                    self._heard[i] = time.monotonic()
                    if number is None:
                        self.workers_ready.add(i)
                        self.changed.notify_all()
                        continue
                    self._load[i] -= 1
                    ticket = self._tickets.get(number)
                    if ticket is None or ticket.value is _DISCARD:
                        self._tickets.pop(number, None)
                        for fd in fds:
                            os.close(fd)
                    else:
                        ticket.done, ticket.value = True, (value, fds) if ok else None
                        ticket.error = None if ok else value
                    self.changed.notify_all()

    def _fail(self, which: Callable[[_Ticket], bool]) -> None:
        """Fail the pending tickets ``which`` selects with the pool's error (lock held)."""
        for number, ticket in list(self._tickets.items()):
            if which(ticket) and not ticket.done:
                if ticket.value is _DISCARD:
                    del self._tickets[number]
                else:
                    ticket.done, ticket.error = True, RuntimeError(self.broken)
        self.changed.notify_all()

    def _stalled(self, i: int, deadline: float) -> None:
        """Worker ``i`` sent nothing for ``deadline`` seconds: fail its tickets, break the pool, kill it (lock held)."""
        proc = self.processes[i]
        error = ReadWorkerStalled(
            stalled_message(proc.name if proc is not None else f"number {i}", getattr(proc, "pid", None), deadline)
        )
        self.broken = self.broken or str(error)
        self.workers_ready.discard(i)
        for ticket in self._tickets.values():
            if ticket.worker == i and not ticket.done:
                ticket.done, ticket.error = True, error
        self.changed.notify_all()
        if proc is not None and proc.pid is not None:
            try:
                os.kill(proc.pid, signal.SIGKILL)  # a stopped process dies too; the pool thread sees it go
            except OSError:
                pass

    def _gone(self, i: int) -> None:
        """Worker ``i`` exited: fail its tickets (and, unless the pool was closing, break the pool)."""
        proc = self.processes[i]
        proc.join(timeout=5)
        _clean_after(proc)
        with self.changed:
            self.workers_ready.discard(i)
            if not self.broken:
                self.broken = (
                    f"read worker {proc.name} (pid {proc.pid}) exited unexpectedly with code {proc.exitcode} "
                    "(killed, out of memory, or crashed in native code); the next pass starts new read workers, "
                    "or use read_workers=0 to read in this process"
                )
            self._fail(lambda ticket: ticket.worker == i)

    @property
    def alive(self) -> bool:
        """Whether any worker process is running."""
        return any(proc is not None and proc.is_alive() for proc in self.processes)

    def close(self) -> None:
        """Stop the workers and join them (idempotent); tickets not yet done fail."""
        if os.getpid() != self.pid:  # a forked child holds a copy: the workers are not its own
            return
        with self.changed:
            if self.broken is None:
                self.broken = "the read workers were closed (WindowDataset.close() or exit)"
            tasks, self._tasks = self._tasks, []
            self._fail(lambda ticket: True)
        for conn in tasks:
            try:
                conn.send(None)
                conn.close()
            except OSError:
                pass
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        for proc in self.processes:
            if proc is not None:
                proc.join(timeout=10)
                if proc.is_alive():  # pragma: no cover - a read stuck in native code
                    proc.kill()
                    proc.join()
                _clean_after(proc)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


_DISCARD = object()


def _clean_after(proc: Any) -> None:
    """A worker killed by a signal may leave a shared-memory name half made: unlink it (``handoff``)."""
    if proc.exitcode is not None and proc.exitcode < 0 and proc.pid is not None:
        unlink_leftovers(proc.pid)


# -- one pool per dataset ----------------------------------------------------------------------------

_POOLS: weakref.WeakKeyDictionary[Any, ReadPool] = weakref.WeakKeyDictionary()
_POOLS_LOCK = threading.Lock()


def pool_for(owner: Any, num_workers: int, reads: ReadValues | None = None) -> ReadPool:
    """``owner``'s pool of ``num_workers`` read workers (a ``PoolReads``), started on first use (or after a
    failure) with ``reads``, what its workers read with; ``reads`` ``None``: the pool started already."""
    with _POOLS_LOCK:
        pool = _POOLS.get(owner)
        if pool is not None and (pool.broken or len(pool.processes) != num_workers):
            pool.close()
            pool = None
        if pool is None:
            if reads is None:
                raise RuntimeError("no read pool was started for this dataset yet: iterate it first")
            pool = ReadPool(_ReadBuffer(reads), num_workers)
            _POOLS[owner] = pool
            weakref.finalize(owner, pool.close)  # also runs at exit
        return pool


def close_pool(owner: Any) -> None:
    """Stop ``owner``'s read workers, if any (the next pass starts new ones)."""
    with _POOLS_LOCK:
        pool = _POOLS.pop(owner, None)
    if pool is not None:
        pool.close()


@atexit.register
def _close_all() -> None:
    for pool in list(_POOLS.values()):
        pool.close()


class PoolReads:
    """The read backend seam (``runtime.seams``) of ``read_workers`` processes, wired by the dataset.

    Args:
        num_workers: Read worker processes (``read_workers``).
        deadline: Seconds a worker may send nothing while a buffer it reads is awaited (``read_deadline``).
    """

    def __init__(self, num_workers: int, deadline: float | None = READ_DEADLINE_SECONDS) -> None:
        self.num_workers, self.deadline = num_workers, deadline

    def workers(self, reads: ReadValues) -> int:
        """Processes that read and decode for this pass (0: reader threads of this process do)."""
        if not self.num_workers or not reads.source.reads_in_processes:
            return 0
        if in_worker():  # a DataLoader worker is daemonic: it cannot start processes
            warnings.warn(
                f"read_workers={self.num_workers} is ignored inside DataLoader workers; use either "
                "read_workers (workers decode, this process gathers) or DataLoader(num_workers=...)",
                RuntimeWarning,
                stacklevel=4,
            )
            return 0
        return self.num_workers

    def open(self, reads: ReadValues, arena: BufferArena, source_reader: Any) -> BufferReads:
        """A pass's reads: its first buffer here, the others by this backend's pool (started now if needed)."""
        pool = pool_for(self, self.num_workers, reads)
        return BufferReads(reads, pool, arena, source_reader, self.num_workers, self.deadline)

    def close(self) -> None:
        """Stop the read workers, if any (the next pass starts new ones)."""
        close_pool(self)

    def __reduce__(self) -> Any:  # a copy for another process: its own pool, started there if ever
        return PoolReads, (self.num_workers, self.deadline)


class _ReadBuffer:
    """Worker side: read and decode a buffer's units into one shared array; skip records travel back."""

    def __init__(self, reads: ReadValues) -> None:
        self.ds = reads

    def __call__(self, units: list[tuple]) -> tuple[list[list[Any]], list[Any]]:
        ds = self.ds
        before = len(ds.skipped)
        plan = SimpleNamespace(buffers=[tuple(seg for unit in units for seg in unit)])
        arena = BufferArena(ds, plan, units, alloc=shared_empty)
        reader = PartitionReader(ds.source, [unit[0].partition for unit in units], ds.columns)
        read = lambda unit: read_unit(ds, unit, reader, arena)
        reads = Prefetcher(read, units, len(units), "dask-windows-worker-read", threads=READ_THREADS)
        try:  # a buffer's units on reader threads, as in the training process: its last unit is not alone
            parts = list(reads)
        finally:
            reads.close()
            reader.close()
        records = ds.skipped[before:]
        del ds.skipped[before:]
        return parts, records


# -- a pass's reads ----------------------------------------------------------------------------------


class BufferReads:
    """A pass's decoded units in plan order: each buffer read here or by one read worker.

    The first buffer, and any buffer due while the pool is still starting, is read here on
    reader threads (into the pass's ``arena``, as with ``read_workers=0``); the others are
    submitted to the pool ``ahead`` buffers before the builder takes them. Either way the parts
    hold the same values, so batches do not depend on who read what.

    Args:
        ds: What the pass's readers need (``runtime.values.ReadValues``).
        pool: The read workers.
        arena: The pass's ``BufferArena`` (its ``members`` are the units of each buffer).
        source_reader: This process's reader of the pass's partitions.
        ahead: Buffers read ahead of the one the builder takes (>= 1).
        deadline: ``read_deadline``: seconds a worker may send nothing while its buffer is awaited.
    """

    def __init__(
        self,
        ds: ReadValues,
        pool: ReadPool,
        arena: BufferArena,
        source_reader: Any,
        ahead: int,
        deadline: float | None = READ_DEADLINE_SECONDS,
    ) -> None:
        self.ds, self.pool, self.arena, self.source_reader = ds, pool, arena, source_reader
        self.deadline = deadline
        self.members = arena.members
        self.ahead = max(1, ahead)
        self.cancelled = threading.Event()
        self._jobs: dict[int, tuple[str, Any]] = {}  # buffer -> ("local", Prefetcher) | ("pool", ticket)
        self._next = 0  # next buffer to start
        self._iter = self._units()

    def _start(self, upto: int) -> None:
        while self._next < min(upto, len(self.members)) and not self.cancelled.is_set():
            g, units = self._next, self.members[self._next]
            if g == 0 or not self.pool.ready or self.pool.broken:
                read = lambda unit: read_unit(self.ds, unit, self.source_reader, self.arena)
                self._jobs[g] = ("local", Prefetcher(read, units, len(units), threads=READ_THREADS))
            else:
                self._jobs[g] = ("pool", self.pool.submit(units))
            self._next += 1

    def _units(self) -> Iterator[list[Any]]:
        for g in range(len(self.members)):
            self._start(g + 1)
            kind, job = self._jobs[g]
            if kind == "local":
                for i, parts in enumerate(job):
                    if i == len(self.members[g]) - 1:
                        self._start(g + 1 + self.ahead)  # this buffer is read: the pool takes the next ones
                    yield parts
            else:
                self._start(g + 1 + self.ahead)
                parts_per_unit, records = self.pool.result(job, self.cancelled, self.deadline)
                del self._jobs[g]
                for record in records:  # the worker's warning stayed in the worker: given here again
                    self.ds.skipped.append(record)
                    message = f"skipping {record.name} (on_error='skip', while iterating): {record.error}"
                    warnings.warn(message, SkippedPartitionWarning, stacklevel=2)
                yield from parts_per_unit
                continue
            del self._jobs[g]

    def __iter__(self) -> Iterator[list[Any]]:
        return self

    def __next__(self) -> list[Any]:
        return next(self._iter)

    def close(self) -> None:
        """Stop this pass's reads (from any thread): local threads joined, pool results dropped."""
        self.cancelled.set()
        self.pool.wake()
        for kind, job in list(self._jobs.values()):
            if kind == "local":
                job.close()
            else:
                self.pool.discard(job)
