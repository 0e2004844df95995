"""Hostile input against the read paths of row-group partitions and reused memory.

Every batch that comes back is compared with a brute-force oracle of the clean data (the values
of the rows ``return_index`` names); a damaged, changed, deleted or truncated file must raise a
``SourceReadError`` naming it (and, for a damaged page, its column and row group) or be skipped
per ``on_error`` (docs/checks.md) - never give other numbers, never hang. The damage is aimed at
the row groups the pool reads (files cut into a partition per row group), besides random data
pages and footers, at fixed seeded positions. Then: two live iterators interleaved and one abandoned, NaN
and nulls in the kept heads, mixed schemas, row groups of one row, empty ones, windows longer
than a row group, unsorted series; and real series bundled with statsmodels in 37-row row
groups over several files, every window exactly once against numpy, with ``normalize="sample"``.
"""

from __future__ import annotations

import os
import shutil
import struct
import warnings

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import collect, make_frames, oracle_starts, same_batches
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dask_windows as dw
from dask_windows.errors import DataError, SchemaError, SourceReadError
from dask_windows.errors.faults import SkippedPartitionWarning
from dask_windows.opening.checks import SeriesOrderWarning

ROW_GROUP = 23
FEATURES = ["f0", "f1"]
KW = dict(
    features=FEATURES,
    targets=["y"],
    series="sid",
    window=8,
    batch_size=16,
    return_index=True,
    buffer_partitions=1,
    pieces_per_partition=1,  # whole partitions
)
SPLIT = {**KW, "partition_bytes": 1}  # a partition per row group: every halo reaches into the next one's head


# -- data, oracle --------------------------------------------------------------------------------


def _write(tables: list, root: str, row_group_size: int = ROW_GROUP, crc: bool = True) -> list[str]:
    """Each table (or frame) as ``part-000i.parquet`` under a fresh ``root``, with page checksums."""
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    paths = []
    for i, table in enumerate(tables):
        if isinstance(table, pd.DataFrame):
            table = pa.Table.from_pandas(table, preserve_index=False)
        path = os.path.join(root, f"part-{i:04d}.parquet")
        pq.write_table(table, path, row_group_size=row_group_size, write_page_checksum=crc)
        paths.append(path)
    return paths


def oracle(
    frames: list[pd.DataFrame], features: list, targets: list | None, *, window: int, stride: int = 1,
    horizon: int = 0, series: str | None = "sid", drop: bool = False,
) -> dict[int, tuple[np.ndarray, np.ndarray | None]]:  # fmt: skip
    """``{global start row: (x (C, L) float32, y)}`` of every valid window, one file at a time by brute force.

    A window is the rows of one contiguous run of a series key inside a file; with ``drop`` those
    touching a NaN, ``inf`` or null (features or targets, window and horizon) are left out.
    """
    out: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
    offset = 0
    for frame in frames:
        xs = frame[features].to_numpy(np.float64, na_value=np.nan)
        ys = frame[targets].to_numpy(np.float64, na_value=np.nan) if targets else None
        keys = frame[series].astype(object).to_numpy() if series else np.zeros(len(frame))
        null = pd.isna(keys) if series else np.zeros(len(frame), bool)  # a null key is one series (windows.find_runs)
        n, begin = len(frame), 0
        for end in range(1, n + 1):
            if end < n and _same_key(keys, null, end):
                continue
            for s in range(begin, end - window - horizon + 1, stride):
                rows = slice(s, s + window + horizon)
                if drop and not (_finite32(xs[rows]) and (ys is None or _finite32(ys[rows]))):
                    continue
                y = None
                if ys is not None:
                    y = ys[s + window - 1] if horizon == 0 else ys[s + window : s + window + horizon].T
                    y = y.astype(np.float32)
                out[offset + s] = (xs[s : s + window].T.astype(np.float32), y)
            begin = end
        offset += n
    return out


def _same_key(keys: np.ndarray, null: np.ndarray, row: int) -> bool:
    """Whether ``row`` holds the series of ``row - 1``: equal keys, or both null."""
    if null[row] or null[row - 1]:
        return bool(null[row] and null[row - 1])
    return bool(keys[row] == keys[row - 1])


def _finite32(values: np.ndarray) -> bool:
    """No NaN, null, ``inf`` or value beyond float32's range (what ``nan=`` treats as missing)."""
    return bool((np.abs(values) <= np.finfo(np.float32).max).all())


def wrong_batch(batches: list, want: dict) -> int | None:
    """The first batch holding a window that is not a valid window with exactly its oracle values."""
    for k, (x, y, rows) in enumerate(batches):
        for j, row in enumerate(rows.tolist()):
            if row not in want:
                return k
            x_want, y_want = want[row]
            if not (np.array_equal(x[j], x_want) and (y_want is None or np.array_equal(y[j], y_want))):
                return k
    return None


