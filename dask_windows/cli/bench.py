"""``bench``: time a ``WindowDataset`` through a ``DataLoader`` on real data, in this process (torch is
imported by :func:`bench` only). Read time is counted by wrapping the source's read methods."""

from __future__ import annotations

import threading
import time as clock
from collections.abc import Iterator
from typing import IO, Any

__all__ = ["bench"]


#: The source's read methods: every pass reads through one of them.
_READS = ("read", "read_rows", "read_ranges", "read_chunks")


class _TimedRead:
    """A source's read method adding its seconds to a counter shared with DataLoader workers: once
    for a read calling another (the outermost), while it is iterated for one returning an iterator."""

    _depth = threading.local()

    def __init__(self, read: Any, seconds: Any) -> None:
        self.read, self.seconds = read, seconds

    def _add(self, started: float) -> None:
        with self.seconds.get_lock():
            self.seconds.value += clock.perf_counter() - started

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        depth = getattr(self._depth, "n", 0)
        started = clock.perf_counter()
        self._depth.n = depth + 1
        try:
            out = self.read(*args, **kwargs)
        finally:
            self._depth.n = depth
            if depth == 0:
                self._add(started)
        if depth == 0 and isinstance(out, Iterator) and not isinstance(out, (list, tuple, dict)):
            return self._timed(out)
        return out

    def _timed(self, chunks: Iterator[Any]) -> Iterator[Any]:
        while True:
            started = clock.perf_counter()
            self._depth.n = 1
            try:
                chunk = next(chunks)
            except StopIteration:
                return
            finally:
                self._depth.n = 0
                self._add(started)
            yield chunk


def _progress_bar(progress: IO[str] | None, total: int) -> Any:
    """A ``tqdm`` bar on ``progress`` when tqdm is installed (else ``None``: a line a second)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return None if progress is None else tqdm(total=total, file=progress, unit="batch", desc="bench", leave=False)


def bench(
    path: str,
    *,
    num_workers: int = 0,
    max_batches: int | None = None,
    seconds: float = 30.0,
    step_ms: float = 0.0,
    progress: IO[str] | None = None,
    **keywords: Any,
) -> dict:
    """Time a ``WindowDataset`` (opened with ``keywords``) through a ``DataLoader`` until the epoch ends,
    ``max_batches`` or ``seconds``; ``step_ms`` simulates a training step per batch, so ``wait_share``
    shows whether the loader keeps up (docs/cli.md). ``progress`` gets a line about once a second."""
    import multiprocessing
    import resource

    import torch

    from dask_windows import WindowDataset

    def say(text: str, end: str = "\n") -> None:
        if progress is not None:
            print(text, end=end, file=progress, flush=True)

    tty = progress is not None and getattr(progress, "isatty", lambda: False)()
    say(f"bench: opening {path}")
    opened = clock.perf_counter()
    ds = WindowDataset(path, **keywords)
    open_seconds = clock.perf_counter() - opened
    read_seconds = multiprocessing.get_context().Value("d", 0.0)
    for name in _READS:
        if getattr(ds.source, name, None) is not None:
            setattr(ds.source, name, _TimedRead(getattr(ds.source, name), read_seconds))
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=num_workers)
    batches = windows = num_bytes = 0
    waited = first_batch = 0.0
    say(
        f"bench: opened in {open_seconds:.2f} s: {ds.num_windows:,} windows, {len(ds):,} batches/epoch; measuring "
        f"for up to {seconds:g} s" + (f" or {max_batches:,} batches" if max_batches else "")
    )
    starting = f" ({num_workers} DataLoader worker process{'es' if num_workers > 1 else ''} starting)"
    say("bench: waiting for the first batch" + (starting if num_workers else ""))
    started = clock.perf_counter()
    shown = started
    bar = None  # a bar from the first batch on, below the lines said before it
    batch_iter = iter(ds.watch(loader))  # the loop's exposed wait and the stages (telemetry)
    while max_batches is None or batches < max_batches:
        asked = clock.perf_counter()
        try:
            batch = next(batch_iter)
        except StopIteration:
            break
        now = clock.perf_counter()
        waited += now - asked
        if batches == 0:
            first_batch = now - started
            say(f"bench: first batch after {first_batch:.2f} s")
            bar = _progress_bar(progress, len(ds) if max_batches is None else min(len(ds), max_batches))
        tensors = batch if isinstance(batch, (tuple, list)) else (batch,)
        batches += 1
        windows += tensors[0].shape[0]
        num_bytes += sum(t.nelement() * t.element_size() for t in tensors)
        if step_ms:
            clock.sleep(step_ms / 1000)
        now = clock.perf_counter()
        if bar is not None:
            bar.update(1)
        elif now - shown >= 1.0:
            shown = now
            say(
                f"bench: {batches:,}/{len(ds):,} batches, {windows:,} windows, {now - started:.0f} s",
                end="\r" if tty else "\n",
            )
        if now - started >= seconds:
            break
    elapsed = max(clock.perf_counter() - started, 1e-9)
    if bar is not None:
        bar.close()
    say(f"bench: done, {batches:,} batches in {elapsed:.2f} s" + (" " * 20 if tty else ""))
    del batch_iter  # joins the workers, so their peak RSS is known
    stats = ds.stats()
    spec = ds.spec
    processes = max(1, num_workers)
    return {
        "path": path,
        "partitions": len(ds.partitions),
        "num_windows": ds.num_windows,
        "batches_per_epoch": len(ds),
        "batches": batches,
        "windows": windows,
        "epoch_done": batches == len(ds),
        "seconds": elapsed,
        "open_seconds": open_seconds,
        "first_batch_seconds": first_batch,
        "windows_per_second": windows / elapsed,
        "gb_per_second": num_bytes / elapsed / 1e9,
        "wait_share": min(1.0, waited / elapsed),
        "read_share": min(1.0, read_seconds.value / (elapsed * processes)),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "peak_worker_rss_bytes": (
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 if num_workers else None
        ),
        "stats": stats.as_dict(),
        "breakdown": stats.table(),
        "settings": {
            "window": spec.window,
            "stride": spec.stride,
            "horizon": spec.horizon,
            "batch_size": spec.batch_size,
            "num_workers": num_workers,
            "buffer_partitions": spec.buffer_partitions,
            "prefetch_partitions": spec.prefetch_partitions,
            "step_ms": step_ms,
            "nan": spec.nan,
            "on_error": ds.config.read.on_error,
        },
    }
