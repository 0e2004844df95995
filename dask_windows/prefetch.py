"""The only thread: reads items ahead of the consumer, in order, bounded.

``Prefetcher(read, keys, depth)`` calls ``read(key)`` for each key on a named
daemon thread, keeping at most ``depth`` results read but not yet taken (a
semaphore, not a queue size, so the item being read counts too). The end of
the stream and any exception travel through the queue as values; an
exception is re-raised in the consumer with the reader's traceback chained.
``close()`` stops the thread and joins it; it is called when iteration ends,
breaks early, or the consumer is garbage collected. ``depth=0`` reads in the
consumer's thread, with no thread at all.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["Prefetcher"]

_END = object()


class _Failure:
    def __init__(self, key: Any, exc: BaseException) -> None:
        self.key = key
        self.exc = exc


def _read_ahead(
    read: Callable[[Any], Any],
    keys: Sequence[Any],
    out: queue.Queue,
    slots: threading.Semaphore,
    stop: threading.Event,
) -> None:
    for key in keys:
        slots.acquire()
        if stop.is_set():
            return
        try:
            item = read(key)
        except BaseException as exc:  # relayed to the consumer, never swallowed
            out.put(_Failure(key, exc))
            return
        out.put(item)
    out.put(_END)


class Prefetcher:
    """Iterate ``read(key)`` for ``keys`` in order, reading up to ``depth`` ahead.

    Args:
        read: Called once per key, on the background thread when ``depth > 0``.
        keys: What to read, in order.
        depth: Results that may be read ahead of the consumer.
        name: Thread name (shown in stack dumps).
    """

    def __init__(
        self, read: Callable[[Any], Any], keys: Sequence[Any], depth: int, name: str = "dask-windows-prefetch"
    ) -> None:
        self._read = read
        self._keys = list(keys)
        self._depth = depth
        self._taken = 0
        self._thread: threading.Thread | None = None
        if depth > 0 and self._keys:
            self._queue: queue.Queue = queue.Queue()
            self._slots = threading.Semaphore(depth)
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=_read_ahead,
                args=(read, self._keys, self._queue, self._slots, self._stop),
                name=name,
                daemon=True,
            )
            self._thread.start()

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._taken >= len(self._keys):
            self.close()
            raise StopIteration
        if self._thread is None:
            item = self._read(self._keys[self._taken])
        else:
            item = self._queue.get()
            self._slots.release()
            if isinstance(item, _Failure):
                self.close()
                raise item.exc
        self._taken += 1
        return item

    def close(self) -> None:
        """Stop reading ahead and join the thread (idempotent)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        self._slots.release()  # wake a reader waiting for a slot
        thread.join()

    @property
    def alive(self) -> bool:
        """Whether the background thread is running."""
        return self._thread is not None and self._thread.is_alive()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass
