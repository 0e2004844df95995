"""Any Dask DataFrame as a source: a partition is ``ddf.partitions[i]``, computed for the columns read.

With a ``dask.distributed`` client partitions are computed on the cluster, the next ``read_ahead``
in flight; without one, locally. Row counts come from the graph where it knows them, else from one
pass at open that also finds the series runs. A partition's graph is recomputed each epoch:
``persist()`` an expensive frame first."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError, SourceReadError
from dask_windows.errors.faults import (
    check_on_error,
    describe_failure,
    error_text,
    is_transient,
    opening_skip_allowed,
    record_skip,
)
from dask_windows.planning.windows import find_runs
from dask_windows.sources.base import Partition, PartitionReader, Source
from dask_windows.sources.retry import RetryPolicy, resolve_retry

__all__ = ["DaskSource"]

log = logging.getLogger(__name__)


def _active_client() -> Any:
    """The default ``dask.distributed`` client of this process, or ``None``."""
    try:
        from distributed import default_client
    except ImportError:  # pragma: no cover - dask without distributed
        return None
    try:
        return default_client()
    except ValueError:
        return None


def _known_lengths(ddf: Any) -> tuple[int, ...] | None:
    """Partition lengths the graph knows without computing (Parquet statistics, ``from_pandas``)."""
    try:
        from dask.dataframe.dask_expr._expr import Lengths, Literal

        expr = Lengths(ddf.expr).optimize(fuse=False)
    except Exception as exc:  # private API, may move: fall back to counting
        log.debug("partition lengths not known from the graph: %s", exc)
        return None
    if isinstance(expr, Literal) and len(expr.value) == ddf.npartitions:
        return tuple(int(n) for n in expr.value)
    return None


def _column_values(column: Any) -> np.ndarray:
    """A pandas column as numpy; nullable numbers become float with NaN for missing values."""
    dtype = column.dtype
    numpy_dtype = getattr(dtype, "numpy_dtype", None)
    if numpy_dtype is not None and numpy_dtype.kind in "iufb":
        if column.hasnans:
            return column.to_numpy(dtype=np.float64, na_value=np.nan)
        return column.to_numpy(dtype=numpy_dtype)
    return column.to_numpy()


def _summarise(frame: Any, series: Any) -> tuple[int, Any]:
    """Rows of one computed partition and, with ``series``, its runs ``(starts, lengths, keys)``."""
    if series is None:
        return len(frame), None
    keys = _column_values(frame[series])
    starts, lengths = find_runs(keys)
    return len(frame), (starts, lengths, keys[starts])


def _value_or_error(compute: Callable[[], Any]) -> Any:
    """``compute()``, or the exception it raised (a failed partition of the counting pass is a value)."""
    try:
        return compute()
    except Exception as exc:
        return exc


class _DaskReader(PartitionReader):
    """Keeps the next ``ahead`` partitions of an epoch computing on the cluster."""

    def __init__(self, source: DaskSource, indices: Sequence[int], columns: Sequence, client: Any) -> None:
        super().__init__(source, indices, columns)
        self._client = client
        self._parts = source.delayed_partitions(self.columns)
        self._futures: dict[int, Any] = {}  # position in ``indices`` -> future
        self._next = 0

    def _submit(self, upto: int) -> None:
        for k in range(self._next, min(upto, len(self.indices))):
            if k not in self._futures:
                self._futures[k] = self._client.compute(self._parts[self.indices[k]])

    def read(self, index: int) -> dict:
        source: DaskSource = self.source  # type: ignore[assignment]
        if self._next >= len(self.indices) or self.indices[self._next] != index:
            return source.read(index, self.columns)  # out of plan order: no read-ahead
        self._submit(self._next + source.read_ahead)
        future = self._futures.pop(self._next)
        self._next += 1
        self._submit(self._next + source.read_ahead)  # the cluster works while this one is used
        try:
            frame = future.result()
        except Exception as exc:
            if not is_transient(exc):
                raise source.read_error(index, exc) from exc
            log.warning("transient error computing %s: %s; retrying", source.partitions[index].name, exc)
            return source.read(index, self.columns)
        return source.columns_of(index, frame, self.columns)

    def read_rows(self, index: int, lo: int, hi: int) -> dict:
        """Rows ``[lo, hi)``: the partition is computed (in plan order, read ahead) and sliced."""
        return self.read_ranges(index, [(lo, hi)])[0]

    def read_ranges(self, index: int, ranges: Sequence[tuple[int, int]]) -> list[dict]:
        """Each of ``ranges`` of one computation of the partition."""
        data = self.read(index)
        return [{col: values[lo:hi] for col, values in data.items()} for lo, hi in ranges]

    def close(self) -> None:
        futures, self._futures = self._futures, {}
        for future in futures.values():
            future.release()


class DaskSource(Source):
    """A Dask DataFrame (a Dask Series as a one-column frame); a piece costs computing its whole partition.

    Args:
        series: The series column, when known: its runs are found in the pass that counts rows.
        retry: Retries of transient failures (an int of retries or a ``RetryPolicy``).
        on_error: ``"raise"`` if a partition fails in the counting pass, or ``"skip"`` it (recorded in ``skipped``).
        read_ahead: Partitions kept computing on the cluster ahead of the one being read."""

    default_pieces_per_partition = 1

    def __init__(
        self,
        ddf: Any,
        series: Any = None,
        retry: int | RetryPolicy | None = None,
        on_error: str = "raise",
        read_ahead: int = 4,
    ) -> None:
        if hasattr(ddf, "to_frame") and not hasattr(ddf, "columns"):
            ddf = ddf.to_frame()
        if not hasattr(ddf, "partitions") or not hasattr(ddf, "columns"):
            raise TypeError(f"expected a Dask DataFrame, got {type(ddf).__name__}")
        if isinstance(read_ahead, bool) or not isinstance(read_ahead, int) or read_ahead < 1:
            raise ConfigError(f"read_ahead={read_ahead!r} must be an int >= 1")
        self.ddf = ddf
        self.retry = resolve_retry(retry)
        self.on_error = check_on_error(on_error)
        self.read_ahead = read_ahead
        self.skipped: list = []
        self.description = f"Dask DataFrame {getattr(ddf, '_name', '')[:24]} ({ddf.npartitions} partitions)"
        self._pid = os.getpid()
        client = _active_client()
        self._scheduler = getattr(getattr(client, "scheduler", None), "address", None)
        self._worker_client: Any = None
        self._runs: dict[Any, list] = {}
        self._delayed: dict[tuple, list] = {}
        self._lock = threading.RLock()
        lengths: Sequence[int] | None = _known_lengths(ddf) if series is None else None
        if lengths is None:
            lengths = self._count(series)
        self.partitions = [Partition(f"ddf.partitions[{i}]", n, i) for i, n in enumerate(lengths)]

    # -- opening ------------------------------------------------------------------------------

    def _count(self, series: Any) -> list[int]:
        """One pass over every partition: its rows and, with ``series``, its runs."""
        import dask

        if series is not None and series not in self.ddf.columns:
            return self._count(None)  # check_columns names the missing column next
        frame = self.ddf[[series]] if series is not None else self.ddf
        if series is None and len(self.ddf.columns):
            frame = self.ddf[[self.ddf.columns[0]]]
        tasks = [dask.delayed(_summarise)(part, series) for part in frame.to_delayed()]
        log.info("counting rows of %s in one pass over %d partitions", self.description, len(tasks))
        results = self._compute_each(tasks)
        empty = np.zeros(0, np.int64)
        for i, result in enumerate(results):
            if not isinstance(result, Exception):
                continue
            exc = result
            if is_transient(exc):
                try:
                    results[i] = self.retry.call(lambda: dask.compute(tasks[i])[0], f"ddf.partitions[{i}]")  # noqa: B023 (called at once)
                    continue
                except Exception as again:
                    exc = again
            if not opening_skip_allowed(self.on_error, exc):
                raise self.read_error(i, exc, counting=True) from exc
            record_skip(self.skipped, f"ddf.partitions[{i}]", "scan", exc)
            results[i] = (0, (empty, empty, empty))
        if series is not None:
            self._runs[series] = [runs for _, runs in results]
        return [int(n) for n, _ in results]

    def _compute_each(self, tasks: list) -> list:
        """Every task's value, or the exception of a task that raised (the others still count)."""
        import dask

        client = self._client()
        if client is not None:
            return [_value_or_error(future.result) for future in client.compute(tasks)]
        try:
            return list(dask.compute(*tasks))
        except Exception:
            log.info("the counting pass over %s failed; computing partitions one by one", self.description)
        return [_value_or_error(task.compute) for task in tasks]  # one by one

    # -- schema and reading -------------------------------------------------------------------

    def column_names(self) -> list:
        return list(self.ddf.columns)

    def frame(self, columns: Sequence) -> Any:
        """The frame projected on ``columns`` (Dask then reads and builds only those)."""
        return self.ddf[list(columns)]

    def delayed_partitions(self, columns: Sequence) -> list:
        """One ``Delayed`` per partition of the frame projected on ``columns``, built once per column set in
        the calling thread (built on the prefetch thread, Dask's expression locks can deadlock)."""
        key = tuple(columns)
        with self._lock:
            if key not in self._delayed:
                self._delayed[key] = self.frame(columns).to_delayed()
            return self._delayed[key]

    def _client(self) -> Any:
        """The client to compute with in this process, or ``None`` to compute locally."""
        if os.getpid() == self._pid:
            return _active_client()
        if self._worker_client is None and self._scheduler is not None:
            import dask
            from distributed import Client

            log.info("connecting to the Dask scheduler %s from process %d", self._scheduler, os.getpid())
            self._worker_client = Client(self._scheduler, set_as_default=False)
            # A forked process inherits the opener's default client, whose event loop did not survive
            # the fork: Dask's own implicit computes (metadata inference) must go to this one instead.
            dask.config.set(scheduler=self._worker_client)
        return self._worker_client

    def reader(self, indices: Sequence[int], columns: Sequence) -> PartitionReader:
        client = self._client()
        self.delayed_partitions(columns)  # build the graph here, not on the prefetch thread
        if client is None:
            return PartitionReader(self, indices, columns)
        return _DaskReader(self, indices, columns, client)

    def read_error(self, index: int, exc: BaseException, counting: bool = False) -> SourceReadError:
        """The error raised for partition ``index`` failing with ``exc`` (while ``counting`` rows at open)."""
        name = f"ddf.partitions[{index}]" if counting else self.partitions[index].name
        if is_transient(exc):
            remedy = "the cluster or the store kept failing; check them or pass a larger retries="
            if counting:
                remedy += " (not skipped while opening, even with on_error='skip': every rank must see the same rows)"
        else:
            remedy = f"compute {name} of the frame to see the failure; fix its input or pass on_error='skip'"
        return SourceReadError(
            f"cannot compute {name} of {self.description}{describe_failure(exc)}: {error_text(exc)}; {remedy}"
        )

    def columns_of(self, index: int, frame: Any, columns: Sequence) -> dict:
        """``columns`` of a computed partition as numpy, checked against its row count."""
        part = self.partitions[index]
        if len(frame) != part.num_rows:
            raise SourceReadError(
                f"{part.name} of {self.description} has {len(frame)} rows but had {part.num_rows} when the dataset "
                "was opened; the frame's inputs changed or it is not deterministic; persist() it or open again"
            )
        return {col: _column_values(frame[col]) for col in columns}

    def read(self, index: int, columns: Sequence) -> dict:
        client = self._client()
        part = self.delayed_partitions(columns)[index]

        def compute() -> Any:
            return client.compute(part).result() if client is not None else part.compute()

        try:
            frame = self.retry.call(compute, self.partitions[index].name)
        except Exception as exc:
            raise self.read_error(index, exc) from exc
        return self.columns_of(index, frame, columns)

    def read_runs(self, index: int, series: Any) -> tuple[np.ndarray, ...]:
        if series is None:
            return super().read_runs(index, None)
        with self._lock:  # the first caller scans every partition in one pass; the others wait
            if series not in self._runs:
                counts = self._count(series)
                if counts != [p.num_rows for p in self.partitions]:
                    raise SourceReadError(
                        f"{self.description} changed its partition lengths between two passes; persist() it first"
                    )
            runs = self._runs[series][index]
        return runs

    def __getstate__(self) -> dict:
        state = {**self.__dict__, "_worker_client": None, "_runs": {}, "_delayed": {}}
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
