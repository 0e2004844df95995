"""Opening a Parquet dataset from its index, columnar: no Python object per file until one is asked for.

``IndexedFiles`` holds the index's columns as numpy arrays; ``IndexedFooters``, ``IndexedIdentities``
and ``IndexedRuns`` are read-only mappings by path over them (a bisection per look-up). The index's
checksum and the bounds of every number are checked when it is read; a local file is compared with
the index at its first read (one ``stat``), not at open."""

from __future__ import annotations

import base64
import bisect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from dask_windows.errors import DataError
from dask_windows.sources.identity import VERSION_KEYS, FileIdentity, from_info
from dask_windows.sources.parquet.footer_compact import key_values_field
from dask_windows.sources.parquet.footer_index import IndexDamaged, IndexedFooter, OldIndex, _header, _read_table
from dask_windows.sources.parquet.footers import split_sizes

__all__ = [
    "IndexedFiles",
    "IndexedFooters",
    "IndexedIdentities",
    "IndexedRuns",
    "index_root",
    "open_index",
    "read_index",
]


def _binary(array: Any) -> tuple[np.ndarray, np.ndarray]:
    """``((n + 1,) int64 offsets into the data buffer (absolute), the buffer as uint8)`` of a binary array."""
    import pyarrow as pa

    if not len(array):
        return np.zeros(1, np.int64), np.empty(0, np.uint8)
    kind = np.int64 if array.type == pa.large_binary() else np.int32
    raw = np.frombuffer(array.buffers()[1], kind)
    offsets = raw[array.offset : array.offset + len(array) + 1].astype(np.int64)
    return offsets, np.frombuffer(array.buffers()[2], np.uint8)


def _ascending(paths: Any) -> bool:
    """Whether an Arrow string array is in strictly ascending order."""
    import pyarrow.compute as pc

    return len(paths) < 2 or pc.all(pc.greater(paths.slice(1), paths.slice(0, len(paths) - 1))).as_py()


