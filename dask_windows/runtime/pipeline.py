"""From a pass's steps to batches: ``stream`` cuts a reader's steps (pool rows of each step's windows,
shuffled) into batches, gathering runs of full batches in one call (``batch.Gatherer``); only the final
batch can be partial. ``normalize="sample"`` standardises from the pool's ``window_table`` where it vouches
for a window, else from the window's values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.random  # (numpy 2 loads it on first use: 0.05-0.14 s of extension modules in the first plan)

from dask_windows.runtime.batch import OutputPool, normalize_per_sample
from dask_windows.runtime.memory import trim
from dask_windows.settings.spec import WindowSpec
from dask_windows.settings.tuning import TRIM_BYTES as _TRIM_BYTES

__all__ = ["stream"]


@dataclass
class _Built:
    """A step ready to drain: its windows (``buffer.starts``, in their final order), the first ``skip`` of
    them already yielded (a resume)."""

    buffer: Any  # ``runtime.pool._Step``: the starts, the gatherer, ``global_rows``
    skip: int
    table: Any = None  # the pool's window statistics (``window_table.WindowTable``), or ``None``
    device: Any = None  # its rows on the training device (``ondevice``)


def _per_sample(x: np.ndarray, starts: np.ndarray, built: _Built, channel_major: bool) -> None:
    """Standardise the batch of windows at ``starts`` in place, per window: from the table where the
    step has one (windows it does not vouch for from their values), else from the windows' values."""
    if built.table is None:
        normalize_per_sample(x, channel_major)
    else:
        built.table.apply(x, starts)


def stream(
    num_windows: int,
    steps: Iterator[_Built],
    spec: WindowSpec,
    emit: Callable[..., object],
    normalize: tuple[np.ndarray, np.ndarray] | str | None = None,
    last: Callable[[], None] | None = None,
    device: Any = None,
    waits: Callable[[Iterator[_Built], str], Iterator[_Built]] | None = None,
    allocator: Callable[[], Any] | None = None,
) -> Iterator[object]:
    """Yield ``emit(x, y, rows)`` (``y``, ``rows`` or ``None``; with ``code_features`` a fourth, the ``(B, K, L)``
    codes) for each batch of a plan's ``num_windows`` windows, from ``steps`` (an ``Ahead`` or a generator;
    the caller closes it). ``normalize="sample"``: per window and channel (else scaled at decode); ``last``:
    called once, on this thread, when the step holding the final windows is taken; ``waits``: times the waits
    for steps; ``allocator``: the seam (``None``: an ``OutputPool``); ``device``: a ``DeviceFeed`` gathering on
    its device (``emit`` unused)."""
    source: Iterator[_Built] = steps if waits is None else waits(steps, "buffer_wait_ns")
    batch = spec.batch_size
    remaining = num_windows
    carry: list[tuple] = []  # pieces of a batch begun in the previous step
    carried = 0
    # Full batches' feature arrays, reused once no caller holds them (the allocator seam: ``seams``).
    pool: Any = allocator() if allocator is not None else OutputPool()
    per_sample, channel_major = normalize == "sample", spec.layout == "NCL"
    want_y, want_rows = bool(spec.targets), spec.return_index
    coded = spec.code_features > 0  # ``emit(x, y, rows, codes)``: the codes gathered on their own (Gatherer.codes_at)
    # Runs with targets, rows or codes are gathered on two lanes as features alone are (``Gatherer.made_run``);
    # the output is called here, on the consumer; per-sample scaling stays on this thread too.
    on_lanes = not per_sample
    try:  # (the ``finally`` lets go of the steps, so the caller's close finds the builder idle)
        if device is not None:  # cut on the training device from the pool there (ondevice)
            yield from device.batches(source, num_windows, last)
            return
        for built in source:
            buffer, pos, total = built.buffer, built.skip, len(built.buffer.starts)
            if last is not None and remaining <= total - pos:  # the plan's last step: the reader idle from now
                last()
                last = None
            while pos < total and remaining > 0:
                if not carried and min(total - pos, remaining) >= batch:
                    # A run of full batches: the gather and the checks chosen once for the run.
                    k = min(total - pos, remaining) // batch
                    run = buffer.starts[pos : pos + k * batch]
                    pos += k * batch
                    remaining -= k * batch
                    if not (want_y or want_rows or per_sample or coded):  # features only: one generator for the run
                        batches = buffer.gatherer.gather_run(run, batch, pool)
                        try:
                            for x in batches:
                                yield emit(x, None, None)
                        finally:
                            batches.close()  # its lane thread (``lanes``) ends with the run, however it ends
                        del x, run, batches  # (as below)
                        continue
                    gather = buffer.gatherer.gather_for(batch, pool)

                    def make(
                        starts: np.ndarray, gather: Any = gather, buffer: Any = buffer, built: _Built = built
                    ) -> Any:
                        x = gather(starts)
                        y = buffer.gatherer.targets(starts) if want_y else None
                        rows = buffer.global_rows(starts) if want_rows else None
                        if per_sample:
                            _per_sample(x, starts, built, channel_major)
                        return (x, y, rows, buffer.gatherer.codes_at(starts)) if coded else (x, y, rows)

                    if on_lanes:  # each batch's arrays gathered on two lanes where the features would be
                        made = buffer.gatherer.made_run(run, batch, pool, make)
                    else:
                        made = (make(run[a : a + batch]) for a in range(0, k * batch, batch))
                    try:
                        for parts in made:
                            yield emit(*parts)
                            del parts
                    finally:
                        made.close()  # (as above)
                    # The pool may reuse a batch's array once the caller drops it; the run and the
                    # bound gather hold the pool's arrays.
                    del run, gather, made, make
                    continue
                take = min(batch - carried, total - pos, remaining)
                starts = buffer.starts[pos : pos + take]
                x = buffer.gatherer.features(starts, pool if take == batch else None)
                y = buffer.gatherer.targets(starts) if spec.targets else None
                rows = buffer.global_rows(starts) if spec.return_index else None  # only yielded with the index
                codes = buffer.gatherer.codes_at(starts) if coded else None
                if per_sample:
                    _per_sample(x, starts, built, channel_major)
                pos += take
                remaining -= take
                if carried or (take < batch and remaining > 0):
                    carry.append((x, y, rows, codes))
                    carried += take
                    if carried < batch and remaining > 0:
                        continue
                    x = np.concatenate([c[0] for c in carry])
                    y = np.concatenate([c[1] for c in carry]) if spec.targets else None
                    rows = np.concatenate([c[2] for c in carry]) if spec.return_index else None
                    codes = np.concatenate([c[3] for c in carry]) if coded else None
                    carry, carried = [], 0
                yield emit(x, y, rows, codes) if coded else emit(x, y, rows)
            large = buffer.nbytes >= _TRIM_BYTES
            del buffer, built  # drop the step before the next one is taken
            if large:
                trim()
    finally:
        del source
