"""List-column corpora: one row per series, the values in a list column, read as they ship.

A foundation-model corpus stores one series per row: ``target: list<float>``
(univariate) or ``list<list<float>>`` (channels x time), with optional
``freq``, ``start`` and ``item_id`` columns (GluonTS / Chronos Arrow files,
Hugging Face ``datasets`` folders written by ``save_to_disk``, LOTSA).
``ListSource`` opens such files: Parquet (local or any fsspec URL), Arrow IPC
files or streams, a ``datasets`` folder or a ``datasets.Dataset``.

The unit of reading is a *partition*: a Parquet row group, an Arrow record
batch. At open only the list offsets are looked at: each series' length and
channel count (O(series) integers kept). Arrow files are memory-mapped, so the
offsets are read without touching the values; Parquet has no offsets on disk,
so its target column is decoded once, a row group at a time, and only the
offsets kept. ``read(p)`` returns one partition's values as one flat float32
array (NaN where a value is null) and where each row starts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dask_windows.errors import SchemaError, SourceReadError

__all__ = ["Decoded", "ListSource"]

ARROW_SUFFIXES = (".arrow", ".feather", ".ipc")
SUFFIXES = (".parquet", ".parq", *ARROW_SUFFIXES)


@dataclass(frozen=True)
class Decoded:
    """One partition's series: row ``r``'s channel ``c`` is ``values[starts[r] + c * L_r :][:L_r]``."""

    values: np.ndarray  # (n,) float32, NaN where the file holds null
    starts: np.ndarray  # (rows,) int64


def _hf_files(fs: Any, root: str) -> list[str] | None:
    """The Arrow files of a ``datasets`` folder written by ``save_to_disk``, in order; ``None`` if it is not one."""
    state = root.rstrip("/") + "/state.json"
    if not fs.exists(state):
        return None
    with fs.open(state, "rb") as f:
        listed = json.load(f).get("_data_files", [])
    return [root.rstrip("/") + "/" + entry["filename"] for entry in listed]


def _codes(column: Any) -> tuple[list[str], np.ndarray]:
    """A string column as ``(names, (rows,) index into names)``; null as ``"unknown"``."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if not pa.types.is_dictionary(column.type):
        column = column.dictionary_encode()
    names = ["unknown" if v is None else str(v) for v in column.dictionary.to_pylist()]
    if column.null_count:
        names.append("unknown")
    index = column.indices.fill_null(len(names) - 1).to_numpy(zero_copy_only=False).astype(np.int64)
    return names, index


