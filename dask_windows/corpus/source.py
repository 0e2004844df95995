"""List-column corpora: one row per series, the values in a list column, read as they ship.

``ListSource`` opens Parquet (any fsspec URL), Arrow IPC files or streams, a Hugging Face
``datasets`` folder (one split) or a ``datasets.Dataset`` in memory. A *partition* is a Parquet row
group or an Arrow record batch; at open only the list offsets are kept (O(series)). ``read(p)``
gives one partition as flat float32, NaN where a value is null, ``±inf`` or beyond float32 (those
flagged in ``Decoded.infinite``): a corpus serves every non-finite value masked.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dask_windows.corpus.columns import SHAPE_SUFFIX, list_offsets
from dask_windows.corpus.freqs import check_freq, freq_codes
from dask_windows.errors import SchemaError, SourceReadError

__all__ = ["Decoded", "ListSource"]

ARROW_SUFFIXES = (".arrow", ".feather", ".ipc")
SUFFIXES = (".parquet", ".parq", *ARROW_SUFFIXES)


@dataclass(frozen=True)
class Decoded:
    """One partition's series: row ``r``'s channel ``c`` is ``values[starts[r] + c * L_r :][:L_r]``."""

    values: np.ndarray  # (n,) float32, NaN where the file holds null, inf or a value beyond float32
    starts: np.ndarray  # (rows,) int64
    infinite: np.ndarray | None = None  # (n,) bool, where the file held inf or beyond float32 (None: nowhere)


def as_float32(values: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """An Arrow numeric array as float32 with NaN for null, ``±inf`` and beyond float32; where those were.

    The cast of a float64 beyond float32's range gives ``inf``; NaN and infinity are found from
    the minimum and maximum (both finite: every value is), so finite data pay two reductions.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float32)
        if not out.size or (np.isfinite(out.min()) and np.isfinite(out.max())):
            return out, None
    infinite = np.isinf(out)
    if not infinite.any():
        return out, None
    out = out if out.flags.writeable else out.copy()
    out[infinite] = np.nan
    return out, infinite


def _hf_files(fs: Any, root: str, url: str) -> list[str] | None:
    """The Arrow files of a ``datasets`` folder written by ``save_to_disk``, in order; ``None`` if it is not one.

    A ``DatasetDict`` folder (``dataset_dict.json``, one folder per split) is refused: its splits
    are separate data sets (train and test read together would leak), so one must be chosen.
    """
    splits = root.rstrip("/") + "/dataset_dict.json"
    if fs.exists(splits):
        with fs.open(splits, "rb") as f:
            names = json.load(f).get("splits", [])
        first = names[0] if names else "train"
        raise SchemaError(
            f"{url} is a Hugging Face DatasetDict folder of the splits {names}; a corpus reads one split: pass "
            f"its folder, e.g. {url.rstrip('/')}/{first}"
        )
    state = root.rstrip("/") + "/state.json"
    if not fs.exists(state):
        return None
    with fs.open(state, "rb") as f:
        listed = json.load(f).get("_data_files", [])
    return [root.rstrip("/") + "/" + entry["filename"] for entry in listed]


def _check_lengths(lengths: np.ndarray, other: np.ndarray, where: str, name: str, target: str) -> None:
    """A covariate column holds the target's number of steps in every row that has a target."""
    bad = np.flatnonzero((lengths > 0) & (other != lengths))
    if len(bad):
        r = int(bad[0])
        raise SchemaError(
            f"row {r} of {where}: covariate column {name!r} holds {int(other[r])} steps where {target!r} holds "
            f"{int(lengths[r])}; a covariate needs the target's length in every row (pad it with null)"
        )