def check_epoch(batches: list, want: dict) -> None:
    """Every window of ``want`` exactly once, with exactly its values."""
    rows = np.concatenate([b[-1] for b in batches])
    assert len(rows) == len(np.unique(rows)), "a window came twice"
    assert sorted(rows.tolist()) == sorted(want), "the windows are not the valid ones"
    assert wrong_batch(batches, want) is None


def _epoch(ds) -> list:
    return [tuple(t.numpy() for t in batch) for batch in ds]


@pytest.fixture(scope="module")
def frames():
    return make_frames(seed=6, num_files=3, num_series=8, min_len=60, max_len=300)


@pytest.fixture(scope="module")
def clean(frames, tmp_path_factory):
    """The clean files (page checksums, 23-row row groups), the oracle, and what the new paths touch."""
    root = str(tmp_path_factory.mktemp("clean"))
    _write(frames, root)
    want = oracle(frames, FEATURES, ["y"], window=8)
    assert sorted(want) == oracle_starts(frames, "sid", 8).tolist()
    ds = dw.WindowDataset(root, **SPLIT)
    check_epoch(_epoch(ds), want)
    paths = sorted(ds.source.files)
    # the row groups the pass reads (a unit each), in two halves that the damage tests attack in turn
    groups = [(path, g) for path in paths for g in range(pq.ParquetFile(path).metadata.num_row_groups)]
    heads, kept = groups[::2], groups[1::2]
    return dict(root=root, want=want, paths=paths, heads=heads, kept=kept)


# -- damaged bytes -------------------------------------------------------------------------------


def _chunk_byte(path: str, group: int, column: str, rng: np.random.Generator) -> int:
    """A byte inside the last page of ``column``'s chunk in row group ``group`` (covered by its CRC)."""
    meta = pq.ParquetFile(path).metadata
    chunk = meta.row_group(group).column(meta.schema.names.index(column))
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    return start + chunk.total_compressed_size - 1 - int(rng.integers(4))


def _footer_byte(path: str, rng: np.random.Generator) -> int:
    size = os.path.getsize(path)
    with open(path, "rb") as src:
        src.seek(size - 8)
        length = struct.unpack("<i", src.read(4))[0]
    return size - 8 - length + int(rng.integers(length))


def _flips(clean: dict) -> list[tuple[str, str, int, int | None, str | None]]:
    """Fixed ``(kind, file, byte, row group, column)`` damage: heads, data pages, footers."""
    rng = np.random.default_rng(2026)
    paths = clean["paths"]
    out = []
    for kind, found in (("head", clean["heads"]), ("kept", clean["kept"])):
        picks = sorted(set(found))
        for k in rng.choice(len(picks), min(2, len(picks)), replace=False).tolist():
            where, group = picks[k]
            path = where if isinstance(where, str) else paths[where]
            column = FEATURES[int(rng.integers(2))]
            out.append((kind, path, _chunk_byte(path, group, column, rng), group, column))
    for _ in range(5):
        path = paths[int(rng.integers(len(paths)))]
        groups = pq.ParquetFile(path).metadata.num_row_groups
        group, column = int(rng.integers(groups)), ["f0", "f1", "y"][int(rng.integers(3))]
        out.append(("page", path, _chunk_byte(path, group, column, rng), group, column))
    for _ in range(5):
        path = paths[int(rng.integers(len(paths)))]
        out.append(("footer", path, _footer_byte(path, rng), None, None))
    for _ in range(4):  # anywhere: unread columns, page headers, magic bytes
        path = paths[int(rng.integers(len(paths)))]
        out.append(("anywhere", path, int(rng.integers(os.path.getsize(path))), None, None))
    return out


def _damaged(clean: dict, tmp_path, path: str, pos: int) -> tuple[str, str]:
    work = str(tmp_path / "work")
    shutil.copytree(clean["root"], work)
    victim = os.path.join(work, os.path.basename(path))
    with open(victim, "r+b") as out:
        out.seek(pos)
        byte = out.read(1)[0]
        out.seek(pos)
        out.write(bytes([byte ^ 0x5A]))
    return work, victim


def test_damaged_bytes_raise_naming_file_and_column_or_are_skipped(clean, frames, tmp_path):
    flips = _flips(clean)
    assert {f[0] for f in flips} == {"head", "kept", "page", "footer", "anywhere"}
    for n, (kind, path, pos, group, column) in enumerate(flips):
        work, victim = _damaged(clean, tmp_path / str(n), path, pos)
        got: list = []
        try:
            got.extend(_epoch(dw.WindowDataset(work, **SPLIT)))
        except SourceReadError as exc:
            message = str(exc)
            assert victim in message and "on_error='skip'" in message, message
            if column is not None:  # a page failing its CRC: the column chunk is named
                assert f"column {column!r} of row group {group} is damaged" in message, message
        else:  # a footer or other byte the read does not depend on may change nothing
            assert column is None, f"{kind} damage at byte {pos} of {victim} read without an error"
        assert wrong_batch(got, clean["want"]) is None, f"{kind}: a wrong batch before the error"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                ds = dw.WindowDataset(work, **SPLIT, on_error="skip")
                got = _epoch(ds)
            except SourceReadError as exc:  # only a footer that misstates row counts may still raise
                assert column is None and victim in str(exc), str(exc)
                continue
        want = clean["want"]
        if any(s.stage == "open" for s in ds.skipped):  # left out at open: the rows of the other files
            kept = [f for f, p in zip(frames, clean["paths"]) if os.path.basename(p) != os.path.basename(victim)]
            want = oracle(kept, FEATURES, ["y"], window=8)
        assert len(got) == len(ds) and wrong_batch(got, want) is None, kind
        skips = [str(w.message) for w in caught if issubclass(w.category, SkippedPartitionWarning)]
        assert column is None or (skips and all(victim in s for s in skips)), (kind, skips)


