"""What a pass's runtime receives: frozen values built by the dataset in one place, never the dataset.

``ReadValues`` is what readers need to read and decode a partition's rows: the
source handle and its columns, the dataset's settings (``WindowSpec``, the one
settings value: its fault policy ``on_error`` included), the window grid and
each partition's first row, the dtype of the targets, global normalisation,
the list skips are recorded in, and the telemetry sink.

``PassValues`` adds what a pass does with the rows once read: the seams
(``runtime.seams``: the allocator of batch arrays, the batch output), per-window normalisation and the device feed, and the two counters a
pass reports its batches to (the resume state's ``step`` and ``end``).

``WindowDataset._pass_values`` builds them (``dataset.py``); the runtime
modules (``runtime.pool``, ``runtime.pipeline``) take them as arguments, so a
test drives a pass with values of its own, and a field the runtime reads is a
field here, named and typed, instead of a member of the dataset.

The trade-off: the values are rebuilt per pass (references only: no array is
copied), so what the dataset changes between passes (its epoch, a new grid
after ``split``) reaches the next pass and never one in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dask_windows.planning.index import WindowGrid
from dask_windows.runtime.seams import NumpyAllocator, TorchOutput
from dask_windows.settings.spec import WindowSpec

__all__ = ["PassValues", "ReadValues", "no_count"]


@dataclass(frozen=True, eq=False)
class ReadValues:
    """What a pass's readers need: a partition's rows read, decoded, counted.

    Attributes:
        source: The source handle (``sources.Source``): ``reader``, ``partitions``, ``decode_units``.
        spec: The dataset's settings (``WindowSpec``): window semantics, batching, ``on_error``...
        grid: The window grid (per partition its runs and window counts).
        row_offsets: ``(P,)`` dataset row of each partition's first row.
        y_dtype: The targets' dtype (from the schema), or ``None`` where only a read tells.
        scale: ``(mean, std)`` per feature applied while decoding, or ``None``.
        skipped: Where skips are recorded (``faults.record_skip``): the dataset's ``skipped`` list.
        telemetry: The sink of read and wait times (``runtime.telemetry.Telemetry``), or ``None``.
        table_bytes: Bytes per pool row besides its columns: ``normalize="sample"``'s window table
            (a mean and an inverse std per feature, float32), counted in the budget.
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


def no_count(*_: Any) -> None:
    """A pass counter that counts nothing (a pass outside the resume state: a mixture's view, a test)."""


@dataclass(frozen=True, eq=False)
class PassValues:
    """A pass's values: its readers' (``reads``), the seams it runs through, and its counters.

    Attributes:
        reads: What the readers need (``ReadValues``).
        output: The batch output seam: ``(x, y, rows)`` numpy arrays to the batch yielded.
        allocator: The allocator seam: makes the pool a pass gathers batch arrays into.
        normalize: ``"sample"`` (each window standardised as it is cut) or ``None``.
        device: An ``ondevice.DeviceFeed`` (batches cut on the training device), or ``None``.
        next_pass: The buffer orders' next pass read ahead (``speedups.nextpass.NextPass``: ``claim``,
            ``wanted``, ``begin``), or ``None``.
        step: Called with ``progress`` before each batch is yielded (the resume count).
        end: Called with ``progress`` once the pass ends, however it ends.
    """

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
