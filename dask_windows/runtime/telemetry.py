"""Where a pass's time goes: counters of each stage, the training loop's exposed wait, and a verdict.

The loop's exposed wait (asking for a batch until getting it) and its own work (until it asks
again) are measured around ``next()`` on its thread. Each stage (``open``, ``fetch``, ``decode``,
``reads waited``, ``buffer wait``, ``gather``, ``device copy``) adds nanoseconds and bytes to plain
counters on the thread doing the work, so with DataLoader workers only the exposed wait is seen
here. ``Verdict``: input-bound when the loop waited at least ``INPUT_BOUND_SHARE`` of its time after
the first batch, bound by the stage its waits are attributed to; a slow first batch alone is
**start-up**. The counters are figures for a verdict, not accounting (a ``+=`` from two threads may
rarely be lost). See docs/performance.md and docs/startup.md."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from dask_windows.runtime.prefetch import fork_safe_lock
from dask_windows.settings.tuning import INPUT_BOUND_SHARE, switches

__all__ = [
    "STARTUP",
    "Stats",
    "Telemetry",
    "Verdict",
    "gather_stats",
    "judge",
    "rank_stats",
    "reads_telemetry",
    "set_enabled",
    "timed_output",
    "timed_parts",
    "watch_loader",
    "watched",
]


_ADVICE = {  # what helps when a stage bounds the loader (one reader thread a unit ahead)
    "fetch": "reading bounds the loader (the pool order reads one unit ahead on one thread): read in DataLoader "
    "worker processes (num_workers=N, each reads its share); on an object store keep the bytes locally "
    "(cache_dir=); many small files or tiny row groups: `dask-windows convert` them into fewer, larger ones",
    "device": "copying batches to the device bounds the loader: send each buffer's rows once and cut batches "
    "on the device (device='cuda'), or overlap the copies with compute (dw.DevicePrefetcher on pinned batches)",
    "decode": "decoding the units bounds the loader: decode in DataLoader worker processes (num_workers=N), or "
    "read fewer columns",
    "buffer": "building the pool's steps bounds the loader: DataLoader num_workers=N builds them in worker processes",
    "gather": "cutting batches on the training loop's thread bounds the loader: DataLoader num_workers=N "
    "gathers in worker processes",
    "workers": "the DataLoader workers do not keep up: more num_workers, or see their stages by iterating "
    "with num_workers=0 (or `dask-windows bench`)",
}
_STARTUP_ADVICE = {
    "pool": "the first batch waits for the pool to fill: a smaller buffer_bytes fills it sooner (mixing less); "
    "over a longer run it is paid once",
    None: "the first batch waits for the first reads; over a longer run it is paid once",
}
STARTUP = "start-up"  # the stage of a verdict whose loop waited only for its first batch


#: Guards the read counters: a unit's read is counted once, whichever thread read it (one lock a read: ms apart).
_READS = fork_safe_lock()


@dataclass(frozen=True)
class Verdict:
    """Whether the loop is input-bound, which stage bounds it and what would help."""

    input_bound: bool
    stage: str | None
    advice: str
    wait_share: float
    startup_share: float = 0.0  # the first batch's wait over the whole loop's time

    def __str__(self) -> str:
        if self.stage == STARTUP:
            return (
                f"bound by start-up: the loop waited {self.startup_share:.1%} of its time for its first batch and "
                f"{self.wait_share:.1%} after it; {self.advice}"
            )
        if not self.input_bound:
            return f"not input-bound: the loop waited {self.wait_share:.1%} of its time; {self.advice}"
        return f"input-bound ({self.wait_share:.1%} of the loop's time waiting), bound by {self.stage}: {self.advice}"


@dataclass(frozen=True)
class Stats:
    """One rank's figures of the current (or last) pass, in seconds and bytes (``ranks``, ``slowest_rank``:
    when gathered by ``stats(all_ranks=True)``)."""

    rank: int
    batches: int
    open_seconds: float
    first_batch_seconds: float
    wait_seconds: float
    step_seconds: float
    fetch_seconds: float
    fetch_bytes: int
    decode_seconds: float
    reads: int
    reads_waited_seconds: float
    buffer_wait_seconds: float
    gather_seconds: float
    stages_seen: bool
    verdict: Verdict
    ranks: list[Stats] | None = field(default=None, compare=False)
    slowest_rank: int | None = None
    device_copy_seconds: float = 0.0
    device_copy_bytes: int = 0

    def as_dict(self) -> dict:
        out = asdict(self)
        out["verdict"] = {**asdict(self.verdict), "text": str(self.verdict)}
        return out

    def table(self) -> str:
        """The breakdown as text lines (``dask-windows bench`` prints it)."""
        per = max(self.batches - 1, 1)

        def each(seconds: float) -> str:
            return f"{seconds:.3f} s, {seconds / per * 1e3:.3f} ms/batch"

        rows = [
            ("open (listing, footers, scan)", f"{self.open_seconds:.3f} s"),
            ("first batch", f"{self.first_batch_seconds:.3f} s"),
            ("loop waited (after the first)", each(self.wait_seconds)),
            ("loop's own work", each(self.step_seconds)),
        ]
        if self.stages_seen:
            rows += [
                ("fetch", f"{self.fetch_seconds:.3f} s ({self.reads:,} reads, {self.fetch_bytes / 1e6:,.1f} MB)"),
                ("decode", f"{self.decode_seconds:.3f} s"),
                ("builder waited for reads", f"{self.reads_waited_seconds:.3f} s"),
                ("loop waited for buffers", f"{self.buffer_wait_seconds:.3f} s"),
                ("gather", f"{self.gather_seconds:.3f} s"),
                ("device copy", f"{self.device_copy_seconds:.3f} s ({self.device_copy_bytes / 1e6:,.1f} MB)"),
            ]
        else:
            rows.append(("stages", "run in DataLoader workers: not seen here"))
        if self.slowest_rank is not None:
            rows.append(("slowest rank", str(self.slowest_rank)))
        rows.append(("verdict", str(self.verdict)))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


class Telemetry:
    """The counters of one dataset in one process (see the module docstring)."""

    def __init__(self, open_ns: int = 0) -> None:
        self.open_ns = open_ns
        self.children: list[Telemetry] = []  # a mixture's members: their reads are the mixture's
        self.traffic: Any = None  # the dataset's ``ondevice.Traffic`` (device=), set by ``watched``
        self._depth = 0  # watchers running: a nested one (the dataset inside a watched loader) only passes through
        self.begin_pass()

    def begin_pass(self) -> None:
        for child in getattr(self, "children", ()):
            child.begin_pass()
        self.batches = 0
        self.first_ns = self.wait_ns = self.step_ns = 0
        self.fetch_ns = self.fetch_bytes = self.decode_ns = self.reads = 0
        self.reads_waited_ns = self.buffer_wait_ns = 0
        self.device_ns = self.device_bytes = 0  # the output seam's copies on the loop's thread
        self.order: str | None = None  # "pool": set by the pass (runtime.pool)
        self._at_first = (0, 0)  # (buffer waits, reads waited) when the first batch came: the start-up's
        traffic = getattr(self, "traffic", None)  # rows sent to the training device (ondevice.Traffic)
        self._sent_before = (getattr(traffic, "send_ns", 0), getattr(traffic, "row_bytes", 0))
        self.stages_seen = False  # until a pass is watched in this process

    def __getstate__(self) -> dict:  # (a DataLoader worker's copy starts its own counters)
        return {"open_ns": self.open_ns}

    def __setstate__(self, state: dict) -> None:  # (children: set again by telemetry_of)
        self.__init__(state["open_ns"])  # type: ignore[misc]

    def watch(self, batches: Iterable[Any], stages_here: bool = True) -> Iterator[Any]:
        """``batches``, timing the exposed wait and the loop's own work between them."""
        if self._depth:
            yield from batches
            return
        self._depth += 1
        self.begin_pass()
        self.stages_seen = stages_here
        clock = time.perf_counter_ns
        it = iter(batches)
        # each batch is let go (`del`) before the next is made: an output pool may then reuse its array
        try:
            asked = clock()
            for item in it:
                got = clock()
                if self.batches:
                    self.wait_ns += got - asked
                else:
                    self.first_ns = got - asked
                    self._at_first = (self._total("buffer_wait_ns"), self._total("reads_waited_ns"))
                self.batches += 1
                yield item
                del item
                asked = clock()
                self.step_ns += asked - got
        finally:
            self._depth -= 1
            close = getattr(it, "close", None)
            if close is not None:
                close()

    def waits(self, source: Iterator[Any], counter: str) -> Iterator[Any]:
        """``source``, adding the time each ``next`` blocks to ``counter``; no reference kept to an item
        once it is yielded."""
        clock = time.perf_counter_ns
        it = iter(source)
        held: list = []
        try:
            while True:
                asked = clock()
                try:
                    held.append(next(it))
                except StopIteration:
                    return
                setattr(self, counter, getattr(self, counter) + clock() - asked)
                yield held.pop()
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    def add_read(self, fetch_ns: int, decode_ns: int, nbytes: int) -> None:
        with _READS:  # the fill's reads on an object store run on several threads (runtime/pool.py)
            self.fetch_ns += fetch_ns
            self.decode_ns += decode_ns
            self.fetch_bytes += nbytes
            self.reads += 1

    def _total(self, name: str) -> int:
        return getattr(self, name) + sum(child._total(name) for child in self.children)

    def _order(self) -> str | None:
        """The order of the pass (a mixture: its first member's)."""
        return self.order or next((c._order() for c in self.children if c._order()), None)

    def exposed(self, fetch_ns: int, decode_ns: int, buffer_wait_ns: int, reads_waited_ns: int,
                gather_ns: int, device_ns: int) -> dict[str, float]:  # fmt: skip
        """Seconds of the loop's waits each stage accounts for: waits for the next step as far as the builder
        waited for reads, split between fetch and decode by busy time; the rest building; gather; device."""
        reading = min(reads_waited_ns, buffer_wait_ns)
        busy = fetch_ns + decode_ns
        fetch = reading * fetch_ns / busy if busy else float(reading)
        return {
            "fetch": fetch * 1e-9,
            "decode": (reading - fetch) * 1e-9,
            "buffer": max(buffer_wait_ns - reading, 0) * 1e-9,
            "gather": gather_ns * 1e-9,
            "device": device_ns * 1e-9,
        }

    def snapshot(self, rank: int = 0) -> Stats:
        s = 1e-9
        fetch_ns, decode_ns = self._total("fetch_ns"), self._total("decode_ns")
        buffer_wait_ns, reads_waited_ns = self._total("buffer_wait_ns"), self._total("reads_waited_ns")
        device_ns = self._total("device_ns")
        sent_ns = getattr(self.traffic, "send_ns", 0) - self._sent_before[0]  # this pass's rows sent (ondevice)
        sent_bytes = getattr(self.traffic, "row_bytes", 0) - self._sent_before[1]
        gather_ns = max(self.wait_ns + self.first_ns - buffer_wait_ns - device_ns, 0)
        # the stages of the waits after the first batch (the verdict's), the start-up's taken out
        later_buffer = max(buffer_wait_ns - self._at_first[0], 0)
        later_reads = max(reads_waited_ns - self._at_first[1], 0)
        stages = self.exposed(
            fetch_ns, decode_ns, later_buffer, later_reads, max(self.wait_ns - later_buffer - device_ns, 0),
            device_ns + min(sent_ns, max(later_buffer - later_reads, 0)),
        )  # fmt: skip
        verdict = judge(
            self.wait_ns * s,
            self.step_ns * s,
            max(self.batches - 1, 0),
            stages if self.stages_seen else None,
            first=self.first_ns * s,
            order=self._order(),
        )
        return Stats(
            rank=rank,
            batches=self.batches,
            open_seconds=self.open_ns * s,
            first_batch_seconds=self.first_ns * s,
            wait_seconds=self.wait_ns * s,
            step_seconds=self.step_ns * s,
            fetch_seconds=fetch_ns * s,
            fetch_bytes=self._total("fetch_bytes"),
            decode_seconds=decode_ns * s,
            reads=self._total("reads"),
            reads_waited_seconds=reads_waited_ns * s,
            buffer_wait_seconds=buffer_wait_ns * s,
            gather_seconds=gather_ns * s,
            stages_seen=self.stages_seen,
            verdict=verdict,
            device_copy_seconds=(device_ns + sent_ns) * s,
            device_copy_bytes=self._total("device_bytes") + sent_bytes,
        )