def test_resume_over_a_damaged_kept_head_gives_the_rest_of_the_pass(clean, tmp_path):
    # A resumed pass skips what the full pass skipped: the replacement windows (drawn from the other
    # partitions of the damaged one's buffer) are the same.
    path, group = clean["kept"][0]
    work, _ = _damaged(clean, tmp_path, path, _chunk_byte(path, group, "f1", np.random.default_rng(2)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedPartitionWarning)
        ds = dw.WindowDataset(work, **{**SPLIT, "buffer_partitions": 4}, on_error="skip")
        ds.set_epoch(1)
        full = _epoch(ds)
        assert ds.skipped and wrong_batch(full, clean["want"]) is None
        for k in range(1, len(full), 11):
            state = ds.state_dict(batches=k, num_workers=0)
            resumed = dw.WindowDataset(work, **{**SPLIT, "buffer_partitions": 4}, on_error="skip")
            resumed.load_state_dict(state)
            assert same_batches(_epoch(resumed), full[k:]), k


def test_damaged_rows_keep_equal_batch_counts_on_two_ranks(clean, tmp_path):
    path, group = clean["kept"][-1]
    work, victim = _damaged(clean, tmp_path, path, _chunk_byte(path, group, "y", np.random.default_rng(3)))
    counts, skipped = [], []
    for rank in range(2):
        ds = dw.WindowDataset(work, **KW, on_error="skip", rank=rank, world_size=2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SkippedPartitionWarning)
            got = _epoch(ds)
        assert wrong_batch(got, clean["want"]) is None
        counts.append((len(got), len(ds)))
        skipped += [s.name for s in ds.skipped]
    assert counts[0] == counts[1] and counts[0][0] == counts[0][1] and skipped and set(skipped) == {victim}


def test_damaged_rows_in_dataloader_workers_raise_or_keep_the_batch_count(clean, tmp_path):
    path, group = clean["kept"][-1]
    work, victim = _damaged(clean, tmp_path, path, _chunk_byte(path, group, "f0", np.random.default_rng(1)))
    with pytest.raises(SourceReadError, match=f"{victim}.*column 'f0' of row group {group} is damaged"):
        collect(dw.WindowDataset(work, **KW), dict(num_workers=2))
    ds = dw.WindowDataset(work, **KW, on_error="skip")
    got = collect(ds, dict(num_workers=2))  # the skips are warned in the worker processes
    assert len(got) == len(ds) and wrong_batch(got, clean["want"]) is None


def test_damaged_cache_entries_are_fetched_again_not_taken_as_data(frames, tmp_path, caplog):
    # The local cache of remote bytes (cache_dir=) had only a length check: a flipped byte in an
    # entry gave other values (files without page CRCs) or blamed, and skipped, the remote object.
    from helpers import parquet_bytes, s3_endpoint

    endpoint = s3_endpoint("hostile", frames, encode=lambda f: parquet_bytes(f, row_group_size=ROW_GROUP))
    try:
        cache = str(tmp_path / "cache")
        kw = dict(KW, storage_options=endpoint.storage_options(), cache_dir=cache)
        want = oracle(frames, FEATURES, ["y"], window=8)
        check_epoch(_epoch(dw.WindowDataset("s3://hostile/data/", **kw)), want)  # fills the cache
        from dask_windows.sources.cache import OWN_FOLDER  # the entries' folder inside cache_dir

        own = os.path.join(cache, OWN_FOLDER)
        entries = sorted(os.path.join(own, n) for n in os.listdir(own) if n.endswith(".bin"))
        for entry in entries[::3]:
            with open(entry, "r+b") as out:
                out.seek(os.path.getsize(entry) // 2)
                byte = out.read(1)[0]
                out.seek(-1, os.SEEK_CUR)
                out.write(bytes([byte ^ 0x5A]))
        ds = dw.WindowDataset("s3://hostile/data/", **kw, on_error="skip")
        check_epoch(_epoch(ds), want)
        assert not ds.skipped and "is damaged or of another version" in caplog.text
        check_epoch(_epoch(ds), oracle(frames, FEATURES, ["y"], window=8))  # stored again, whole
    finally:
        endpoint.close()


# -- files changed, deleted, truncated -----------------------------------------------------------


@pytest.fixture
def copy(clean, tmp_path):
    work = str(tmp_path / "copy")
    shutil.copytree(clean["root"], work)
    return work, sorted(os.path.join(work, f) for f in os.listdir(work))


def _rewrite(path: str, frame: pd.DataFrame) -> None:
    changed = frame.copy()
    changed["f1"] = changed["f1"] + 1.0  # same rows, other values
    pq.write_table(pa.Table.from_pandas(changed, preserve_index=False), path, row_group_size=ROW_GROUP)


def test_a_file_rewritten_between_passes_is_not_served_from_kept_heads(clean, copy, frames):
    work, paths = copy
    ds = dw.WindowDataset(work, **SPLIT)
    check_epoch(_epoch(ds), clean["want"])
    _rewrite(paths[1], frames[1])
    with pytest.raises(SourceReadError, match=f"{paths[1]} changed after the dataset was opened.*open the dataset"):
        _epoch(ds)
    skipping = dw.WindowDataset(work, **SPLIT, on_error="skip")  # opened on the rewritten file
    changed = [frames[0], frames[1].assign(f1=frames[1]["f1"] + 1.0), frames[2]]
    check_epoch(_epoch(skipping), oracle(changed, FEATURES, ["y"], window=8))  # its heads kept
    offsets = np.cumsum([0] + [len(f) for f in frames])
    for change in ("rewrite", "delete"):
        if change == "rewrite":
            _rewrite(paths[1], changed[1])
        else:
            os.remove(paths[1])
        with pytest.warns(SkippedPartitionWarning, match=paths[1]):
            got = _epoch(skipping)
        rows = np.concatenate([b[-1] for b in got])
        assert len(got) == len(skipping) and not ((rows >= offsets[1]) & (rows < offsets[2])).any()
        assert wrong_batch(got, clean["want"]) is None  # none of file 1's rows, kept or read
    fresh = dw.WindowDataset(work, **SPLIT)  # opened again: the files as they are now
    check_epoch(_epoch(fresh), oracle([frames[0], frames[2]], FEATURES, ["y"], window=8))


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """Eight files: more buffers than the read-ahead holds, so a pass reads files after its first batches."""
    frames = make_frames(seed=7, num_files=8, num_series=16, min_len=60, max_len=300)
    root = str(tmp_path_factory.mktemp("many"))
    _write(frames, root)
    return root, frames, oracle(frames, FEATURES, ["y"], window=8)


@pytest.mark.parametrize("change", ["rewrite", "delete", "truncate"])
def test_a_file_changed_mid_pass_raises_naming_it_after_right_batches(many, tmp_path, change):
    root, frames, want = many
    work = str(tmp_path / "copy")
    shutil.copytree(root, work)
    paths = sorted(os.path.join(work, f) for f in os.listdir(work))
    ds = dw.WindowDataset(work, **KW)
    got = []
    with pytest.raises(SourceReadError) as caught:
        for k, batch in enumerate(ds):
            got.append(tuple(t.numpy() for t in batch))
            if k == 2:  # heads of the first buffer kept, the other files not read yet
                for path, frame in zip(paths, frames):
                    if change == "rewrite":
                        _rewrite(path, frame)
                    elif change == "delete":
                        os.remove(path)
                    else:
                        os.truncate(path, os.path.getsize(path) // 2)
    message = str(caught.value)
    assert any(p in message for p in paths) and ("changed after" in message or "open it again" in message), message
    assert 3 <= len(got) < len(ds) and wrong_batch(got, want) is None


def test_a_file_rewritten_during_a_read_raises_not_new_rows_under_the_old_footer(frames, tmp_path, monkeypatch):
    # Checked only before the read, a file rewritten while pyarrow read it (same layout: plain,
    # uncompressed, so the old footer's offsets still find pages) gave the new file's values.
    root = str(tmp_path / "r")
    os.makedirs(root)
    layout = dict(row_group_size=ROW_GROUP, compression="none", use_dictionary=False, write_statistics=False)
    for i, frame in enumerate(frames):
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), f"{root}/part-{i:04d}.parquet", **layout)
    ds = dw.WindowDataset(root, **{**KW, "shuffle": False})
    source, victim = type(ds.source), f"{root}/part-0001.parquet"
    read, calls = source._read_table, []

    def rewritten_meanwhile(self, path, row_groups, columns):
        calls.append(path)
        if path == victim and calls.count(victim) == last:  # its last read: nothing reads it after
            changed = frames[1].assign(f1=frames[1]["f1"] + 1.0)
            pq.write_table(pa.Table.from_pandas(changed, preserve_index=False), path, **layout)
        return read(self, path, row_groups, columns)

    monkeypatch.setattr(source, "_read_table", rewritten_meanwhile)
    last = -1
    ds.set_epoch(0)
    want = oracle(frames, FEATURES, ["y"], window=8)
    check_epoch(_epoch(ds), want)
    last, calls[:] = calls.count(victim), []
    ds.set_epoch(0)
    got = []
    with pytest.raises(SourceReadError, match="part-0001.parquet changed after the dataset was opened"):
        for batch in ds:
            got.append(tuple(t.numpy() for t in batch))
    assert calls.count(victim) == last and wrong_batch(got, want) is None


def test_every_file_gone_after_open_with_skip_counts_partitions_not_pieces(clean, copy):
    work, paths = copy
    ds = dw.WindowDataset(work, **KW, on_error="skip")
    for path in paths:
        os.remove(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedPartitionWarning)
        with pytest.raises(
            SourceReadError, match=r"every partition of this reader's share left to read \(3 partitions, \d+ units\)"
        ):
            _epoch(ds)


def test_a_truncated_file_raises_at_open_or_is_left_out(clean, copy, frames):
    work, paths = copy
    os.truncate(paths[2], os.path.getsize(paths[2]) - 100)
    with pytest.raises(SourceReadError, match=f"{paths[2]}.*(truncated|corrupt)"):
        dw.WindowDataset(work, **KW)
    with pytest.warns(SkippedPartitionWarning, match=paths[2]):
        ds = dw.WindowDataset(work, **KW, on_error="skip")
    check_epoch(_epoch(ds), oracle(frames[:2], FEATURES, ["y"], window=8))


# -- two live iterators --------------------------------------------------------------------------


def _reference(root: str, kw: dict, epoch: int) -> list:
    ds = dw.WindowDataset(root, **kw)
    ds.set_epoch(epoch)
    return _epoch(ds)


@pytest.mark.parametrize("extra", [dict(), dict(normalize="sample", stride=2), dict(prefetch_partitions=0)])
def test_two_live_iterators_interleaved_each_give_their_exact_batches(clean, extra):
    kw = {**KW, **extra}
    third, fourth = _reference(clean["root"], kw, 3), _reference(clean["root"], kw, 4)
    ds = dw.WindowDataset(clean["root"], **kw)
    ds.set_epoch(3)
    a = iter(ds)
    b = iter(ds)  # the next pass: epoch 4
    got_a, got_b = [], []
    for _ in range(len(third)):  # a shared head cache between two passes at once
        got_a.append(tuple(t.numpy() for t in next(a)))
        got_b.append(tuple(t.numpy() for t in next(b)))
    assert same_batches(got_a, third) and same_batches(got_b, fourth)
    ds.set_epoch(3)
    a = iter(ds)
    taken = [next(a) for _ in range(5)]  # abandoned mid-pass, its batches still held
    kept = [tuple(t.numpy().copy() for t in batch) for batch in taken]
    ds.set_epoch(3)
    assert same_batches(_epoch(ds), third)
    del a
    assert same_batches([tuple(t.numpy() for t in batch) for batch in taken], kept)  # memory not reused under them
    if "normalize" not in extra:
        assert wrong_batch(got_a, clean["want"]) is None


def test_batches_held_from_one_pass_keep_their_values_through_the_next(clean):
    ds = dw.WindowDataset(clean["root"], **{**KW, "batch_size": 64})
    held = list(ds)  # the tensors of a whole pass, referenced
    copies = [tuple(t.numpy().copy() for t in batch) for batch in held]
    _epoch(ds)
    _epoch(ds)
    assert same_batches([tuple(t.numpy() for t in batch) for batch in held], copies)
    check_epoch(copies, clean["want"])


# -- hostile values and layouts --------------------------------------------------------------------


def _frames_with(frames: list[pd.DataFrame], column: str, rows: range, value) -> list[pd.DataFrame]:
    out = []
    for frame in frames:
        frame = frame.copy()
        if isinstance(value, str):  # an integer column with nulls
            ints = pd.array(frame[column].to_numpy().astype(np.int64), dtype="Int64")
            ints[[r for r in rows if r < len(frame)]] = pd.NA
            frame[column] = ints
        else:
            frame.loc[[r for r in rows if r < len(frame)], column] = value
        out.append(frame)
    return out


@pytest.mark.parametrize("column,value", [("f1", np.nan), ("y", np.inf), ("f0", -np.inf), ("f0", "null"), ("y", 1e39)])
def test_bad_values_in_the_first_rows_of_row_groups(frames, tmp_path, column, value):
    heads = range(ROW_GROUP, 400, 2 * ROW_GROUP)  # the first row of every other row group: kept heads
    if value == 1e39:  # beyond float32: only a float64 column holds it
        frames = [f.astype({column: np.float64}) for f in frames]
    bad = _frames_with(frames, column, heads, value)
    root = str(tmp_path / "r")
    _write(bad, root)
    want = oracle(bad, FEATURES, ["y"], window=8, drop=True)
    ds = dw.WindowDataset(root, **KW, nan="drop")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # values beyond float32 are data, not a numpy warning
        check_epoch(_epoch(ds), want)
    with pytest.raises(DataError, match=rf"{column!r} of {root}/part-0000.parquet at row {ROW_GROUP}.*nan='drop'"):
        _epoch(dw.WindowDataset(root, **{**KW, "shuffle": False}))


def test_mixed_schemas_across_files(frames, tmp_path):
    for dtype in (np.float64, np.int64):
        mixed = [f.copy() for f in frames]
        mixed[1]["f0"] = mixed[1]["f0"].astype(dtype)
        root = str(tmp_path / np.dtype(dtype).name)
        _write(mixed, root)
        with pytest.raises(SchemaError, match=r"column 'f0' is .* in .*part-0001.parquet but float in .*part-0000"):
            dw.WindowDataset(root, **KW)
    table = pa.Table.from_pandas(frames[1], preserve_index=False)
    zeros = pa.array(np.zeros(len(frames[1]), np.float32))
    duplicated = pa.table([*table.columns, zeros], names=[*table.column_names, "f0"])  # a bare KeyError before
    root = str(tmp_path / "duplicated")
    _write([frames[0], duplicated], root)
    with pytest.raises(SchemaError, match=r"feature 'f0' appears 2 times in .*part-0001.parquet; rewrite"):
        dw.WindowDataset(root, **KW)
    # one integer column, with nulls in one file only (same Arrow type): per-file conversions differ
    ints = [f.assign(f0=f["f0"].astype(np.int64)) for f in frames]
    ints[1] = _frames_with([ints[1]], "f0", range(5, 300, 40), "null")[0]
    root = str(tmp_path / "ints")
    _write(ints, root)
    check_epoch(_epoch(dw.WindowDataset(root, **KW, nan="drop")), oracle(ints, FEATURES, ["y"], window=8, drop=True))


def _with_empty_row_groups(frames: list[pd.DataFrame], root: str) -> None:
    os.makedirs(root)
    for i, frame in enumerate(frames):
        table = pa.Table.from_pandas(frame, preserve_index=False)
        with pq.ParquetWriter(os.path.join(root, f"part-{i:04d}.parquet"), table.schema) as writer:
            writer.write_table(table.slice(0, 0))
            for a in range(0, len(frame), ROW_GROUP):
                writer.write_table(table.slice(a, ROW_GROUP))
                writer.write_table(table.slice(0, 0))


@pytest.mark.parametrize(
    "row_group,kw",
    [
        (1, dict()),
        (1, dict(window=30, stride=3)),
        (10**6, dict()),  # one row group per file
        (7, dict(window=40, horizon=5, targets=["y", "z"])),  # the halo spans several row groups
        (5, dict(window=3, stride=4)),
        (None, dict(window=12, horizon=2)),  # empty row groups between the others
        (7, dict(window=20, partition_bytes=1)),  # a partition per row group, halos across three of them
        (None, dict(window=30, partition_bytes=1, stride=2)),  # ... and across empty ones
        (5, dict(series=None, window=3, stride=2, partition_bytes=1)),  # one series: the file's stride grid
        (7, dict(series=None, window=9, stride=4, horizon=2, partition_bytes=1)),
    ],
)
def test_row_group_shapes_against_the_oracle(frames, tmp_path, row_group, kw):
    root = str(tmp_path / "r")
    if row_group is None:
        _with_empty_row_groups(frames, root)
    else:
        _write(frames, root, row_group_size=row_group)
    settings = {**KW, "partition_bytes": None, **kw}
    ds = dw.WindowDataset(root, **settings)
    ds.set_epoch(1)
    options = {k: settings[k] for k in ("window", "stride", "horizon", "series") if k in settings}
    check_epoch(_epoch(ds), oracle(frames, FEATURES, settings["targets"], **options))


def _write_groups(frames: list[pd.DataFrame], root: str, sizes: list[int]) -> None:
    """Each frame in row groups of the given sizes, cycled (0: an empty row group)."""
    os.makedirs(root, exist_ok=True)
    for i, frame in enumerate(frames):
        table = pa.Table.from_pandas(frame, preserve_index=False)
        with pq.ParquetWriter(os.path.join(root, f"part-{i:04d}.parquet"), table.schema) as writer:
            at, k = 0, 0
            while at < len(frame):
                size = sizes[k % len(sizes)]
                writer.write_table(table.slice(at, size))
                at, k = at + size, k + 1


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**16),
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=5).filter(any),
    window=st.integers(1, 40),
    stride=st.integers(1, 5),
    horizon=st.integers(0, 3),
    pieces=st.sampled_from([None, 1]),
    buffers=st.integers(1, 3),
    split=st.booleans(),
    holes=st.lists(st.integers(0, 10**4), max_size=6),
    series=st.sampled_from(["sid", None]),
)
def test_random_row_group_layouts_against_the_oracle(
    tmp_path_factory, seed, sizes, window, stride, horizon, pieces, buffers, split, holes, series
):  # fmt: skip
    frames = make_frames(seed=seed, num_files=3, num_series=5, min_len=10, max_len=120)
    for k, hole in enumerate(holes):  # NaN features and inf targets anywhere, heads included
        frame = frames[k % 3]
        frame.loc[hole % len(frame), "f1" if k % 2 else "y"] = np.nan if k % 2 else np.inf
    root = str(tmp_path_factory.mktemp("layout"))
    _write_groups(frames, root, sizes)
    kw = dict(window=window, stride=stride, horizon=horizon, series=series)
    want = oracle(frames, FEATURES, ["y"], **kw, drop=True)
    settings_ = {**KW, **kw, "pieces_per_partition": pieces, "buffer_partitions": buffers, "nan": "drop"}
    settings_["partition_bytes"] = 1 if split else None  # a partition per row group: halos across partitions
    if not want:
        return
    ds = dw.WindowDataset(root, **settings_)
    ds.set_epoch(seed % 3)
    check_epoch(_epoch(ds), want)


