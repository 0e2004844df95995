"""``WindowDataset``: an ``IterableDataset`` of ready batches (``DataLoader(ds, batch_size=None)``), wiring only.

Opening reads metadata and the series column; iterating follows a pure plan of ``(seed, epoch, rank,
world_size, worker, num_workers)`` (``planning/``), so batches are the same bit for bit whatever the
thread timing.
"""

from __future__ import annotations

import copy
import logging
import os
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset

from dask_windows.errors import ConfigError, DataError
from dask_windows.errors.faults import SkippedPartition
from dask_windows.ondevice import Traffic, feed_for
from dask_windows.opening import check_columns, check_windows, scan
from dask_windows.opening.checks import SERIES_FROM_MANIFEST, check_series_order, output_dtype
from dask_windows.opening.omissions import check_omissions
from dask_windows.passes import PassProtocol
from dask_windows.planning.budget import advised_budget, plan_for, pool_summary, unit_bounds, warn_if_few_units
from dask_windows.planning.index import WindowGrid
from dask_windows.planning.pool import PoolPlan
from dask_windows.planning.ragged import Ragged
from dask_windows.planning.resume import Resumer, fingerprint
from dask_windows.planning.split import SeriesTable, cut_positions, split_grid
from dask_windows.planning.world import World
from dask_windows.runtime.detect import process_group_store
from dask_windows.runtime.pool import pool_batches
from dask_windows.runtime.seams import TorchOutput
from dask_windows.runtime.streams import StreamValues, elastic_batches
from dask_windows.runtime.telemetry import Stats, Telemetry, rank_stats, reads_telemetry, watch_loader, watched
from dask_windows.runtime.values import PassValues, ReadValues, no_count
from dask_windows.settings.config import Config, OrderConfig, ReadConfig, WindowConfig, resolve
from dask_windows.settings.options import deprecated_read_workers, resolve_normalize
from dask_windows.settings.spec import WindowSpec
from dask_windows.settings.tuning import NEXT_PASS_SECONDS, OPEN_THREADS, RETRIES
from dask_windows.sources import ArraySource, Source, open_source
from dask_windows.sources.base import partition_names, rows_per_partition
from dask_windows.sources.retry import RetryPolicy
from dask_windows.speedups import nextpass
from dask_windows.speedups.nextpass import NextPass
from dask_windows.speedups.slots import SlotAllocator, shared

__all__ = ["WindowDataset"]

log = logging.getLogger(__name__)