def judge(
    wait: float,
    step: float,
    batches: int,
    stages: dict[str, float] | None,
    first: float = 0.0,
    order: str | None = None,
) -> Verdict:
    """The verdict from the loop's ``wait`` and own work (``step``) in seconds after its first batch.

    ``stages``: ``Telemetry.exposed`` (``None``: the stages ran unseen, in DataLoader workers);
    ``first``: the first batch's wait; ``order``: ``"pool"`` names the pool order's settings.
    """
    share = wait / (wait + step) if wait + step > 0 else 0.0
    if batches > 0 and share >= INPUT_BOUND_SHARE:
        if stages is None:
            return Verdict(True, "workers", _ADVICE["workers"], share)
        stage = max(stages, key=lambda k: stages[k])
        return Verdict(True, stage, _ADVICE[stage], share)
    total = first + wait + step
    startup = first / total if total > 0 else 0.0
    if startup >= INPUT_BOUND_SHARE:
        return Verdict(False, STARTUP, _STARTUP_ADVICE.get(order, _STARTUP_ADVICE[None]), share, startup)
    return Verdict(False, None, "a faster loader would not speed training up", share, startup)


def timed_output(telemetry: Telemetry | None, output: Any) -> Any:
    """The output seam, timed as the ``device copy`` stage when it copies (``PinnedOutput``)."""
    if telemetry is None or not getattr(output, "copies", False):
        return output
    clock = time.perf_counter_ns

    def emit(x: Any, y: Any, rows: Any) -> Any:
        started = clock()
        out = output(x, y, rows)
        telemetry.device_ns += clock() - started
        telemetry.device_bytes += x.nbytes + (0 if y is None else y.nbytes)
        return out

    return emit