def test_tiny_row_groups_open_with_a_read_per_file_not_per_row_group(tmp_path, monkeypatch):
    # The series scan read a file a row group at a time, each read parsing the whole footer: with
    # 3-row groups, 18 s to open 8,764 rows (quadratic in the row groups of a file).
    from dask_windows.sources.parquet import ParquetSource

    frames = make_frames(seed=6, num_files=3, num_series=4, min_len=1500, max_len=3000)
    root = str(tmp_path / "r")
    _write(frames, root, row_group_size=3)
    reads = []
    read = ParquetSource._read_groups
    monkeypatch.setattr(ParquetSource, "_read_groups", lambda self, i, g, c: reads.append(g) or read(self, i, g, c))
    ds = dw.WindowDataset(root, **{**KW, "window": 200})
    assert len(reads) <= 2 * len(frames), len(reads)  # the runs' scan: one read per file (and its halo)
    check_epoch(_epoch(ds), oracle(frames, FEATURES, ["y"], window=200))


def test_series_across_row_groups_unsorted_and_interleaved(tmp_path):
    rng = np.random.default_rng(4)
    keys = np.repeat(rng.permutation(np.arange(12) * 13 - 40), rng.integers(5, 70, 12))  # unsorted ids
    keys[200:260] = np.where(np.arange(60) % 2, 777, 778)  # interleaved rows of two series
    n = len(keys)
    frame = pd.DataFrame({"sid": keys, "f0": np.arange(n, dtype=np.float32), "f1": rng.standard_normal(n)})
    frame["f1"] = frame["f1"].astype(np.float32)
    frame["y"] = frame["f0"] * 10
    parts = [frame.iloc[:300].reset_index(drop=True), frame.iloc[300:].reset_index(drop=True)]
    root = str(tmp_path / "r")
    _write(parts, root, row_group_size=11)
    with pytest.warns(SeriesOrderWarning):
        ds = dw.WindowDataset(root, **{**KW, "window": 6})
    check_epoch(_epoch(ds), oracle(parts, FEATURES, ["y"], window=6))