def _list_offsets(column: Any, where: str, target: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any]:
    """``(lengths, channels, value_offsets, values)`` of one list column chunk.

    ``value_offsets[r]`` is row ``r``'s first value in ``values`` (the flat float child).
    """
    import pyarrow as pa

    kind = column.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
        raise SchemaError(
            f"column {target!r} of {where} is {kind}, not a list; a corpus holds one series per row in a "
            "list<float> (or list<list<float>>) column; for one row per time step use WindowDataset"
        )
    outer = np.asarray(column.offsets, dtype=np.int64)  # (rows + 1,), the slice's own
    rows = len(column)
    valid = np.ones(rows, bool) if column.null_count == 0 else ~np.asarray(column.is_null())
    child = column.values
    if pa.types.is_list(child.type) or pa.types.is_large_list(child.type):  # list<list<float>>: channels x time
        inner = np.asarray(child.offsets, dtype=np.int64)
        channels = np.diff(outer)
        first = inner[np.minimum(outer[:-1], len(inner) - 1)]
        nxt = inner[np.minimum(outer[:-1] + 1, len(inner) - 1)]
        lengths = np.where(channels > 0, nxt - first, 0)
        per_channel = np.diff(inner)[outer[0] : outer[-1]]  # (sum channels,)
        if len(per_channel) and not np.array_equal(per_channel, np.repeat(lengths, channels)):
            bad = int(np.flatnonzero(per_channel != np.repeat(lengths, channels))[0])
            row = int(np.searchsorted(outer[1:] - outer[0], bad, side="right"))
            raise SchemaError(
                f"row {row} of {where}: the channels of column {target!r} differ in length; a multivariate "
                "series needs one length per channel (pad the short channels with null)"
            )
        values = child.values
        starts = first
        if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
            raise SchemaError(f"column {target!r} of {where} holds {values.type}; it needs numbers")
    else:
        channels = np.ones(rows, np.int64)
        lengths = np.diff(outer)
        values = child
        starts = outer[:-1]
        if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
            raise SchemaError(
                f"column {target!r} of {where} is {kind}; it needs list<float> or list<list<float>> (numbers)"
            )
    lengths = np.where(valid, lengths, 0).astype(np.int64)
    channels = np.where(valid, channels, 0).astype(np.int64)
    return lengths, channels, starts.astype(np.int64), values


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
            ``datasets`` folder (``save_to_disk``), or a ``datasets.Dataset``.
        target: The list column holding the values.
        covariates: Further list columns (GluonTS's ``feat_dynamic_real``, ``past_feat_dynamic_real``), each
            ``list<float>`` or ``list<list<float>>`` of the target's length per row: served as extra channels
            after the target's (``target_channels`` says where they start).
        freq: The data set's frequency (``"h"``, ``"D"``, ``"W"``, ...) where no ``freq`` column says it.
        storage_options: Passed to fsspec (credentials, endpoint, ...).

    Attributes:
        name: Where the data lives, for messages.
        lengths: ``(S,)`` time steps of each series (0 for a null row).
        channels: ``(S,)`` channels of each series (the target's, then the covariates').
        target_channels: ``(S,)`` the target's channels of each series.
        partition_series: ``(P + 1,)`` first series of each partition, then ``S``.
        freqs: Frequencies met, in order of first appearance; ``freq_codes`` ``(S,)`` indexes them.
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
        self.default_freq = freq
        self.files, self.kind, self.name = self._resolve(data)
        self._handles: dict[int, Any] = {}
        self._open()

    # -- opening ------------------------------------------------------------------------------

    def _resolve(self, data: Any) -> tuple[list[str], str, str]:
        if hasattr(data, "cache_files") and hasattr(data, "column_names"):  # a datasets.Dataset
            if getattr(data, "_indices", None) is not None:
                raise SchemaError(
                    "this Hugging Face dataset has an indices mapping (after shuffle/select/filter); call "
                    "dataset.flatten_indices() first or pass it unshuffled"
                )
            files = [f["filename"] for f in data.cache_files]
            if not files:
                raise SchemaError("this Hugging Face dataset lives in memory; save_to_disk() it and pass the folder")
            return files, "arrow-stream", f"datasets.Dataset ({files[0]})"
        import fsspec

        if isinstance(data, (str, os.PathLike)):
            url = os.fspath(data)
            fs, root = fsspec.core.url_to_fs(url, **self.storage_options)
            hf = _hf_files(fs, root) if fs.isdir(root) else None
            if hf is not None:
                return [self._url(fs, url, p) for p in hf], "arrow-stream", url
        from dask_windows.sources.parquet.footers import list_files

        fs, files, _, description = list_files(data, self.storage_options, SUFFIXES)
        if not files:
            raise FileNotFoundError(f"no Parquet or Arrow files in {description}")
        arrow = [f.lower().endswith(ARROW_SUFFIXES) for f in files]
        if any(arrow) and not all(arrow):
            raise SchemaError(f"{description} mixes Parquet and Arrow files; pass one kind per data set")
        urls = [self._url(fs, data if isinstance(data, str) else f, f) for f in files]
        return urls, "arrow" if all(arrow) else "parquet", description

    @staticmethod
    def _url(fs: Any, given: Any, path: str) -> str:
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
            for unit, column, freq, extra in self._units(f):
                where = self._where(f, unit)
                n, c, _, _ = _list_offsets(column, where, self.target)
                own.append(c)
                for name, col in zip(self.covariates, extra):
                    n_k, c_k, _, _ = _list_offsets(col, where, name)
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

    def _units(self, f: int) -> Any:
        """``(unit, target column chunk, freq values or None)`` of file ``f``, unit by unit."""
        handle = self._handle(f)
        if self.kind == "parquet":
            names = handle.schema_arrow.names
            self._check_column(names, f)
            cols = [self.target, *self.covariates] + (["freq"] if "freq" in names else [])
            for g in range(handle.num_row_groups):
                table = handle.read_row_group(g, columns=cols)
                freq = _codes(table.column("freq")) if "freq" in names else None
                extra = [table.column(c).combine_chunks() for c in self.covariates]
                yield g, table.column(self.target).combine_chunks(), freq, extra
        else:
            names = handle.schema.names
            self._check_column(names, f)
            for b, batch in enumerate(handle.to_batches()):
                freq = _codes(batch.column("freq")) if "freq" in names else None
                yield b, batch.column(self.target), freq, [batch.column(c) for c in self.covariates]

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
        """File ``f`` opened in this process: a ``ParquetFile``, or the Arrow table (memory-mapped when local)."""
        handle = self._handles.get(f)
        if handle is not None:
            return handle
        import fsspec
        import pyarrow as pa
        import pyarrow.parquet as pq

        url = self.files[f]
        try:
            fs, path = fsspec.core.url_to_fs(url, **self.storage_options)
            local = "file" in (fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,))
            if self.kind == "parquet":
                handle = pq.ParquetFile(path if local else fs.open(path, "rb"))
            else:
                raw = pa.memory_map(path, "r") if local else pa.BufferReader(fs.cat_file(path))
                try:
                    handle = pa.ipc.open_file(raw).read_all()
                except pa.ArrowInvalid:
                    raw.seek(0)
                    handle = pa.ipc.open_stream(raw).read_all()
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
        import pyarrow as pa

        if self.covariates:
            return self._read_with_covariates(p)
        f, unit = self.partitions[p]
        handle = self._handle(f)
        try:
            if self.kind == "parquet":
                column = handle.read_row_group(unit, columns=[self.target]).column(self.target).combine_chunks()
            else:
                column = handle.column(self.target).chunk(unit)
            lengths, channels, starts, values = _list_offsets(column, self._where(f, unit), self.target)
        except (OSError, pa.ArrowException, SchemaError) as exc:
            raise SourceReadError(
                f"cannot read {self._where(f, unit)}: {exc}; it changed or is damaged since it was opened: "
                "open the corpus again"
            ) from exc
        expected = self.lengths[self.partition_series[p] : self.partition_series[p + 1]]
        if not np.array_equal(lengths, expected):
            raise SourceReadError(f"{self._where(f, unit)} changed since it was opened; open the corpus again")
        lo = int(starts.min()) if len(starts) else 0
        hi = int((starts + lengths * channels).max()) if len(starts) else 0
        flat = values.slice(lo, hi - lo)
        out = np.asarray(flat.to_numpy(zero_copy_only=False), dtype=np.float32)
        return Decoded(out, starts - lo)

    def _read_column(self, p: int, name: str) -> tuple[Decoded, np.ndarray]:
        """Partition ``p``'s column ``name`` alone, flat (as ``read`` reads the target), and its channels per row."""
        import pyarrow as pa

        f, unit = self.partitions[p]
        handle = self._handle(f)
        try:
            if self.kind == "parquet":
                column = handle.read_row_group(unit, columns=[name]).column(name).combine_chunks()
            else:
                column = handle.column(name).chunk(unit)
            lengths, channels, starts, values = _list_offsets(column, self._where(f, unit), name)
        except (OSError, pa.ArrowException, SchemaError) as exc:
            raise SourceReadError(
                f"cannot read column {name!r} of {self._where(f, unit)}: {exc}; it changed or is damaged since it "
                "was opened: open the corpus again"
            ) from exc
        expected = self.lengths[self.partition_series[p] : self.partition_series[p + 1]]
        if not np.array_equal(np.where(expected > 0, lengths, 0), expected):
            raise SourceReadError(f"{self._where(f, unit)} changed since it was opened; open the corpus again")
        lo = int(starts.min()) if len(starts) else 0
        hi = int((starts + lengths * channels).max()) if len(starts) else 0
        out = np.asarray(values.slice(lo, hi - lo).to_numpy(zero_copy_only=False), dtype=np.float32)
        return Decoded(out, starts - lo), channels

    def _read_with_covariates(self, p: int) -> Decoded:
        """Partition ``p``: each row's target channels, then each covariate column's, one flat array."""
        a, b = int(self.partition_series[p]), int(self.partition_series[p + 1])
        lengths, channels = self.lengths[a:b], self.channels[a:b]
        sizes = lengths * channels  # (rows,) values of each row, all columns
        starts = np.cumsum(sizes) - sizes
        out = np.full(int(sizes.sum()), np.nan, np.float32)
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
            done += seg
        return Decoded(out, starts)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_handles"] = {}  # reopened (memory-mapped again) in each process
        return state

    def __repr__(self) -> str:
        return f"ListSource({self.name}: {len(self.lengths):,} series in {self.num_partitions:,} partitions)"