def timed_parts(telemetry: Telemetry | None, parts: Iterator[Any]) -> Iterator[Any]:
    """The builder's parts, timing its waits for the readers (``parts`` itself without telemetry)."""
    return parts if telemetry is None else telemetry.waits(parts, "reads_waited_ns")


def gather_stats(mine: Stats) -> Stats:
    """Every rank's ``Stats`` (an ``all_gather_object``), the slowest rank named; else ``mine``."""
    from dask_windows.runtime.detect import all_gather

    everyone = all_gather(mine)
    if everyone is None:
        return mine
    slowest = max(everyone, key=lambda s: s.wait_seconds + s.first_batch_seconds)
    return dataclasses.replace(mine, ranks=everyone, slowest_rank=slowest.rank)


def telemetry_of(ds: Any) -> Telemetry:
    """The dataset's counters (made on first use for a dataset built without them)."""
    telemetry = ds.__dict__.get("_telemetry")
    if telemetry is None:
        telemetry = ds.__dict__["_telemetry"] = Telemetry()
    members = getattr(ds, "members", None)  # a Mixture: its members' stages are its own
    if members is not None and not telemetry.children:
        telemetry.children = [telemetry_of(m) for m in members]
        telemetry.open_ns = sum(child.open_ns for child in telemetry.children)
    return telemetry


_ENABLED = [switches().telemetry]


def set_enabled(on: bool) -> bool:
    """Turn the counters on or off for later passes in this process; return the previous setting."""
    before = _ENABLED[0]
    _ENABLED[0] = bool(on)
    return before


def reads_telemetry(ds: Any) -> Telemetry | None:
    """The sink of a pass's read and wait times: the dataset's counters, ``None`` while opening or off."""
    return getattr(ds, "_telemetry", None) if _ENABLED[0] else None


def watched(ds: Any, batches: Iterator[Any]) -> Iterator[Any]:
    """A pass's batches timed in this process (untimed in a DataLoader worker or when off)."""
    from dask_windows.runtime.detect import in_worker

    if in_worker():
        return batches
    if not _ENABLED[0]:
        telemetry_of(ds).begin_pass()  # stats() of a pass run with the counters off: zeros
        return batches
    telemetry_of(ds).traffic = getattr(ds, "device_traffic", None)
    return telemetry_of(ds).watch(batches, stages_here=True)


def watch_loader(ds: Any, loader: Iterable[Any]) -> Iterator[Any]:
    """``loader``'s batches with the training loop's exposed wait counted on ``ds`` (see ``watched``)."""
    workers = 0
    inner: Any = loader
    for _ in range(4):  # a wrapper's loader (DevicePrefetcher.loader, ...) down to the DataLoader
        workers = max(workers, getattr(inner, "num_workers", 0) or 0)
        inner = getattr(inner, "loader", None)
        if inner is None:
            break
    return telemetry_of(ds).watch(loader, stages_here=workers == 0)


def rank_stats(ds: Any, all_ranks: bool = False) -> Stats:
    """``ds``'s ``Stats`` in this process, gathered over the ranks when ``all_ranks``."""
    rank = getattr(ds, "rank", 0)
    mine = telemetry_of(ds).snapshot(rank if isinstance(rank, int) else 0)
    return gather_stats(mine) if all_ranks else mine