@pytest.mark.parametrize("kind", ["str", "float", "Int64"])
def test_null_series_ids_are_one_series_not_a_crash(frames, tmp_path, kind):
    # Strings with None raised a bare TypeError from np.unique in the series-order check.
    with_nulls = []
    for frame in frames:
        keys = frame["sid"].astype({"str": object, "float": np.float64, "Int64": "Int64"}[kind])
        if kind == "str":
            keys = keys.map(str).astype(object)
        keys.iloc[30:40] = None
        with_nulls.append(frame.assign(sid=keys))
    root = str(tmp_path / "r")
    _write(with_nulls, root)
    with pytest.warns(SeriesOrderWarning, match="'sid' is not grouped"):  # the nulls cut a series in two
        ds = dw.WindowDataset(root, **KW)
    check_epoch(_epoch(ds), oracle(with_nulls, FEATURES, ["y"], window=8))


# -- real series bundled with statsmodels ------------------------------------------------------------


def _real_parts(tmp_path, frame: pd.DataFrame, cuts: list[int]) -> tuple[str, list[pd.DataFrame]]:
    bounds = [0, *cuts, len(frame)]
    parts = [frame.iloc[a:b].reset_index(drop=True) for a, b in zip(bounds[:-1], bounds[1:])]
    root = str(tmp_path / "real")
    _write(parts, root, row_group_size=37, crc=False)
    return root, parts


@pytest.mark.parametrize("stride,horizon", [(1, 0), (3, 4)])
def test_real_panel_in_small_row_groups_every_window_once(tmp_path, stride, horizon):
    real = pytest.importorskip("test_real_data")  # five statsmodels series (co2 with its NaN weeks)
    frame = real.panel_frame()
    root, parts = _real_parts(tmp_path, frame, [700, 1500, 2400, 3300])
    kw = dict(window=24, stride=stride, horizon=horizon)
    ds = dw.WindowDataset(
        root, ["value"], ["value"], series="sid", nan="drop", batch_size=64, return_index=True, **kw
    )  # fmt: skip
    want = oracle(parts, ["value"], ["value"], drop=True, **kw)
    assert len(want) > 1000 and ds.num_windows == len(want)
    check_epoch(_epoch(ds), want)


def _standardized(x: np.ndarray) -> np.ndarray:
    """Per window and channel in float64: ``(x - mean) / max(std, 1e-8)`` of a ``(C, L)`` window."""
    values = x.astype(np.float64)
    mean = values.mean(axis=1, keepdims=True)
    return (values - mean) / np.maximum(values.std(axis=1, keepdims=True), 1e-8)


def _check_sample_normalised(got: list, want: dict) -> None:
    """Every window once, standardised like the float64 reference within docs/checks.md's bound."""
    rows = np.concatenate([b[-1] for b in got])
    assert sorted(rows.tolist()) == sorted(want) and len(rows) == len(set(rows.tolist()))
    eps32 = np.finfo(np.float32).eps
    for x, y, starts in got:
        for j, row in enumerate(starts.tolist()):
            raw, target = want[row]
            values = raw.astype(np.float64)
            reference = _standardized(raw)
            std = np.maximum(values.std(axis=1, keepdims=True), 1e-8)
            bound = 2e-4 + 1e-4 * np.abs(reference) + 16 * eps32 * np.abs(values.mean(axis=1, keepdims=True)) / std
            assert (np.abs(x[j] - reference) <= bound).all(), row
            assert np.array_equal(y[j], target)


