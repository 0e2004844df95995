"""A dataset's settings as one frozen value: every keyword, resolved, and what opening derived.

``config.resolve`` makes it once; planning and the runtime read no other settings value. The window
and order fields are validated here; the reading fields by ``config.ReadConfig``, before opening.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError
from dask_windows.settings.tuning import NEXT_PASS_SECONDS, OPEN_THREADS, RETRIES

__all__ = ["ReadSettings", "WindowSpec"]

LAYOUTS = ("NCL", "NLC")
NAN_POLICIES = ("raise", "drop")
CODE_DTYPES = ("int64", "int32")
#: Dtypes of the buffer's copy of the code channels (``WindowSpec.code_dtype``): a named batch's fields
#: are ``CODE_DTYPES``, widened from a narrower copy when every code fits it (``workflow.apply.bind``).
COPY_CODE_DTYPES = ("int8", "int16", *CODE_DTYPES)


#: Largest window, stride, horizon or size: row arithmetic is int64, with room for sums of two.
MAX_SETTING = 2**61


def _positive_int(name: str, value: object, minimum: int = 1, maximum: int | None = MAX_SETTING) -> int:
    if isinstance(value, np.integer):
        value = int(value)  # numpy ints are accepted everywhere, as set_epoch does
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name}={value!r} must be an int >= {minimum}")
    if value < minimum:
        raise ConfigError(f"{name}={value} must be >= {minimum}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name}={value} is too large: at most 2**61 (rows are counted in int64)")
    return value


def _names(name: str, value: object, allow_none: bool) -> tuple:
    if value is None:
        if allow_none:
            return ()
        raise ConfigError(f"{name} is required: pass the list of columns to stack as channels")
    if isinstance(value, (str, int)):
        value = [value]
    out: tuple = tuple(value)  # type: ignore[arg-type]
    if not allow_none and not out:
        raise ConfigError(f"{name}=[] is empty: pass at least one column")
    if len(set(out)) != len(out):
        raise ConfigError(f"{name}={list(out)!r} repeats a column")
    return out


@dataclass(frozen=True)
class ReadSettings:
    """``WindowDataset``'s reading keywords, declared once: ``config.ReadConfig`` validates them before
    anything is opened, and ``WindowSpec`` carries them."""

    storage_options: dict | None = None
    partition_bytes: int | None = None
    partition_rows: int | None = None
    threads: int = OPEN_THREADS
    retries: Any = RETRIES
    timeout: float | None = None
    on_error: str = "raise"
    strict: bool = False
    cache_dir: str | os.PathLike | None = None
    cache_bytes: int | None = None
    index: Any = None
    prefetch_partitions: int = 1
    next_pass_seconds: float = NEXT_PASS_SECONDS


@dataclass(frozen=True, kw_only=True)
class WindowSpec(ReadSettings):
    """A dataset's settings (``WindowDataset.spec``): the one value planning and the runtime read.

    Each field but the four below is ``WindowDataset``'s keyword of that name as resolved:
    ``features`` and ``targets`` tuples, ``series`` a column or ``None``, ``device`` a
    ``torch.device`` or ``None``, ``buffer_bytes`` ``None`` for whole partitions, and
    ``pieces_per_partition`` ``1`` (resume states record it).

    Attributes:
        code_features: The last ``K`` features are integer codes (``NCL`` only), gathered as
            ``(B, K, L)`` from an integer copy of their rows (``runtime.batch.Gatherer``).
        code_dtype: The dtype of that copy: ``"int64"``, ``"int32"``, or ``"int16"`` / ``"int8"``
            where every code fits.
        lookback: Rows of ``window`` a workflow reads before each window it yields (messages quote
            the window asked for).
        given_series: The ``series`` keyword where it is not the column ``series`` holds, else
            ``None``: what ``config`` shows and reopens.
    """

    features: tuple
    targets: tuple = ()
    series: object = None
    window: int = 1
    stride: int = 1
    horizon: int = 0
    batch_size: int = 1
    drop_last: bool = False
    shuffle: bool = True
    seed: int = 0
    buffer_partitions: int = 2
    pieces_per_partition: int = 1
    layout: str = "NCL"
    return_index: bool = False
    nan: str = "raise"
    buffer_bytes: int | None = None
    code_features: int = 0
    code_dtype: str = "int64"
    lookback: int = 0
    given_series: Any = field(default=None, compare=False, repr=False)
    normalize: Any = None
    workflow: Any = None
    rank: int | None = None
    world_size: int | None = None
    device: Any = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "features", _names("features", self.features, allow_none=False))
        set_(self, "targets", _names("targets", self.targets, allow_none=True))
        for name, minimum in (
            ("window", 1),
            ("stride", 1),
            ("horizon", 0),
            ("batch_size", 1),
            ("buffer_partitions", 1),
            ("pieces_per_partition", 1),
            ("prefetch_partitions", 0),
            ("seed", 0),
        ):
            limit = None if name == "seed" else MAX_SETTING
            set_(self, name, _positive_int(name, getattr(self, name), minimum, limit))
        if self.buffer_bytes is not None:
            set_(self, "buffer_bytes", _positive_int("buffer_bytes", self.buffer_bytes, 1))
        set_(self, "code_features", _positive_int("code_features", self.code_features, 0))
        set_(self, "lookback", _positive_int("lookback", self.lookback, 0, None))
        if self.code_features > len(self.features):
            raise ConfigError(f"code_features={self.code_features} is more than the {len(self.features)} features")
        if self.code_dtype not in COPY_CODE_DTYPES:
            raise ConfigError(f"code_dtype={self.code_dtype!r} must be one of {COPY_CODE_DTYPES}")
        if self.code_features and self.layout != "NCL":
            raise ConfigError(f"code_features={self.code_features} needs layout='NCL' (the codes are (B, K, L))")
        if self.layout not in LAYOUTS:
            raise ConfigError(f"layout={self.layout!r} must be one of {LAYOUTS}")
        if self.nan not in NAN_POLICIES:
            raise ConfigError(f"nan={self.nan!r} must be one of {NAN_POLICIES}")
        if self.horizon and not self.targets:
            raise ConfigError(f"horizon={self.horizon} needs targets=[...]: the horizon rows are targets")
        if self.series is not None and self.series in self.features:
            raise ConfigError(f"series={self.series!r} is also a feature; the series column is a key, not a channel")

    @property
    def span(self) -> int:
        """Rows one window needs inside its run: ``window + horizon``."""
        return self.window + self.horizon

    def describe_span(self) -> str:
        """The rows a window needs, as asked: ``window=104 + horizon=13 + 3 look-back rows of the workflow
        = 120 rows``."""
        asked = f"window={self.window - self.lookback}" + (f" + horizon={self.horizon}" if self.horizon else "")
        if self.lookback:
            asked += f" + {self.lookback} look-back rows of the workflow"
        return f"{asked} = {self.span} rows" if self.lookback or self.horizon else asked

    @property
    def columns(self) -> tuple:
        """Data columns a partition read must return (features, then new target names)."""
        return self.features + tuple(t for t in self.targets if t not in self.features)