class ListSource:
    """Series stored one per row in a list column.

    Args:
        data: A Parquet or Arrow IPC file, a folder or glob of them, a list of paths or URLs, a Hugging Face
            ``datasets`` folder (``save_to_disk``; one split of a ``DatasetDict``), or a ``datasets.Dataset``
            (read as it is in memory: renamed, added or mapped columns included).
        target: The list column holding the values (see ``corpus.columns`` for the layouts read).
        covariates: Further list columns (GluonTS's ``feat_dynamic_real``, ``past_feat_dynamic_real``), each
            ``list<float>`` or ``list<list<float>>`` of the target's length per row: served as extra channels
            after the target's (``target_channels`` says where they start).
        freq: The data set's frequency (``"h"``, ``"D"``, ``"W"``, ...) where no ``freq`` column says it
            (and for the rows whose ``freq`` is null).
        storage_options: Passed to fsspec (credentials, endpoint, ...).

    Attributes:
        name: Where the data lives, for messages.
        lengths: ``(S,)`` time steps of each series (0 for a null row).
        channels: ``(S,)`` channels of each series (the target's, then the covariates').
        target_channels: ``(S,)`` the target's channels of each series.
        partition_series: ``(P + 1,)`` first series of each partition, then ``S``.
        freqs: Frequencies met, in order of first appearance by row; ``freq_codes`` ``(S,)`` indexes them.
    """

    def __init__(
        self,
        data: Any,
        *,
        target: str = "target",
        covariates: Sequence[str] = (),
        freq: str | None = None,
        storage_options: dict | None = None,
    ) -> None:
        self.target = target
        self.covariates = tuple(covariates)
        self.storage_options = dict(storage_options or {})
        self.default_freq = None if freq is None else check_freq(freq, "freq")
        self._table: Any = None  # a datasets.Dataset's table (kind "table"): pickles as its files and edits
        self.files, self.kind, self.name = self._resolve(data)
        self._handles: dict[int, Any] = {}
        self._open()

    # -- opening ------------------------------------------------------------------------------

    def _resolve(self, data: Any) -> tuple[list[str], str, str]:
        if isinstance(data, dict) and hasattr(data, "column_names"):  # a datasets.DatasetDict
            raise SchemaError(
                f"this Hugging Face DatasetDict holds the splits {list(data)}; a corpus reads one split: pass "
                f"data[{next(iter(data), 'train')!r}]"
            )
        if hasattr(data, "cache_files") and hasattr(data, "column_names"):  # a datasets.Dataset
            if getattr(data, "_indices", None) is not None:
                raise SchemaError(
                    "this Hugging Face dataset has an indices mapping (after shuffle/select/filter); call "
                    "dataset.flatten_indices() first or pass it unshuffled"
                )
            # Its table as it is in memory: after rename_column, add_column or an in-memory map the cache
            # files no longer say what the dataset holds.
            self._table = data.data
            files = [f["filename"] for f in data.cache_files]
            where = ", ".join(files) if files else "in memory"
            return [f"datasets.Dataset ({where})"], "table", f"datasets.Dataset ({files[0] if files else where})"
        import fsspec

        if isinstance(data, (str, os.PathLike)):
            url = os.fspath(data)
            fs, root = fsspec.core.url_to_fs(url, **self.storage_options)
            hf = _hf_files(fs, root, url) if fs.isdir(root) else None
            if hf is not None:
                return [self._url(fs, p) for p in hf], "arrow-stream", url
        from dask_windows.sources.parquet.footers import list_files

        fs, files, _, description = list_files(data, self.storage_options, SUFFIXES)
        if not files:
            raise FileNotFoundError(f"no Parquet or Arrow files in {description}")
        arrow = [f.lower().endswith(ARROW_SUFFIXES) for f in files]
        if any(arrow) and not all(arrow):
            raise SchemaError(f"{description} mixes Parquet and Arrow files; pass one kind per data set")
        urls = [self._url(fs, f) for f in files]
        return urls, "arrow" if all(arrow) else "parquet", description

    @staticmethod
    def _url(fs: Any, path: str) -> str:
        protocol = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
        if protocol in ("file", "local"):
            return path
        return fs.unstrip_protocol(path)

    def _open(self) -> None:
        lengths: list[np.ndarray] = []
        channels: list[np.ndarray] = []
        own: list[np.ndarray] = []
        counts: list[int] = []
        freqs: list[Any] = []
        self.partitions: list[tuple[int, int]] = []  # (file, row group or record batch)
        for f in range(len(self.files)):
            for unit, table, freq in self._units(f):
                where = self._where(f, unit)
                n, c, _, _ = list_offsets(*self._column(table, self.target), where, self.target)
                own.append(c)
                for name in self.covariates:
                    n_k, c_k, _, _ = list_offsets(*self._column(table, name), where, name)
                    _check_lengths(n, n_k, where, name, self.target)
                    c = c + np.where(n > 0, c_k, 0)
                lengths.append(n)
                channels.append(c)
                counts.append(len(n))
                freqs.append(freq)
                self.partitions.append((f, unit))
        self.lengths = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        self.channels = np.concatenate(channels) if channels else np.zeros(0, np.int64)
        self.target_channels = np.concatenate(own) if own else np.zeros(0, np.int64)
        self.partition_series = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
        self.freqs: list[str] = []
        codes = []
        for given, rows in zip(freqs, counts):
            names, inverse = ([self.default_freq or "unknown"], np.zeros(rows, np.int64)) if given is None else given
            index = []
            for name in names:
                if name not in self.freqs:
                    self.freqs.append(str(name))
                index.append(self.freqs.index(name))
            codes.append(np.asarray(index, np.int64)[inverse] if rows else np.zeros(0, np.int64))
        self.freq_codes = np.concatenate(codes) if codes else np.zeros(0, np.int64)
        self._handles = {}

    def _where(self, f: int, unit: int) -> str:
        what = "row group" if self.kind == "parquet" else "record batch"
        return f"{self.files[f]} ({what} {unit})"

    @staticmethod
    def _column(table: Any, name: str) -> tuple[Any, Any]:
        """``(column, its GluonTS shape column or None)`` of one partition's table or record batch."""
        column = table.column(name)
        shape = table.column(name + SHAPE_SUFFIX) if name + SHAPE_SUFFIX in table.schema.names else None
        if hasattr(column, "combine_chunks"):  # a Parquet row group's table
            column = column.combine_chunks()
            shape = None if shape is None else shape.combine_chunks()
        return column, shape

    def _columns(self, names: Sequence[str], wanted: Sequence[str]) -> list[str]:
        """``wanted`` and the GluonTS shape columns beside them in a file of columns ``names``."""
        return [c for w in wanted for c in (w, w + SHAPE_SUFFIX) if c in names]

    def _units(self, f: int) -> Any:
        """``(unit, its table or record batch, freq codes or None)`` of file ``f``."""
        handle = self._handle(f)
        if self.kind == "parquet":
            names = handle.schema_arrow.names
            self._check_column(names, f)
            cols = self._columns(names, [self.target, *self.covariates]) + (["freq"] if "freq" in names else [])
            for g in range(handle.num_row_groups):
                table = handle.read_row_group(g, columns=cols)
                yield g, table, self._freqs(table, names, f, g)
        else:
            names, batches = handle
            self._check_column(names, f)
            for b, batch in enumerate(batches):
                yield b, batch, self._freqs(batch, names, f, b)

    def _freqs(self, table: Any, names: Sequence[str], f: int, unit: int) -> Any:
        if "freq" not in names:
            return None
        return freq_codes(table.column("freq"), self.default_freq, self._where(f, unit))

    def _check_column(self, names: Sequence[str], f: int) -> None:
        if self.target not in names:
            raise SchemaError(
                f"target {self.target!r} is not a column of {self.files[f]}; available columns: {list(names)}; "
                "pass target= the list column holding the values"
            )
        missing = [c for c in self.covariates if c not in names]
        if missing:
            raise SchemaError(
                f"covariates {missing} are not columns of {self.files[f]}; available columns: {list(names)}"
            )

    def _handle(self, f: int) -> Any:
        """File ``f`` opened in this process: a ``ParquetFile``, or ``(columns, record batches)`` (memory-mapped)."""
        handle = self._handles.get(f)
        if handle is not None:
            return handle
        import fsspec
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.kind == "table":  # a datasets.Dataset: its table as it is now, cut where its columns' chunks are
            table = self._table.table
            handle = (table.schema.names, table.to_batches())
            self._handles[f] = handle
            return handle
        url = self.files[f]
        try:
            fs, path = fsspec.core.url_to_fs(url, **self.storage_options)
            local = "file" in (fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,))
            if self.kind == "parquet":
                handle = pq.ParquetFile(path if local else fs.open(path, "rb"))
            else:
                raw = pa.memory_map(path, "r") if local else pa.BufferReader(fs.cat_file(path))
                try:
                    table = pa.ipc.open_file(raw).read_all()
                except pa.ArrowInvalid:
                    raw.seek(0)
                    table = pa.ipc.open_stream(raw).read_all()
                handle = (table.schema.names, table.to_batches())
        except (OSError, pa.ArrowException) as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise SourceReadError(
                f"cannot read {url}: {exc}; check that it is a Parquet or Arrow IPC file, not truncated"
            ) from exc
        self._handles[f] = handle
        return handle

    # -- reading ------------------------------------------------------------------------------

    @property
    def num_partitions(self) -> int:
        return len(self.partitions)

    def read(self, p: int) -> Decoded:
        """Partition ``p``'s series as one flat float32 array and each row's first value."""
        if self.covariates:
            return self._read_with_covariates(p)
        part, _ = self._read_column(p, self.target)
        return part

    def _read_column(self, p: int, name: str) -> tuple[Decoded, np.ndarray]:
        """Partition ``p``'s column ``name`` alone, flat, and its channels per row."""
        import pyarrow as pa

        f, unit = self.partitions[p]
        handle = self._handle(f)
        try:
            if self.kind == "parquet":
                names = handle.schema_arrow.names
                table = handle.read_row_group(unit, columns=self._columns(names, [name]))
            else:
                table = handle[1][unit]
            lengths, channels, starts, values = list_offsets(*self._column(table, name), self._where(f, unit), name)
        except (OSError, pa.ArrowException, SchemaError, IndexError, KeyError) as exc:
            raise SourceReadError(
                f"cannot read column {name!r} of {self._where(f, unit)}: {exc}; it changed or is damaged since it "
                "was opened: open the corpus again"
            ) from exc
        expected = self.lengths[self.partition_series[p] : self.partition_series[p + 1]]
        if not np.array_equal(np.where(expected > 0, lengths, 0), expected):
            raise SourceReadError(f"{self._where(f, unit)} changed since it was opened; open the corpus again")
        lo = int(starts.min()) if len(starts) else 0
        hi = int((starts + lengths * channels).max()) if len(starts) else 0
        out, infinite = as_float32(values.slice(lo, hi - lo))
        return Decoded(out, starts - lo, infinite), channels

    def _read_with_covariates(self, p: int) -> Decoded:
        """Partition ``p``: each row's target channels, then each covariate column's, one flat array."""
        a, b = int(self.partition_series[p]), int(self.partition_series[p + 1])
        lengths, channels = self.lengths[a:b], self.channels[a:b]
        sizes = lengths * channels  # (rows,) values of each row, all columns
        starts = np.cumsum(sizes) - sizes
        out = np.full(int(sizes.sum()), np.nan, np.float32)
        infinite = np.zeros(len(out), bool)
        done = np.zeros(b - a, np.int64)  # (rows,) values of each row written so far
        for name, width in [(self.target, self.target_channels[a:b]), *((c, None) for c in self.covariates)]:
            part, own = self._read_column(p, name)
            if width is None:  # a covariate: its channels are what its list offsets say
                width = np.where(lengths > 0, own, 0)
            seg = lengths * width  # (rows,) values of this column per row
            first = np.cumsum(seg) - seg
            src = np.repeat(part.starts - first, seg) + np.arange(int(seg.sum()), dtype=np.int64)
            dst = np.repeat(starts + done - first, seg) + np.arange(int(seg.sum()), dtype=np.int64)
            out[dst] = part.values[src]
            if part.infinite is not None:
                infinite[dst] = part.infinite[src]
            done += seg
        return Decoded(out, starts, infinite if infinite.any() else None)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_handles"] = {}  # reopened (memory-mapped again) in each process
        return state

    def __repr__(self) -> str:
        return f"ListSource({self.name}: {len(self.lengths):,} series in {self.num_partitions:,} partitions)"