class WindowDataset(PassProtocol, IterableDataset):
    """Shuffled batches of windows streamed from partitioned time series.

    Args:
        data: A Parquet file, folder, glob or fsspec URL (``s3://``, ``gs://``, ``memory://``...),
            a list of them, a Dask DataFrame, a list of ``(rows, C)`` numpy arrays / memmaps
            (each one series), or Arrow-world data: a pandas or Polars DataFrame (or LazyFrame), a
            ``pyarrow.Table`` or ``pyarrow.dataset.Dataset``, a Hugging Face ``datasets.Dataset``, a
            ``deltalake.DeltaTable`` (see ``sources.arrow``).
        features: Columns stacked as the ``C`` channels of ``x`` (column indices for arrays;
            ``None`` there means all columns).
        targets: Columns stacked as ``y``; ``None`` for self-supervised training.
        series: Column whose value changes end a run; windows never cross one. For one 2-D array,
            a ``(rows,)`` vector of series ids instead. Not given: the series column named by the
            folder's ``dask-windows convert`` manifest when there is one (``repr`` says so), else
            one series; ``series=None`` always means one series.
        window: Rows per window ``L``.
        stride: Rows between consecutive window starts of a run.
        horizon: ``0``: ``y`` is the targets at the window's last row, ``(B, T)``;
            ``H > 0``: the targets of the ``H`` rows after the window, ``(B, T, H)``.
        batch_size: Windows per batch ``B``.
        drop_last: Leave out this rank's final partial batch.
        shuffle: Shuffle partition order per epoch and windows among the resident units.
        seed: Base of every random generator.
        buffer_partitions: With whole partitions, how many are resident at once (a batch draws on
            that many; the loader's memory).
        pieces_per_partition: ``1``: whole partitions, ``buffer_partitions`` of them resident (the
            default for a Dask frame and for data spread by ``dask-windows convert``); above 1:
            deprecated, served by the pool order. ``None`` (default): the pool order.
        buffer_bytes: The pool order's memory budget of decoded rows per rank (shared by its
            DataLoader workers; ``None``: 1 GiB): each decode unit (a Parquet row group) is read
            once per epoch and every batch drawn from all resident units; with at least
            ``2 * batch_size`` of them, batches mix like a global shuffle (docs/mixing.md).
        prefetch_partitions: ``>= 1``: a reader thread reads the next unit and a builder thread
            builds the next step while batches are gathered (docs/memory.md); ``0``: everything
            on the consumer's thread.
        layout: ``"NCL"`` gives ``x`` as ``(B, C, L)``, ``"NLC"`` as ``(B, L, C)``.
        return_index: Also yield each window's global start row, int64 ``(B,)``.
        storage_options: Passed to fsspec.
        nan: ``"raise"`` (default) on NaN inside a window, or ``"drop"`` windows holding NaN
            (this reads the feature columns once when the dataset is opened).
        normalize: ``None``; ``"sample"`` to standardise each window and channel; or per-feature
            ``{"mean": [...], "std": [...]}`` / a stats file from ``dask-windows stats``.
        rank: This process's rank; default from ``torch.distributed`` when initialised, else 0.
        world_size: Number of ranks; default from ``torch.distributed``, else 1.
        partition_bytes: Parquet files with more uncompressed bytes are split at row groups.
        partition_rows: Arrays are grouped into partitions of about this many rows.
        threads: Threads used to read metadata and series columns when opening.
        retries: Retries of transient storage errors (connection reset, throttling, 5xx) with
            exponential backoff; an int, or a ``RetryPolicy`` for the delays.
        on_error: ``"raise"`` (default) on an unreadable partition, or ``"skip"`` it with a warning
            (listed in ``skipped``; every rank still yields ``len(ds)`` batches). Only corrupt or
            missing data is skipped, never a resource or permission error.
        strict: Raise instead of warn when the data is usable but suspect (a series that reappears
            after another inside a partition: see ``docs/checks.md``).
        timeout: Seconds a remote Parquet read may take, retries included (default 60; twice that
            per call while opening); past it a ``SourceReadError`` names the object. Local files
            and Dask frames have no deadline.
        cache_dir: Parquet in a remote store: keep the bytes read in this local folder, shared by
            the ranks and workers of a machine (``sources.cache``).
        cache_bytes: Most bytes ``cache_dir`` may hold (docs/pretraining.md).
        read_workers: Deprecated and ignored (a ``DeprecationWarning``; removed in 0.4).
        workflow: A fitted ``dask_windows.workflow.Workflow`` (or the path of a saved one, or
            ``wf.named(...)`` for named batches): its operations run on each piece as it is read;
            ``features`` / ``targets`` default to its roles and name its outputs. See docs/workflows.md.
        next_pass_seconds: While a pass's last step is drained, the first units of the next epoch's
            pass are read ahead and kept this long for the next ``iter()`` (the same batches either
            way; ``speedups.nextpass``). ``0`` turns it off.
        device: Gather the batches on this torch device (``"cuda"``, ``"cpu"``; ``"auto"``: CUDA when
            available, else the host): decoded rows cross once and every batch is cut there by
            index, the host's values in its order (docs/device.md). Iterate in the training
            process (no DataLoader workers). ``None`` (default): the host.
        read_deadline: Deprecated and ignored, like ``read_workers``.
        index: Parquet paths: the dataset index of ``dask-windows index`` (one read at open instead of
            one per file). ``None`` (default): the one beside a folder or prefix, if any; a path:
            that one; ``False``: none (docs/startup.md).

    Attributes:
        skipped: Partitions skipped in this process: at open, and while iterating in this process.
            DataLoader workers are other processes: their skips show in their warnings and logs.
    """

    def __init__(
        self,
        data: Any,
        features: Sequence | None = None,
        targets: Sequence | None = None,
        series: Any = SERIES_FROM_MANIFEST,
        *,
        window: int,
        stride: int = 1,
        horizon: int = 0,
        batch_size: int = 256,
        drop_last: bool = False,
        shuffle: bool = True,
        seed: int = 0,
        buffer_partitions: int = 2,
        pieces_per_partition: int | None = None,
        prefetch_partitions: int = 1,
        layout: str = "NCL",
        return_index: bool = False,
        storage_options: dict | None = None,
        nan: str = "raise",
        normalize: Any = None,
        rank: int | None = None,
        world_size: int | None = None,
        partition_bytes: int | None = None,
        partition_rows: int | None = None,
        threads: int = OPEN_THREADS,
        retries: int | RetryPolicy = RETRIES,
        on_error: str = "raise",
        strict: bool = False,
        timeout: float | None = None,
        cache_dir: str | os.PathLike | None = None,
        cache_bytes: int | None = None,
        read_workers: int = 0,
        next_pass_seconds: float = NEXT_PASS_SECONDS,
        device: Any = None,
        workflow: Any = None,
        read_deadline: float | None = None,
        buffer_bytes: int | None = None,
        index: Any = None,
    ) -> None:
        super().__init__()
        opening = time.perf_counter_ns()
        deprecated_read_workers(read_workers, read_deadline)  # a warning: both are ignored
        self.read_workers, self.read_deadline = 0, None  # 0.2's attributes, as the settings now act

        def opened(read: ReadConfig, series: Any) -> Source:
            options = read.source_options()
            if read.index is not False and isinstance(data, (str, os.PathLike, list, tuple)):
                options["footer_group"] = process_group_store()  # ranks share footers (footer_share)
            return open_source(
                data, read.storage_options, series=series, retry=read.retry, on_error=read.on_error, **options
            )

        resolved = resolve(
            WindowConfig(
                window=window, features=features, targets=targets, series=series, stride=stride, horizon=horizon,
                layout=layout, return_index=return_index, nan=nan, normalize=normalize, workflow=workflow,
            ),
            OrderConfig(
                batch_size=batch_size, drop_last=drop_last, shuffle=shuffle, seed=seed,
                buffer_partitions=buffer_partitions, pieces_per_partition=pieces_per_partition,
                buffer_bytes=buffer_bytes, rank=rank, world_size=world_size, device=device,
            ),
            ReadConfig(  # validated here, before anything is opened
                storage_options=storage_options, partition_bytes=partition_bytes, partition_rows=partition_rows,
                threads=threads, retries=retries, timeout=timeout, on_error=on_error, strict=strict,
                cache_dir=cache_dir, cache_bytes=cache_bytes, index=index, prefetch_partitions=prefetch_partitions,
                next_pass_seconds=next_pass_seconds,
            ),
            opened,
        )  # fmt: skip
        self.spec: WindowSpec = resolved.spec  # every setting, resolved: what planning and the runtime read (see spec)
        self.device_traffic = Traffic()  # bytes this process's passes sent to ``spec.device``
        self._read_ahead = nextpass.Slot()  # the next pass's first buffer, read ahead (see nextpass)
        self.source: Source = resolved.source
        self._series_from_manifest = resolved.series_from_manifest
        self.skipped: list[SkippedPartition] = resolved.skipped
        self._workflow: Any = resolved.workflow
        spec = self.spec
        check_columns(self.source, spec, spec.series)
        self._y_dtype = output_dtype(self.source, list(spec.targets))
        self.source.set_window(spec.span, spec.stride)
        self._init_passes(spec.rank, spec.world_size)  # epochs, ranks, resume state (see passes)
        self._identity: dict | None = None
        self._series: SeriesTable | None = None
        self._normalize = resolve_normalize(spec.normalize, spec, spec.storage_options)
        self.runs = scan(self.source, spec, spec.series, spec.nan, spec.on_error, self.skipped, spec.threads)
        self.grid = WindowGrid.from_runs(self.runs, spec.span, spec.stride)
        rows = rows_per_partition(self.source.partitions)
        self.row_offsets = np.cumsum(rows) - rows  # (P,) global row of each partition's first row
        self.num_windows = int(self.grid.windows_per_partition.sum())
        names = partition_names(self.source.partitions)
        spread = getattr(self.source, "_manifest", None) or {}
        spread = spread.get("manifest", {}).get("version", 1) >= 2  # chunks of a series by design
        order_remedy = "" if spread else check_series_order(self.runs, names, spec.series, spec.strict)
        check_windows(self.source, spec, self.runs, self.num_windows, order_remedy, self.skipped)
        self.left_out = check_omissions(self, series is not SERIES_FROM_MANIFEST or self._series_from_manifest)
        # the pool order's units (plan data: they depend on the source and the settings only)
        self._unit_bounds = self._units_under(spec)
        if spec.buffer_bytes is not None:  # the budget holds too few units to mix like a global shuffle
            bytes_per_row = self._read_values().row_bytes
            description = self.source.description
            warn_if_few_units(spec, self._unit_bounds, bytes_per_row, description, self.grid, self._units_under)
        self._telemetry = Telemetry(time.perf_counter_ns() - opening)

    # -- the pass protocol (epochs, len, resume state, ranks, pickling: see passes) ----------

    _process_local = ()  # (the read-ahead's `nextpass.Slot` pickles empty: its threads and buffers stay here)

    def _epoch_changes(self, epoch: int | None) -> None:
        if epoch is None:
            nextpass.release(self._read_ahead)
        else:
            nextpass.keep_only(self._read_ahead, epoch)  # a first buffer read ahead for another epoch is let go

    def __len__(self) -> int:
        """Exactly how many batches this rank yields per epoch, whatever ``num_workers`` is."""
        world_size = self._topology()[1]
        if 0 < self.num_windows < world_size:
            raise ConfigError(
                f"world_size={world_size} is larger than the {self.num_windows:,} windows of "
                f"{self.source.description}: some ranks would get no window and yield 0 batches; "
                "use fewer ranks, more data, or a smaller window or stride"
            )
        return super().__len__()

    # -- public API -------------------------------------------------------------------------

    @property
    def config(self) -> Config:
        """The settings grouped by keyword, as resolved (``settings.config``): views of ``spec``, the one value;
        ``WindowDataset(data, **ds.config.keywords())`` opens the same dataset."""
        return Config.of(self.spec)

    # settings the dataset held as attributes before they were one value: read from it
    device = property(lambda self: self.spec.device, doc="The torch device batches are cut on, or ``None``.")
    on_error = property(lambda self: self.spec.on_error, doc="``on_error`` (``spec.on_error``).")
    next_pass_seconds = property(lambda self: self.spec.next_pass_seconds, doc="``spec.next_pass_seconds``.")

    @property
    def partitions(self) -> list:
        """The source's partitions (name, rows) in canonical order."""
        return self.source.partitions

    @property
    def windows_per_partition(self) -> np.ndarray:
        """``(P,)`` windows of each partition."""
        return self.grid.windows_per_partition

    def __iter__(self) -> Iterator[Any]:
        # Not a generator itself: the resume position is fixed when iter() is called, so that
        # StatefulDataLoader's state_dict() right after iter() already sees this pass.
        epoch, world = self._begin_pass()  # every DataLoader worker of this pass claims the same epoch
        elastic = self._resumer.elastic_share(epoch, world, self._shape())
        if elastic is not None:  # a state of another topology: this reader's part of the rest of the epoch
            stream = elastic_batches(
                self._stream_values(), epoch, *elastic, self._resumer.step, self._resumer.end_elastic
            )
            return watched(self, shared(stream))
        reader, skip = self._resumer.begin(epoch, world, len(self))
        progress = self._resumer.progress  # this pass's own count: another iter() never moves it
        planned = nextpass.planned(self._next_pass(), epoch, reader, skip)  # the plan a read-ahead was started from
        batches = self._batches(planned or self._plan(reader, skip, epoch), progress, (epoch, reader))
        if progress is not None:
            self._resumer.track(progress)
            weakref.finalize(batches, self._resumer.end, progress)  # also a pass dropped before its first batch
        return watched(self, shared(batches))  # in a DataLoader worker: each batch in a reused shared slot (see slots)

    def stats(self, all_ranks: bool = False) -> Stats:
        """Where the current (or last) pass's time went in this process, and a verdict (see ``telemetry``).

        Args:
            all_ranks: Gather every rank's figures and name the slowest rank (a collective under an
                initialised ``torch.distributed``: call it on every rank).
        """
        return rank_stats(self, all_ranks)

    def watch(self, loader: Any) -> Iterator[Any]:
        """``loader``'s batches, the training loop's exposed wait measured in this process (use it with
        DataLoader workers, whose stages run in the workers; without workers iterating is enough)."""
        return watch_loader(self, loader)

    def close(self) -> None:
        """Drop the next pass's first buffer if it was read ahead (``next_pass_seconds``)."""
        nextpass.release(self._read_ahead)

    def split(
        self, valid: float | None = None, *, at: Any = None, time: Any = None, embargo: int = 0
    ) -> tuple[WindowDataset, WindowDataset]:
        """Temporal ``(train, valid)`` split per series; both stream, shard and resume like this one.

        Positions count a series' rows in canonical order from 0. A window starting at ``p`` is in
        train when ``p + window + horizon <= cut`` and in valid when ``p >= cut + embargo``; nothing
        is re-scanned (docs/splits.md).

        Args:
            valid: Fraction of each series' ``n`` rows after the cut: ``cut = floor(n * (1 - valid))``.
            at: Split by time instead: ``cut`` is the series' first row whose ``time`` is ``>= at``
                (``n`` if none). Reads the ``time`` column once.
            time: The time column for ``at``.
            embargo: Rows after the cut where no valid window may start (e.g. ``window``).
        """
        if self._series is None:
            one_series = self.spec.series is None and not isinstance(self.source, ArraySource)
            rows = rows_per_partition(self.source.partitions).tolist()
            self._series = SeriesTable.from_runs(self.runs, one_series=one_series, num_rows=rows)
        if time is not None:
            self.source.check_columns([time], {time: "time column"})
        read_time = lambda i: self.source.read(i, [time])[time]
        cuts = cut_positions(
            self._series, valid=valid, at=at, time=time, read_time=read_time, threads=self.spec.threads
        )
        train, held_out = split_grid(self.grid, self._series, cuts, self.spec.span, embargo)
        return self._with_grid(train, "train"), self._with_grid(held_out, "valid")

    # -- internals --------------------------------------------------------------------------

    def _with_grid(self, grid: WindowGrid, part: str) -> WindowDataset:
        """A copy reading the same partitions but only the windows of ``grid``."""
        out = copy.copy(self)
        out.grid = grid
        out.num_windows = int(grid.windows_per_partition.sum())
        out._identity = None
        out._resumer = Resumer()
        out.device_traffic = Traffic()  # its own passes' bytes
        out._epochs = copy.copy(self._epochs)
        out._read_ahead = nextpass.Slot()  # not the parent's read-ahead (see nextpass)
        if out.num_windows == 0:
            raise DataError(
                f"the {part} part of the split of {self.source.description} holds no windows "
                f"({self.spec.describe_span()}); use a smaller embargo, "
                "another valid fraction or cut time, or a smaller window"
            )
        return out

    def _read_values(self) -> ReadValues:
        """What a pass's readers need (``runtime.values``): built here only, by reference."""
        return ReadValues(
            self.source, self.spec, self.grid, self.row_offsets, self._y_dtype, self._scale(),
            self.skipped, reads_telemetry(self),  # (None while opening, or off)
            8 * len(self.spec.features) if getattr(self, "_normalize", None) == "sample" else 0,
        )  # fmt: skip

    def _pass_values(self, counted: bool = True) -> PassValues:
        """A pass's values (``runtime.values``); ``counted=False``: a stream of a mixture or an elastic
        resume (``runtime.streams``), counting nothing in the resume state and reading nothing ahead."""
        output = self._workflow if self._workflow is not None else TorchOutput(self.spec.return_index)
        return PassValues(
            self._read_values(), output=output, allocator=SlotAllocator(),
            normalize=self._per_batch_normalize(), device=feed_for(self),
            next_pass=self._next_pass() if counted else None,
            step=self._resumer.step if counted else no_count, end=self._resumer.end if counted else no_count,
        )  # fmt: skip

    def _next_pass(self) -> NextPass:
        """The next pass's read-ahead hook (``speedups.nextpass``)."""
        return NextPass(
            self._read_ahead, self.spec, self.source, self.grid,
            self._normalize, self.row_offsets, epoch=lambda: self.epoch, worker_passes=lambda: self._worker_passes,
            plan=self._plan, pass_values=self._pass_values,
        )  # fmt: skip

    def _batches(
        self, plan: Any, progress: Any = None, this_pass: tuple | None = None, counted: bool = True
    ) -> Iterator[Any]:
        return pool_batches(self._pass_values(counted), plan, progress, this_pass)

    def _stream_values(self) -> StreamValues:
        """What a mixture or an elastic resume reads this dataset's reader streams from (``runtime.streams``)."""
        return StreamValues(self._pass_values(counted=False), self._unit_bounds)

    def _shape(self) -> tuple[int, int, bool]:
        """``(num_windows, batch_size, drop_last)``: what the division of an epoch depends on."""
        return self.num_windows, self.spec.batch_size, self.spec.drop_last

    def _per_batch_normalize(self) -> str | None:
        """``normalize`` for ``stream``: global statistics are applied in ``decode``, once per partition."""
        return None if isinstance(self._normalize, tuple) else self._normalize

    def _fingerprint(self) -> dict:
        if self._identity is None:
            rows = rows_per_partition(self.source.partitions)
            files = self.source.identity_digest() if hasattr(self.source, "identity_digest") else None
            self._identity = fingerprint(self.grid, rows, self.spec, files)
        return self._identity

    def _plan(self, world: World, skip_batches: int = 0, epoch: int | None = None) -> PoolPlan:
        epoch = self.epoch if epoch is None else epoch  # (whole partitions: a pool of buffer_partitions of them)
        reads = self._read_values()
        return plan_for(self.spec, self.grid, self._unit_bounds, reads.row_bytes, world, skip_batches, epoch)

    def _units_under(self, spec: WindowSpec) -> Ragged:
        """The pool order's units of this data under ``spec`` (a larger budget merges larger units)."""
        rows = rows_per_partition(self.source.partitions)
        decode_all = getattr(self.source, "decode_units_all", None)
        return unit_bounds(spec, self._read_values().row_bytes, rows, self.source.decode_units, decode_all)

    def _advised_budget(self) -> int | None:
        """The ``buffer_bytes`` the ``PoolWarning`` advises (``planning.budget.advised_budget``)."""
        if self.spec.buffer_bytes is None:
            return None
        reads = self._read_values()
        return advised_budget(self.spec, self._unit_bounds, reads.row_bytes, self.grid, self._units_under)

    def _pool_summary(self) -> dict | None:
        """Predicted reads, resident memory and places per batch of the pool order (``None``: another order)."""
        if self.spec.buffer_bytes is None:
            return None
        return pool_summary(self.spec, self._unit_bounds, self._read_values().row_bytes, grid=self.grid)

    def _scale(self) -> tuple[np.ndarray, np.ndarray] | None:
        return self._normalize if isinstance(self._normalize, tuple) else None

    def __repr__(self) -> str:
        s = self.spec
        return (
            f"WindowDataset({self.source.description!r}, partitions={len(self.partitions)}, "
            f"num_windows={self.num_windows:,}, window={s.window - s.lookback}, stride={s.stride}, horizon={s.horizon}, "
            f"batch_size={s.batch_size}, features={list(s.features)}, targets={list(s.targets)}, series={s.series!r}"
            + (" (from the manifest)" if getattr(self, "_series_from_manifest", False) else "")
            + ")"
        )
