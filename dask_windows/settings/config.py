"""``WindowDataset``'s keywords in three frozen groups, and their resolution into the one settings value.

``WindowDataset`` hands each keyword, by name, to its group (:class:`WindowConfig`,
:class:`OrderConfig`, :class:`ReadConfig`); the groups' fields are the one list of the keywords
(:data:`KEYWORDS`, from which the command line builds its options). :func:`resolve` turns them,
once, into the ``WindowSpec`` planning and the runtime read, resolved against the opened source;
``ds.config`` groups it again (:meth:`Config.of`). See docs/configuration.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from dask_windows.errors import ConfigError
from dask_windows.errors.faults import check_on_error
from dask_windows.opening.checks import SERIES_FROM_MANIFEST
from dask_windows.settings.spec import ReadSettings, WindowSpec, _positive_int

__all__ = [
    "DEPRECATED_KEYWORDS",
    "KEYWORDS",
    "Config",
    "OrderConfig",
    "ReadConfig",
    "WindowConfig",
    "group_of",
    "resolve",
]


def _next_pass_seconds(value: Any) -> float:
    """``next_pass_seconds`` validated: a number ``>= 0`` (see ``speedups.nextpass``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(
            f"next_pass_seconds={value!r} must be a number of seconds >= 0 (how long the next pass's first "
            "buffer, read while the last buffer is drained, waits for that pass); 0 turns it off"
        )
    return float(value)


@dataclass(frozen=True)
class WindowConfig:
    """What a window is and what a batch holds: ``WindowDataset``'s keywords of these names."""

    window: int
    features: Any = None
    targets: Any = None
    series: Any = SERIES_FROM_MANIFEST
    stride: int = 1
    horizon: int = 0
    layout: str = "NCL"
    return_index: bool = False
    nan: str = "raise"
    normalize: Any = None
    workflow: Any = None


@dataclass(frozen=True)
class OrderConfig:
    """Which windows go into which batch, in what order, on which rank and device; exactly one of
    ``pieces_per_partition`` (whole partitions) and ``buffer_bytes`` (the pool order) is set once resolved."""

    batch_size: int = 256
    drop_last: bool = False
    shuffle: bool = True
    seed: int = 0
    buffer_partitions: int = 2
    pieces_per_partition: int | None = None
    buffer_bytes: int | None = None
    rank: int | None = None
    world_size: int | None = None
    device: Any = None


@dataclass(frozen=True)
class ReadConfig(ReadSettings):
    """How the data is opened and read, validated when made (before anything is opened); ``retry`` (not a
    keyword) is the policy ``retries`` and ``timeout`` make together."""

    retry: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        from dask_windows.sources.retry import resolve_retry, with_deadline

        set_ = object.__setattr__
        set_(self, "threads", _positive_int("threads", self.threads))
        for name in ("partition_bytes", "partition_rows"):
            if getattr(self, name) is not None:
                set_(self, name, _positive_int(name, getattr(self, name)))
        set_(self, "on_error", check_on_error(self.on_error))
        set_(self, "next_pass_seconds", _next_pass_seconds(self.next_pass_seconds))
        set_(self, "retry", with_deadline(resolve_retry(self.retries), self.timeout))

    def source_options(self) -> dict:
        """The keyword arguments of ``open_source`` these settings give (besides storage, retry, errors)."""
        options: dict = {"threads": self.threads}
        if self.cache_dir is not None:
            options.update(cache_dir=self.cache_dir, cache_bytes=self.cache_bytes)
        for name in ("partition_bytes", "partition_rows"):
            if getattr(self, name) is not None:
                options[name] = getattr(self, name)
        if self.index is not None:
            options["index"] = self.index  # Parquet paths only (see sources.footer_index)
        return options


_GROUPS = {"window": WindowConfig, "order": OrderConfig, "read": ReadConfig}

#: Every keyword of ``WindowDataset`` but ``data``, and the value that holds it.
KEYWORDS: dict[str, str] = {f.name: group for group, kind in _GROUPS.items() for f in fields(kind) if f.init}

#: Keywords ``WindowDataset`` still accepts, warns about and ignores (``options.deprecated_read_workers``).
DEPRECATED_KEYWORDS = ("read_workers", "read_deadline")


def group_of(keyword: str, caller: str = "WindowDataset") -> str:
    """The value (``"window"``, ``"order"`` or ``"read"``) that holds ``keyword``; a ``TypeError``
    naming ``caller`` when ``keyword`` is none of ``WindowDataset``'s, as Python's own."""
    try:
        return KEYWORDS[keyword]
    except KeyError:
        raise TypeError(f"{caller}() got an unexpected keyword argument {keyword!r}") from None


class Config(NamedTuple):
    """A dataset's settings grouped by keyword (``WindowDataset.config``), views of its ``WindowSpec``."""

    window: WindowConfig
    order: OrderConfig
    read: ReadConfig

    @classmethod
    def of(cls, spec: WindowSpec) -> Config:
        """The three groups holding ``spec``'s fields (the series and the order as their keywords name them)."""
        held = {f.name: getattr(spec, f.name) for f in fields(spec)}
        held["series"] = spec.series if spec.given_series is None else spec.given_series
        held["window"] = spec.window - spec.lookback  # the window asked for (a workflow reads look-back rows more)
        if spec.workflow is not None:
            from dask_windows.workflow.batch import NamedBatches

            if isinstance(spec.workflow, NamedBatches):  # its roles chose the columns, which it takes as none
                held["features"] = held["targets"] = None
        held["pieces_per_partition"] = None if spec.buffer_bytes is not None else spec.pieces_per_partition
        return cls(*(kind(**{f.name: held[f.name] for f in fields(kind) if f.init}) for kind in _GROUPS.values()))

    def keywords(self) -> dict:
        """The keywords that open the same dataset again: ``WindowDataset(data, **config.keywords())``."""
        return {name: getattr(getattr(self, group), name) for name, group in KEYWORDS.items()}


class Resolved(NamedTuple):
    """What :func:`resolve` returns: the settings, the source and what the dataset wires."""

    spec: WindowSpec
    source: Any  # the opened source, wrapped by the workflow when there is one
    skipped: list  # partitions the source left out when it was opened
    workflow: Any  # the workflow's batch emitter, or None
    series_from_manifest: bool  # the series column came from a convert manifest (``repr`` says so)


def resolve(
    given: WindowConfig, order_given: OrderConfig, read: ReadConfig, open_source: Callable[[ReadConfig, Any], Any]
) -> Resolved:
    """The settings of ``WindowDataset``'s keywords as one value, resolved against the source that
    ``open_source(read, series)`` (the I/O, passed in) opens.

    Raises:
        ConfigError: A setting is invalid (the message names the keyword, the rule and the remedy).
    """
    from dask_windows.ondevice import resolve_device
    from dask_windows.settings.options import deprecated_pieces, piece_budget, resolve_order
    from dask_windows.sources import ArraySource, is_series_vector

    device = resolve_device(order_given.device)  # None: the host path (see ondevice)
    series = series_given = given.series
    asked_manifest = series is SERIES_FROM_MANIFEST
    source = open_source(read, None if asked_manifest else series)
    pieces, buffer_bytes = order_given.pieces_per_partition, order_given.buffer_bytes
    asked_pieces = pieces  # a deprecated pieces_per_partition > 1 is served by the pool order (options)
    pieces = deprecated_pieces(pieces, device)
    pool_bytes = resolve_order(pieces, buffer_bytes, source)  # device mode too: its pool on the device (ondevice.pool)
    served = pieces is None and asked_pieces is not None and buffer_bytes is None  # budget once the columns are known
    manifest_series = getattr(source, "manifest_series", None)
    from_manifest = asked_manifest and manifest_series is not None
    series = manifest_series if from_manifest else (None if asked_manifest else series)
    skipped = list(source.skipped)
    if is_series_vector(series):  # the source already cut the array into series
        series = None
    features, targets, window, return_index = given.features, given.targets, given.window, given.return_index
    emitter, code_features, code_dtype, lookback = None, 0, "int64", 0
    if given.workflow is not None:  # pieces transformed as they are read, named batches (dask_windows.workflow)
        from dask_windows.workflow.apply import bind

        emitter, source, chosen = bind(
            given.workflow, source, features=features, targets=targets, series=series, window=window,
            horizon=given.horizon, layout=given.layout, return_index=return_index,
            normalize=given.normalize, storage_options=read.storage_options,
        )  # fmt: skip
        features, targets, series = chosen["features"], chosen["targets"], chosen["series"]
        window, return_index, code_features = chosen["window"], chosen["return_index"], chosen["code_features"]
        code_dtype, lookback = chosen["code_dtype"], chosen["lookback"]
        if device is not None:  # the device path cuts batches without the workflow's step
            raise ConfigError(
                f"workflow= and device={order_given.device!r} cannot be combined yet: the workflow's operations, its "
                "look-back rows and named batches are made on the host, and device mode cuts batches on the device "
                "without them. Pass device=None and move the batches with "
                "dw.DevicePrefetcher(DataLoader(ds, batch_size=None, pin_memory=True), device) (it moves named "
                "batches too, overlapping the copy with compute on CUDA); see docs/workflows.md"
            )
    if features is None and isinstance(source, ArraySource):
        features = source.column_names()
    if served:  # the memory the piece order held: two buffers of buffer_partitions partitions
        pool_bytes = piece_budget(source, order_given.buffer_partitions, features, targets, given.stride) or pool_bytes
    as_given = {f.name: getattr(g, f.name) for g in (given, order_given, read) for f in fields(g) if f.init}
    spec = WindowSpec(**{**as_given, **dict(  # every keyword as given, but those resolved here
        features=features, targets=targets, series=series, window=window, return_index=return_index,
        pieces_per_partition=1 if pieces is None else pieces, buffer_bytes=pool_bytes, device=device,
        code_features=code_features, code_dtype=code_dtype, lookback=lookback,
        given_series=series_given if series is None and given.workflow is None else None,
    )})  # fmt: skip
    return Resolved(spec, source, skipped, emitter, from_manifest)
