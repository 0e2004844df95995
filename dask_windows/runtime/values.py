"""What a pass's runtime receives: frozen values built by the dataset in one place, never the dataset.

``ReadValues``: what readers need; ``PassValues``: those, the seams, per-window normalisation, the device
feed and the counters. Built per pass (references only), so a test can drive a pass with its own values
and what the dataset changes between passes never reaches one in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dask_windows.planning import budget
from dask_windows.planning.index import WindowGrid
from dask_windows.runtime.seams import NumpyAllocator, TorchOutput
from dask_windows.settings.spec import WindowSpec

__all__ = ["PassValues", "ReadValues", "no_count"]


@dataclass(frozen=True, eq=False)
class ReadValues:
    """What a pass's readers need: a partition's rows read, decoded, counted.

    ``source`` (``sources.Source``), ``spec``, ``grid``; ``row_offsets``: ``(P,)`` dataset row of each
    partition's first row; ``y_dtype``: the targets' dtype (``None``: a read tells); ``scale``: ``(mean, std)``
    applied while decoding, or ``None``; ``skipped``: the dataset's list of skips (``faults.record_skip``);
    ``telemetry``: the sink of read and wait times, or ``None``; ``table_bytes``: bytes per pool row of
    ``normalize="sample"``'s window table, counted in the budget.
    """

    source: Any
    spec: WindowSpec
    grid: WindowGrid
    row_offsets: np.ndarray
    y_dtype: Any = None
    scale: tuple[np.ndarray, np.ndarray] | None = None
    skipped: list = field(default_factory=list)
    telemetry: Any = None
    table_bytes: int = 0

    @property
    def columns(self) -> list[str]:
        """The columns a read asks for: features, then targets."""
        return list(self.spec.columns)

    @property
    def row_bytes(self) -> float:
        """Bytes one pool row costs (``planning.budget.row_bytes``): columns, window start, window table."""
        return budget.row_bytes(self.spec, self.y_dtype, self.table_bytes)


def no_count(*_: Any) -> None:
    """A pass counter that counts nothing (a pass outside the resume state: a mixture's view, a test)."""


@dataclass(frozen=True, eq=False)
class PassValues:
    """A pass's values: its readers' (``reads``), its seams (``output``, ``allocator``), an
    ``ondevice.DeviceFeed`` (``device``) and ``nextpass.NextPass`` (``next_pass``) or ``None``, and its
    counters: ``step(progress)`` before each batch is yielded, ``end(progress)`` once the pass ends."""

    reads: ReadValues
    output: Callable[[np.ndarray, np.ndarray | None, np.ndarray | None], Any] = field(default_factory=TorchOutput)
    allocator: Callable[[], Any] = field(default_factory=NumpyAllocator)
    normalize: str | None = None
    device: Any = None
    next_pass: Any = None
    step: Callable[[Any], None] = no_count
    end: Callable[[Any], None] = no_count

    def counted(self, batches: Iterable[Any], progress: Any) -> Iterator[Any]:
        """``batches``, each counted (``step``) before the consumer gets it, so a state taken then
        includes it; ``end`` once the pass ends, however it ends (``progress`` ``None``: no end)."""
        try:
            for batch in batches:
                self.step(progress)
                yield batch
        finally:
            if progress is not None:
                self.end(progress)