def test_real_macro_channels_sample_normalised_like_the_reference(tmp_path):
    real = pytest.importorskip("test_real_data")
    frame = real.macro_frame()
    frame = pd.concat([frame, frame.assign(quarter=frame["quarter"] + pd.Timedelta(days=1))], ignore_index=True)
    frame["sid"] = np.repeat([1, 2], len(frame) // 2)
    root, parts = _real_parts(tmp_path, frame, [150, 290])
    ds = dw.WindowDataset(
        root, real.MACRO, ["infl"], series="sid", window=20, normalize="sample", batch_size=32, return_index=True
    )  # fmt: skip
    _check_sample_normalised(_epoch(ds), oracle(parts, real.MACRO, ["infl"], window=20))


@pytest.mark.parametrize("stride,horizon", [(1, 0), (3, 2)])
def test_real_panel_sample_normalised_from_the_window_table_around_nan_weeks(tmp_path, monkeypatch, stride, horizon):
    # Buffers of more than buffer.HEAD windows: from position max(HEAD, windows / 32) on, the
    # statistics come from the per-unit table (window_table), built over rows that hold co2's NaN
    # weeks, which must only mark their blocks' windows, never give other numbers.
    from dask_windows.runtime import pool as window_table  # (the pool builds each unit's table: its name there)

    real = pytest.importorskip("test_real_data")
    panel = real.panel_frame()
    frame = pd.concat([panel.assign(sid=panel["sid"] + f"-{k}") for k in range(3)], ignore_index=True)
    root, parts = _real_parts(tmp_path, frame, [2500, 5300, 8000])
    built = []
    build = window_table.build_table
    monkeypatch.setattr(window_table, "build_table", lambda *a, **k: built.append(1) or build(*a, **k))
    ds = dw.WindowDataset(
        root, ["value"], ["value"], series="sid", window=16, stride=stride, horizon=horizon, nan="drop",
        normalize="sample", batch_size=128, buffer_partitions=4, return_index=True, pieces_per_partition=1,
    )  # fmt: skip
    want = oracle(parts, ["value"], ["value"], window=16, stride=stride, horizon=horizon, drop=True)
    _check_sample_normalised(_epoch(ds), want)
    assert built or stride > 1  # at stride 1 the table was built and used (at 3: fewer than HEAD windows)


def test_a_deleted_file_never_lets_reads_overwrite_rows_a_slow_loop_still_draws(clean, copy, frames):
    """A file's units all unreadable (``on_error="skip"``): its steps are empty, yet the builder stays one
    step ahead of a slow consumer, so the reader never writes pool rows a drawn step still uses (it used
    to run ahead through the empty steps: windows of the next file's rows over the one being drawn)."""
    import time

    work, paths = copy
    skipping = dw.WindowDataset(work, **SPLIT, on_error="skip", next_pass_seconds=0)
    os.remove(paths[1])
    with pytest.warns(SkippedPartitionWarning, match=paths[1]):
        got = []
        for batch in skipping:
            got.append(tuple(t.numpy().copy() for t in batch))
            time.sleep(0.003)  # the loop's step: the reader is done long before each batch is taken
    offsets = np.cumsum([0] + [len(f) for f in frames])
    rows = np.concatenate([b[-1] for b in got])
    assert len(got) == len(skipping) and not ((rows >= offsets[1]) & (rows < offsets[2])).any()
    assert wrong_batch(got, clean["want"]) is None
