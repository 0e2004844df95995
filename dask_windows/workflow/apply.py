"""A fitted workflow applied while the loader streams: a source whose reads come out transformed.

``bind`` wraps the dataset's source in a ``WorkflowSource``: every read returns the workflow's outputs
as float32, computed on the reader threads and kept across epochs (``cache.TransformCache``). Lookback:
a lag, difference or limited forward fill needs up to ``P`` earlier rows of its series; the dataset is
given windows ``P`` rows longer, and ``batch`` drops those rows, so each window's values equal a groupby
over the whole series. The price: the first ``P`` starts of each series yield no window (as in PyTorch
Forecasting), and the ``nan=`` policy also looks at the ``P`` lookback rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError
from dask_windows.workflow.artifact import check_source
from dask_windows.workflow.batch import SERIES_CODE, Emitter, NamedBatches
from dask_windows.workflow.cache import TransformCache
from dask_windows.workflow.core import Workflow

__all__ = [
    "WorkflowReader", "WorkflowSource", "bind", "code_bound", "copy_dtype", "dictionary_inputs", "narrow_dtype",
]  # fmt: skip


class WorkflowSource:
    """``source`` whose reads return the fitted ``wf``'s outputs (and its own columns, as they are);
    ``lookback``: rows read before each window (NaN there from lags become 0: never yielded)."""

    def __init__(self, source: Any, wf: Workflow, lookback: int) -> None:
        import pyarrow as pa

        self.inner, self.wf, self.lookback = source, wf, lookback
        self.raw = wf.inputs
        self.made = [*wf.produced(), SERIES_CODE]
        self.description = source.description
        self.partitions = source.partitions
        self.skipped = source.skipped
        self.default_pieces_per_partition = source.default_pieces_per_partition
        self.files = None  # (checks.check_column_types: the outputs are all float32)
        if hasattr(source, "dictionary_columns"):  # Parquet: the categories read as Arrow dictionaries
            source.dictionary_columns = frozenset(dictionary_inputs(wf))
        self._schemas = [pa.schema([(c, pa.float32()) for c in self.made])]  # checks.output_dtype: float32
        self.cache = TransformCache(wf.cache_bytes, wf.cache_dir, wf.cache_disk_bytes)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # unpickling: not set yet
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_schemas"}

    def __setstate__(self, state: dict) -> None:
        import pyarrow as pa

        self.__dict__.update(state)
        self._schemas = [pa.schema([(c, pa.float32()) for c in self.made])]

    def transform(self, raw: dict, columns: Sequence) -> dict:
        """The workflow applied to raw columns of one row range; ``columns`` of it: outputs as float32,
        the source's other columns as read (a time column for ``split(at=...)``)."""
        out = self.wf.transform({c: raw[c] for c in self.raw}, self.lookback)
        return {c: np.asarray(out[c], np.float32) if c in self.made else _numpy(raw[c]) for c in columns}

    def _inputs(self, columns: Sequence) -> list:
        return self.raw + [c for c in columns if c not in self.made and c not in self.raw]

    def transform_range(self, raw: dict, columns: Sequence, extra: int) -> dict:
        """``transform`` of a row range read with ``extra`` rows before it (``halo``), those rows dropped."""
        out = self.transform(raw, columns)
        return {c: v[extra:] for c, v in out.items()} if extra else out

    def halo(self, ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """Each range with the ``lookback`` rows before it (within the partition), so a lag or difference
        in its first rows does not reach before the range where a window joining it to those rows would."""
        return [(max(0, lo - self.lookback), hi) for lo, hi in ranges]

    def column_names(self) -> list:
        return list(dict.fromkeys([*self.made, *self.inner.column_names()]))

    def check_columns(self, columns: Sequence, what: dict) -> None:
        self.inner.check_columns([c for c in columns if c not in self.made], what)

    def read(self, index: int, columns: Sequence) -> dict:
        read = lambda: self.transform(self.inner.read(index, self._inputs(columns)), columns)
        return self.cache.get((index, None, None, tuple(columns)), read)

    def read_rows(self, index: int, columns: Sequence, lo: int, hi: int) -> dict:
        read = lambda wide: [self.inner.read_rows(index, self._inputs(columns), *wide[0])]
        return self.kept_ranges(index, columns, [(lo, hi)], read)[0]

    def read_ranges(self, index: int, columns: Sequence, ranges: Sequence[tuple[int, int]]) -> list[dict]:
        return self.kept_ranges(
            index, columns, ranges, lambda wide: self.inner.read_ranges(index, self._inputs(columns), wide)
        )

    def kept_ranges(self, index: int, columns: Sequence, ranges: Sequence[tuple[int, int]], read: Any) -> list[dict]:
        """Rows ``ranges`` of partition ``index`` transformed: those kept (``cache``), the others read with
        ``read(ranges with their halo)`` in one call, transformed and kept."""
        keys = [(index, lo, hi, tuple(columns)) for lo, hi in ranges]
        out = [self.cache.find(key) for key in keys]
        todo = [i for i, found in enumerate(out) if found is None]
        if todo:
            wide = self.halo([ranges[i] for i in todo])
            for i, piece, (a, _) in zip(todo, read(wide), wide):
                out[i] = self.cache.keep(keys[i], self.transform_range(piece, columns, ranges[i][0] - a))
        return out  # type: ignore[return-value]

    def read_chunks(self, index: int, columns: Sequence) -> Any:
        yield self.read(index, columns)

    def reader(self, indices: Sequence[int], columns: Sequence) -> WorkflowReader:
        if self.cache.budget:
            from dask_windows.runtime.detect import detect_worker
            from dask_windows.workflow.artifact import checksum, to_json

            _, workers = detect_worker()  # a rank's workers share cache_bytes, as they share buffer_bytes
            self.cache.check(checksum(to_json(self.wf)), workers)  # once a pass: a refit workflow's rows read again
        return WorkflowReader(self, self.inner.reader(indices, self._inputs(columns)), columns)


class WorkflowReader:
    """The inner source's reader of one pass (it may read ahead), its reads transformed."""

    def __init__(self, source: WorkflowSource, inner: Any, columns: Sequence) -> None:
        self.source, self.inner, self.columns = source, inner, list(columns)
        self.indices = inner.indices

    def read(self, index: int) -> dict:
        read = lambda: self.source.transform(self.inner.read(index), self.columns)
        return self.source.cache.get((index, None, None, tuple(self.columns)), read)

    def read_rows(self, index: int, lo: int, hi: int) -> dict:
        read = lambda wide: [self.inner.read_rows(index, *wide[0])]
        return self.source.kept_ranges(index, self.columns, [(lo, hi)], read)[0]

    def read_ranges(self, index: int, ranges: Sequence[tuple[int, int]]) -> list[dict]:
        return self.source.kept_ranges(index, self.columns, ranges, lambda wide: self.inner.read_ranges(index, wide))

    def close(self) -> None:
        self.inner.close()


def dictionary_inputs(wf: Workflow) -> list[str]:
    """String input columns that only ``Categorify`` reads first: read as Arrow dictionaries, they are
    mapped to codes through their distinct values (``ops._dictionary_codes``), no Python string per row."""
    from dask_windows.workflow.ops import Categorify

    read: set[str] = set()  # columns an operation read before
    found = []
    for op in wf.ops:
        if isinstance(op, Categorify):
            found += [c for c in op.columns if c not in read and (wf.schema or {}).get(c) == "string"]
        read.update(op.inputs)
    return [c for c in found if c not in (wf.series, wf.time)]


def _numpy(values: Any) -> Any:
    """A column the source returned as an Arrow array (``dictionary_columns``) as numpy; others as they are."""
    return values if isinstance(values, np.ndarray) else np.asarray(values.to_numpy())


def bind(workflow: Any, source: Any, **settings: Any) -> tuple[Emitter, WorkflowSource, dict]:
    """Wrap the opened ``source`` for ``workflow`` (a fitted ``Workflow``, ``Workflow.named(...)`` or a saved
    one's path/URL) and adjust the dataset's ``settings`` (``features``, ``targets``, ``series``, ``window``,
    ``horizon``, ``layout``, ``return_index``, ``normalize``, ``storage_options``). Returns ``(emitter,
    wrapped source, settings)``: the settings to build the spec from, ``window`` including the look-back
    rows, with ``code_features``, ``code_dtype`` and ``lookback``.
    """
    named = workflow if isinstance(workflow, NamedBatches) else None
    wf = named.wf if named is not None else workflow
    if isinstance(wf, str):
        wf = Workflow.load(wf, settings.get("storage_options"))
    if not isinstance(wf, Workflow):
        raise ConfigError(
            f"workflow={workflow!r} must be a fitted Workflow, Workflow.named(...) or a saved file's path"
        )
    if not wf.fitted:
        raise ConfigError("workflow= is not fitted; call wf.fit(data) (or load a saved one) first")
    if settings.get("normalize") is not None:
        raise ConfigError("normalize= and workflow= both scale the data; use Normalize in the workflow instead")
    series = settings.get("series")
    if series is not None and wf.series is not None and series != wf.series:
        raise ConfigError(f"series={series!r} differs from the workflow's series column {wf.series!r}; drop one")
    series = wf.series if series is None else series
    check_source(wf, source)
    features, targets = settings.get("features"), settings.get("targets")
    horizon = settings["horizon"]
    if named is not None:
        if features is not None or targets is not None:
            raise ConfigError("with a named batch the workflow's roles choose the columns; leave features/targets out")
        if settings["layout"] != "NCL":
            raise ConfigError("a named batch is (B, C, L): use layout='NCL'")
        if wf.known and not horizon:
            raise ConfigError(f"known={list(wf.known)} are yielded over the horizon: pass horizon > 0")
        # The series code rides last among the targets: one value per window at horizon 0 (``H`` with a
        # horizon), where as a feature channel it would be gathered ``L`` times (1/8 more of the gather at 7 channels).
        features = [*wf.continuous, *wf.categorical] or [SERIES_CODE]  # (a feature channel is needed)
        targets = [*wf.target, *(wf.known if horizon else ()), SERIES_CODE]
        # The categories, last among the features, are gathered as int64 from a copy the buffer casts once
        # per row (``WindowSpec.code_features``), not cast from float32 for every window's L rows.
        codes = len(wf.categorical)
    else:
        features = list(features) if features is not None else [*wf.continuous, *wf.categorical]
        targets = list(targets) if targets is not None else list(wf.target)
        codes = 0
    columns = [c for c in [*features, *targets] if c != SERIES_CODE]
    lookback = wf.lookback(columns)
    wrapped = WorkflowSource(source, wf, lookback)
    code_dtype = None if named is None or named.code_dtype != "narrow" else narrow_dtype(wf)
    emitter = Emitter(wf, named, lookback, settings["layout"], horizon, bool(targets), settings["return_index"],
                      code_dtype)  # fmt: skip
    index = settings["return_index"] or (named is not None and named.index)
    out = {"features": features, "targets": targets or None, "series": series,
           "window": settings["window"] + lookback, "return_index": index, "code_features": codes,
           "code_dtype": copy_dtype(wf, named.code_dtype) if named is not None else "int64",
           "lookback": lookback}  # fmt: skip
    return emitter, wrapped, out


def copy_dtype(wf: Workflow, code_dtype: str) -> str:
    """The dtype of the buffer's copy of the categorical channels (``WindowSpec.code_dtype``): the narrowest
    integer holding every code, where each categorical output is written last by ``Categorify`` (codes
    ``0 .. cardinality - 1``), else ``code_dtype``, the named batch's own."""
    if code_dtype == "narrow":  # (``narrow_dtype``: never narrower than this copy)
        code_dtype = "int64"
    bound = code_bound(wf, wf.categorical)
    if bound is None:
        return code_dtype  # codes of unknown range: as the batch holds them
    for narrow in ("int8", "int16"):
        if bound <= np.iinfo(narrow).max + 1:
            return narrow
    return code_dtype


def code_bound(wf: Workflow, columns: Any) -> int | None:
    """The most codes any of ``columns`` takes (codes ``0 .. n - 1``), each an output written last by
    ``Categorify``; ``None`` where one is not (codes of unknown range)."""
    from dask_windows.workflow.ops import Categorify

    bound = 0
    for column in columns:
        last = [op for op in wf.ops if column in op.outputs()]
        if not last or not isinstance(last[-1], Categorify):
            return None
        bound = max(bound, last[-1].cardinality(column))
    return bound


def narrow_dtype(wf: Workflow) -> str:
    """``named(code_dtype="narrow")``'s dtype: the narrowest of int8 and int16 holding every code of the
    categorical outputs and statics (int8 up to 128 codes), else int64 (too many codes, or a categorical
    not written by ``Categorify``: codes of unknown range)."""
    bound = code_bound(wf, wf.categorical)
    if bound is not None and wf.statics is not None and wf.statics.state:
        bound = max([bound, *(wf.cardinality(c) for c in wf.statics.categorical)])
    for narrow in ("int8", "int16"):
        if bound is not None and bound <= np.iinfo(narrow).max + 1:
            return narrow
    return "int64"