def _flat(array: Any, dtype: Any = np.int64) -> tuple[np.ndarray, np.ndarray]:
    """``(values, (n + 1,) offsets)`` of an Arrow list array, its null lists empty."""
    import pyarrow.compute as pc

    lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy()
    offsets = np.zeros(len(array) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = pc.list_flatten(array).to_numpy(zero_copy_only=False)
    return (values if dtype is None else np.asarray(values, dtype)), offsets


class IndexedFiles:
    """The columns of an index for the files opened, row ``i`` for ``files[i]``: ``sizes``, ``versions``
    (Arrow strings or nulls), ``group_rows`` and ``group_bytes`` of every row group file after file from
    ``row_offsets``, compact footers (``footer_data`` from ``footer_offsets``), schema ``numbers`` into
    ``schemas`` and ``kv_fields``, and ``runs`` ``(starts, lengths, keys, offsets, known, key dtype)``
    or ``None``."""

    unlisted = False  # opened without a listing (footer_share.open_unlisted): the index is the source of truth

    def __init__(self, table: Any, header: dict, files: list[str], where: str, local: bool, series: Any) -> None:
        import pyarrow as pa

        self.files, self.where, self.local = files, where, local
        col = {name: _one_chunk(table.column(name)) for name in table.column_names}
        self.sizes = np.asarray(col["size"].to_numpy(), np.int64)
        self.versions = col["version"]
        self.group_rows, self.row_offsets = _flat(col["rows"])
        self.group_bytes = _flat(col["group_bytes"])[0]  # the same offsets as rows
        self.footer_offsets, self.footer_data = _binary(col["footer"])
        self.digest_offsets, self.digest_data = _binary(col["digest"])
        self.numbers = np.asarray(col["schema"].to_numpy(), np.int64)
        self.schemas = [pa.ipc.read_schema(pa.py_buffer(base64.b64decode(s))) for s in header["schemas"]]
        self.kv_fields = [
            key_values_field([(b"ARROW:schema", base64.b64decode(k))]) if k else b"" for k in header["key_values"]
        ]
        self.manifest = bool(header.get("manifest", True))  # whether the folder held a manifest when indexed
        self.runs = None
        if series is not None and header.get("series") == series:
            self.runs = _runs_columns(col, header)

    def __len__(self) -> int:
        return len(self.files)

    def positions(self) -> dict[str, int] | None:
        """``path -> row`` for a listing out of order; ``None`` when sorted (found by bisection)."""
        if not hasattr(self, "_positions"):
            import pyarrow as pa

            ordered = _ascending(pa.array(self.files, pa.string()))
            self._positions = None if ordered else {p: i for i, p in enumerate(self.files)}
        return self._positions

    def rows(self, i: int) -> tuple[int, ...]:
        return tuple(self.group_rows[self.row_offsets[i] : self.row_offsets[i + 1]].tolist())

    def footer(self, i: int) -> IndexedFooter:
        return _RowFooter(self, i)

    def raw(self, i: int) -> bytes:
        return self.footer_data[self.footer_offsets[i] : self.footer_offsets[i + 1]].tobytes()

    def digest(self, i: int) -> bytes:
        return self.digest_data[self.digest_offsets[i] : self.digest_offsets[i + 1]].tobytes()

    def identity(self, i: int) -> FileIdentity | None:
        version = self.versions[i].as_py()
        if self.local:
            return None if version is None else FileIdentity(int(self.sizes[i]), int(version))
        return FileIdentity(int(self.sizes[i]), version)

    def splits(self, partition_bytes: int) -> tuple[np.ndarray, dict[int, list[tuple[int, ...]]]]:
        """``(whole, cuts)``: ``(F,)`` the files of one partition, and each other file's row groups cut into
        partitions (``footers.split_sizes``)."""
        whole = _sums(self.group_bytes, self.row_offsets) <= partition_bytes  # (F,)
        cuts: dict[int, list[tuple[int, ...]]] = {}
        for i in np.flatnonzero(~whole).tolist():
            lo, hi = self.row_offsets[i], self.row_offsets[i + 1]
            found = split_sizes(self.group_bytes[lo:hi].tolist(), partition_bytes)
            if len(found) == 1:  # one row group larger than the budget: still one partition
                whole[i] = True
            else:
                cuts[i] = found
        return whole, cuts


class _RowFooter(IndexedFooter):
    """The ``IndexedFooter`` of one row of ``IndexedFiles``, its fields read from the columns when asked."""

    __slots__ = ("_files", "_row")

    def __init__(self, files: IndexedFiles, row: int) -> None:
        self._files, self._row = files, row

    raw = property(lambda self: self._files.raw(self._row))  # type: ignore[assignment]
    size = property(lambda self: int(self._files.sizes[self._row]))  # type: ignore[assignment]
    rows = property(lambda self: self._files.rows(self._row))  # type: ignore[assignment]
    digest = property(lambda self: self._files.digest(self._row))  # type: ignore[assignment]
    key_values = property(lambda self: self._files.kv_fields[self._files.numbers[self._row]])  # type: ignore[assignment]

    def __reduce__(self) -> tuple:
        return IndexedFooter, (self.raw, self.size, self.rows, self.digest, self.key_values)


def _one_chunk(column: Any) -> Any:
    """The Arrow array of a column: its one chunk as it is (no copy), or its chunks joined."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``(F,)`` the sum of each ``values[offsets[i]:offsets[i + 1]]`` (empty slices: 0)."""
    totals = np.concatenate([[0], np.cumsum(values)])  # (G + 1,) running sums
    return totals[offsets[1:]] - totals[offsets[:-1]]


def _runs_columns(col: dict, header: dict) -> tuple | None:
    """The flat series runs of the index, or ``None`` when it holds none for its series."""
    if header.get("key_dtype") is None and "run_keys_any" not in col:
        return None
    known = np.asarray(col["run_starts"].is_valid().to_numpy(zero_copy_only=False), bool)  # (F,) runs written
    starts, offsets = _flat(col["run_starts"])  # (runs of all files,), (F + 1,)
    lengths = _flat(col["run_lengths"])[0]
    if header.get("key_dtype") is not None:
        return starts, lengths, _flat(col["run_keys"])[0], offsets, known, np.dtype(header["key_dtype"])
    return starts, lengths, _flat(col["run_keys_any"], None)[0], offsets, known, None


class _ByPath(Mapping):
    """A read-only mapping ``path -> value of its row`` over ``IndexedFiles``."""

    def __init__(self, files: IndexedFiles) -> None:
        self._files = files
        self._position = files.positions()  # None: bisection in the sorted listing

    def row(self, path: str) -> int:
        if self._position is not None:
            return self._position[path]
        paths = self._files.files
        i = bisect.bisect_left(paths, path)
        if i == len(paths) or paths[i] != path:
            raise KeyError(path)
        return i

    def __contains__(self, path: object) -> bool:
        try:
            self.row(path)  # type: ignore[arg-type]
        except (KeyError, TypeError):
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self._files.files)

    def __len__(self) -> int:
        return len(self._files)

    def __getitem__(self, path: str) -> Any:
        return self.value(self.row(path))

    def value(self, i: int) -> Any:
        raise NotImplementedError


class IndexedFooters(_ByPath):
    """``path -> IndexedFooter``, built when asked for."""

    def value(self, i: int) -> IndexedFooter:
        return self._files.footer(i)


class IndexedIdentities(_ByPath):
    """``path -> FileIdentity`` as indexed; ``check_local`` compares a local file with it at a read."""

    def value(self, i: int) -> FileIdentity | None:
        return self._files.identity(i)

    def check_local(self, path: str) -> None:
        """Raise ``DataError`` when local ``path`` is not the file indexed (the index is stale)."""
        from dask_windows.sources import identity

        expected = self.get(path)
        now = identity.changed(path, expected)
        if now is not None:
            assert expected is not None
            raise stale(self._files.where, path, f"changed (indexed: {expected.describe()}; now {now.describe()})")


class IndexedRuns(_ByPath):
    """``path -> (starts, lengths, keys)`` told by the index, for the files it has them of."""

    def __init__(self, files: IndexedFiles, one_partition: np.ndarray) -> None:
        super().__init__(files)
        assert files.runs is not None
        self._known = files.runs[4] & one_partition  # (F,) files whose runs the index tells
        self._count = int(self._known.sum())

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[str]:
        return (p for p, k in zip(self._files.files, self._known.tolist()) if k)

    def __getitem__(self, path: str) -> Any:
        i = self.row(path)
        if not self._known[i]:
            raise KeyError(path)
        return self.value(i)

    def pop(self, path: str, default: Any = None) -> Any:
        """The runs of ``path``, kept (the index's arrays are shared: removing frees nothing)."""
        return self.get(path, default)

    def every_file(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """``(starts, lengths, keys, offsets)``: the flat runs of every file (file ``i``'s from ``offsets[i]``),
        when the index tells every file's; else ``None``."""
        if self._count != len(self._files):
            return None
        starts, lengths, keys, offsets, _, dtype = self._files.runs  # type: ignore[misc]
        return starts, lengths, (keys if dtype is None else keys.astype(dtype)), offsets

    def value(self, i: int) -> Any:
        starts, lengths, keys, offsets, _, dtype = self._files.runs  # type: ignore[misc]
        lo, hi = offsets[i], offsets[i + 1]  # (dtype None: keys of another type than integers)
        return starts[lo:hi], lengths[lo:hi], keys[lo:hi] if dtype is None else keys[lo:hi].astype(dtype)


def stale(where: str, path: str, what: str, url: Callable[[str], str] = str) -> DataError:
    return DataError(
        f"the dataset index {where} is stale: {url(path)} {what}; write the index again "
        f"(`dask-windows index`), or pass index=False to read every footer"
    )


def open_index(
    blob: bytes,
    where: str,
    files: list[str],
    listed: dict,
    local: bool,
    series: str | None,
    data_root: str | None,
    url: Callable[[str], str],
    check: bool = True,
    index_dir: str | None = None,
    read: tuple[Any, dict] | None = None,
) -> IndexedFiles:
    """The listed ``files`` opened from the index ``blob`` (at ``where``), columnar.

    Args:
        listed: The listing's ``info`` entries by path (sizes and versions on an object store).
        data_root: The folder or prefix opened (``None``: a glob or list); when it is the index's own, a
            file indexed but not listed is reported as deleted.
        url: A path as messages show it.
        check: Compare the listing's identities (``False`` for the footers ranks exchange).
        index_dir: The folder the index's paths are relative to.
        read: ``(table, header)`` of ``blob`` when read already (``read_index``).

    Raises:
        DataError: The index is stale (a file added, deleted, or changed), naming the file."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table, header = read_index(blob, where) if read is None else read
    root = index_root(header, index_dir)
    prefix = root + "/" if root else ""
    indexed = pc.binary_join_element_wise(pa.scalar(prefix), table.column("path"), "").combine_chunks()
    listing = pa.array(files, pa.string())
    if len(indexed) != len(listing) or not pc.all(pc.equal(indexed, listing)).as_py():
        rows = _match(indexed.to_pylist(), files, where, data_root, root, url)
        table = table.take(pa.array(rows, pa.int64()))
    opened = IndexedFiles(table, header, files, where, local, series)
    if check and not local:
        _check_listing(opened, listed, url)
    return opened


def read_index(blob: bytes, where: str) -> tuple[Any, dict]:
    """``(table, header)`` of the index ``blob``, its checksum and every number checked (``OldIndex`` or
    ``IndexDamaged`` naming ``where`` and the remedy)."""
    try:
        table = _read_table(blob).combine_chunks()  # one chunk per column, shared by the checks and the open
        header = _header(table)
        _check_numbers(table, header)
    except OldIndex as exc:
        raise OldIndex(
            f"{where} is {exc}; write it again with `dask-windows index` (or pass index=False to read every footer)"
        ) from exc
    except Exception as exc:
        raise IndexDamaged(
            f"{where} is not a readable dataset index ({exc}); write it again with `dask-windows index` "
            "(or pass index=False to read every footer)"
        ) from exc
    return table, header


def index_root(header: dict, index_dir: str | None) -> str:
    """The folder or prefix the index's paths are under: its header's root, relative to ``index_dir``."""
    import posixpath

    root = header["root"].rstrip("/")
    if header["relative"]:
        if index_dir is None:
            raise DataError("an index of relative paths was given without its folder")
        root = posixpath.normpath(posixpath.join(index_dir, root))
    return root


def _check_numbers(table: Any, header: dict) -> None:
    """Raise ``IndexDamaged`` unless every number of the index is within its bounds: no index asks for
    memory or reorders windows."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from dask_windows.sources.parquet.footer_index import _COLUMN_TYPES

    for name, kind in _COLUMN_TYPES.items():
        found = table.schema.field(name).type if name in table.column_names else None
        if found is None or kind != (f"list of {found.value_type}" if pa.types.is_list(found) else str(found)):
            raise IndexDamaged(f"its column {name!r} is missing or not {kind}")
    if "run_keys_any" in table.column_names and not pa.types.is_list(table.schema.field("run_keys_any").type):
        raise IndexDamaged("its column 'run_keys_any' is not a list")
    for name in ("path", "size", "rows", "group_bytes", "footer", "digest", "schema"):
        if table.column(name).null_count:
            raise IndexDamaged(f"its column {name!r} has nulls")
    col = {name: _one_chunk(table.column(name)) for name in table.column_names}
    sizes = col["size"].to_numpy()
    rows, row_offsets = _flat(col["rows"])
    group_bytes, byte_offsets = _flat(col["group_bytes"])
    footer_lengths = pc.binary_length(col["footer"]).to_numpy()
    numbers = col["schema"].to_numpy()
    if (sizes < 0).any() or (rows < 0).any() or (group_bytes < 0).any():
        raise IndexDamaged("a size, row count or row group's bytes is negative")
    if not np.array_equal(row_offsets, byte_offsets):
        raise IndexDamaged("a file's row groups and their bytes differ in number")
    if (footer_lengths < 12).any() or (footer_lengths > sizes).any():
        raise IndexDamaged("a footer is longer than its file")
    if (pc.binary_length(col["digest"]).to_numpy() != 32).any():
        raise IndexDamaged("a footer's digest is not 32 bytes")
    if len(numbers) and (numbers.min() < 0 or numbers.max() >= len(header["schemas"])):
        raise IndexDamaged("a schema number is of no schema")
    paths = col["path"]
    if not _ascending(paths) and len(paths) != len(pc.unique(paths)):  # (a listing's order is ascending: no hash)
        raise IndexDamaged("a file is in it twice")
    _check_runs(col, _sums(rows, row_offsets), header["key_dtype"])


def _check_runs(col: dict, file_rows: np.ndarray, key_dtype: str | None) -> None:
    """Raise ``IndexDamaged`` unless every file's told runs lie end to end over its rows, a key each."""
    known = np.asarray(col["run_starts"].is_valid().to_numpy(zero_copy_only=False), bool)
    starts, offsets = _flat(col["run_starts"])
    lengths, length_offsets = _flat(col["run_lengths"])
    told = known & np.asarray(col["run_lengths"].is_valid().to_numpy(zero_copy_only=False), bool)
    if not np.array_equal(known, told) or not np.array_equal(offsets, length_offsets):
        raise IndexDamaged("a file's run starts and run lengths differ in number")
    name = "run_keys" if key_dtype is not None else ("run_keys_any" if "run_keys_any" in col else None)
    if name is not None and known.any():
        key_offsets = _flat(col[name], None)[1]
        key_known = np.asarray(col[name].is_valid().to_numpy(zero_copy_only=False), bool)
        if not np.array_equal(key_offsets, offsets) or not (key_known | ~known).all():
            raise IndexDamaged("a file's runs and their keys differ in number")
    if (lengths < 1).any():
        raise IndexDamaged("a series run is empty or negative")
    totals = _sums(lengths, offsets)  # (F,) rows the runs cover
    ends = np.concatenate([[0], np.cumsum(lengths)])  # (R + 1,) running end of each run
    first = offsets[:-1]  # (F,) each file's first run
    expected = ends[:-1] - np.repeat(ends[first], np.diff(offsets))  # (R,) each run's start from its lengths
    if not np.array_equal(starts, expected) or (known & (totals != file_rows)).any():
        raise IndexDamaged("a file's series runs do not lie end to end over its rows")


def _match(indexed: list[str], files: list[str], where: str, data_root: str | None, root: str, url: Callable) -> list:
    """Row of the index of each listed file; raises when one is not indexed, or one indexed is gone."""
    position = {p: i for i, p in enumerate(indexed)}
    rows = []
    for path in files:
        i = position.get(path)
        if i is None:
            raise stale(where, path, "is not in it (added after the index was written)", url)
        rows.append(i)
    if data_root is not None and data_root == root and len(position) != len(files):
        gone = sorted(set(position) - set(files))
        raise stale(where, gone[0], f"is in it but not there (deleted; {len(gone)} files in all)", url)
    return rows


def _check_listing(opened: IndexedFiles, listed: dict, url: Callable) -> None:
    """Raise when an object's listed size or version is not the one indexed (no request: the listing's)."""
    infos = [listed.get(p) for p in opened.files]
    sizes = np.array([-1 if not i or not isinstance(i.get("size"), int) else i["size"] for i in infos], np.int64)
    bad = (sizes >= 0) & (sizes != opened.sizes)
    first = next((i for i in infos if i), None)
    key = None if first is None else next((k for k in VERSION_KEYS if first.get(k) is not None), None)
    if key is not None:
        now = np.array([None if not i or i.get(key) is None else str(i[key]) for i in infos], object)
        versions = np.asarray(opened.versions.to_numpy(zero_copy_only=False), object)  # (F,) as indexed or None
        bad |= (now != None) & (versions != None) & (now != versions)  # noqa: E711
    hit = np.flatnonzero(bad)
    if len(hit):
        i = int(hit[0])
        path, found = opened.files[i], FileIdentity(int(opened.sizes[i]), opened.versions[i].as_py())
        now_id = from_info(infos[i])
        raise stale(opened.where, path, f"changed (indexed: {found.describe()}; now {now_id.describe()})", url)


def adopt_index(source: Any, opened: IndexedFiles, partition_bytes: int) -> None:
    """Set what ``ParquetSource`` keeps of its files from ``opened``: mappings over its columns, and its
    partitions as ``FilePartitions``."""
    from dask_windows.sources.parquet.partitions import FilePartitions

    files = opened.files
    source.files = files
    source._footers = IndexedFooters(opened)
    source._identities = IndexedIdentities(opened)
    source._schemas = opened.schemas
    source._schema_numbers = opened.numbers
    whole, cuts = opened.splits(partition_bytes)  # (F,) files of one partition; the others' cuts
    source._tail_runs = IndexedRuns(opened, whole) if opened.runs is not None else {}
    source.partitions = FilePartitions.of_files(files, opened.group_rows, opened.row_offsets, whole, cuts)
