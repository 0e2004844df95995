"""Opening local Parquet files the fast way (``parquet_open._open_local_file``) against the retried one.

The fast path (one ``read_local``, one walk of the row groups) must give what the general path
(``_open_file``: a retried tail read, then the same walk of the row groups) gives for
every kind of file, and damaged files must still raise naming the file, or be skipped, never
abort the process.
"""

from __future__ import annotations

import os
import sys
import textwrap
import warnings

import forkrun
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dask_windows.errors import SourceReadError
from dask_windows.sources import ParquetSource, identity
from dask_windows.sources.parquet.footers import FOOTER_BYTES, read_local, unpack_runs


def _write(path, frame: pd.DataFrame, **kw) -> str:
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path, **kw)
    return str(path)


def _files(root) -> list[tuple[str, int]]:
    """``(path, partition_bytes)`` of files of every kind the fast path walks."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(600).astype(np.float32)
    out = []
    cases = {
        "one_series": pd.DataFrame({"sid": np.full(600, 7, np.int64), "x": x}),
        "int32_series": pd.DataFrame({"sid": np.repeat(np.array([1, 2, 2], np.int32), 200), "x": x}),
        "runs_inside_groups": pd.DataFrame({"sid": np.sort(rng.integers(0, 9, 600)), "x": x}),
        "uint8_series": pd.DataFrame({"sid": np.repeat(np.array([3, 250], np.uint8), 300), "x": x}),
        "uint64_series": pd.DataFrame({"sid": np.full(600, 2**63 + 5, np.uint64), "x": x}),
        "string_series": pd.DataFrame({"sid": np.repeat(["a", "b"], 300), "x": x}),
        "nullable_series": pd.DataFrame({"sid": pd.array([1] * 599 + [None], dtype="Int64"), "x": x}),
        "no_series": pd.DataFrame({"other": np.arange(600), "x": x}),
        "empty": pd.DataFrame({"sid": np.array([], np.int64), "x": np.array([], np.float32)}),
    }
    for name, frame in cases.items():
        out.append((_write(root / f"{name}.parquet", frame, row_group_size=200), 2**27))
    # three row groups cut into partitions of one or two groups
    out.append((_write(root / "split.parquet", cases["int32_series"], row_group_size=200), 1500))
    # larger than the tail read, one series per row group: the statistics tell the runs
    big = pd.DataFrame({"sid": np.repeat(np.arange(4, dtype=np.int64), 10_000), "x": rng.standard_normal(40_000)})
    out.append((_write(root / "big.parquet", big, row_group_size=10_000), 2**30))
    # a footer larger than the tail read (many columns): a second read
    wide = pd.DataFrame({f"c{i:04d}_{'y' * 40}": np.arange(3, dtype=np.float64) for i in range(700)})
    wide["sid"] = np.zeros(3, np.int64)
    out.append((_write(root / "wide.parquet", wide), 2**27))
    return out


def test_fast_local_open_equals_the_retried_open(tmp_path):
    files = _files(tmp_path)
    wide = str(tmp_path / "wide.parquet")
    tail, _ = read_local(wide)
    assert int.from_bytes(tail[-8:-4], "little") + 8 > FOOTER_BYTES  # really a second read
    source = ParquetSource(files[0][0], series="sid")
    for path, partition_bytes in files:
        fast = source._open_local_file(path, partition_bytes, "sid")
        slow = source._open_file(path, None, None, partition_bytes, "sid")
        assert fast.footer.raw == slow.footer.raw, path
        assert fast.footer.size == slow.footer.size == os.path.getsize(path)
        meta = pq.read_metadata(path)
        assert (
            fast.footer.rows
            == slow.footer.rows
            == tuple(meta.row_group(g).num_rows for g in range(meta.num_row_groups))
        )
        assert fast.schema.equals(slow.schema) and fast.splits == slow.splits, path
        assert fast.identity == identity.local(path)
        if slow.runs is None:
            assert fast.runs is None, path
            continue
        got, want = unpack_runs(fast.runs), unpack_runs(slow.runs)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
            assert np.asarray(a).dtype == np.asarray(b).dtype, path
    assert source._open_local_file(str(tmp_path / "split.parquet"), 1500, "sid").splits == [(0,), (1,), (2,)]


def test_a_folder_opened_fast_reads_what_pandas_reads(tmp_path):
    """Mixed schemas (int32 and int64 series) and sizes in one folder: runs equal a scan of the column,
    each file's identity is its stat, and rows equal pandas'."""
    rng = np.random.default_rng(5)
    for f in range(6):
        rows = int(rng.integers(1, 400))
        sid = np.sort(rng.integers(0, 3, rows)) + 10 * f
        frame = pd.DataFrame({"sid": sid.astype(np.int32 if f % 2 else np.int64), "x": rng.standard_normal(rows)})
        _write(tmp_path / f"p{f}.parquet", frame, row_group_size=int(rng.integers(20, 200)))
    source = ParquetSource(str(tmp_path), series="sid", threads=2)
    assert [os.path.basename(p) for p in source.files] == [f"p{f}.parquet" for f in range(6)]
    for i, part in enumerate(source.partitions):
        path = part.key[0]
        keys = pd.read_parquet(path)["sid"].to_numpy()
        assert part.num_rows == len(keys)
        starts, lengths, run_keys = source.read_runs(i, "sid")
        np.testing.assert_array_equal(np.repeat(run_keys, lengths), keys)
        np.testing.assert_array_equal(starts, np.concatenate([[0], np.cumsum(lengths)[:-1]]))
        assert source._identities[path] == identity.local(path)


@pytest.mark.parametrize(
    "damage", ["truncated_footer", "garbage_footer", "length_past_start", "no_magic", "empty_file", "broken_link"]
)
def test_damaged_files_raise_naming_the_file_or_are_skipped(tmp_path, damage):
    good = _write(tmp_path / "a.parquet", pd.DataFrame({"sid": np.zeros(50, np.int64), "x": np.ones(50)}))
    bad = tmp_path / "b.parquet"
    data = open(good, "rb").read()
    footer = int.from_bytes(data[-8:-4], "little")
    if damage == "truncated_footer":
        bad.write_bytes(data[: len(data) - 8 - footer // 2] + data[-8:])
    elif damage == "garbage_footer":
        noise = np.random.default_rng(0).integers(0, 256, footer, dtype=np.uint8).tobytes()
        bad.write_bytes(data[: len(data) - 8 - footer] + noise + data[-8:])
    elif damage == "length_past_start":
        bad.write_bytes(data[:-8] + (len(data) + 100).to_bytes(4, "little") + b"PAR1")
    elif damage == "no_magic":
        bad.write_bytes(data[:-4])
    elif damage == "empty_file":
        bad.write_bytes(b"")
    else:
        os.symlink(tmp_path / "missing.parquet", bad)
    with pytest.raises((SourceReadError, FileNotFoundError)) as caught:
        ParquetSource(str(tmp_path), series="sid")
    assert str(bad) in str(caught.value)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        source = ParquetSource(str(tmp_path), series="sid", on_error="skip")
    assert source.files == [good]
    assert [s.name for s in source.skipped] == [str(bad)]
    assert any(str(bad) in str(w.message) for w in seen)


def test_a_damaged_footer_never_aborts_the_process(tmp_path):
    """pyarrow's unpickling fast path aborts on damaged thrift: opening must raise instead."""
    good = _write(tmp_path / "a.parquet", pd.DataFrame({"sid": np.zeros(50, np.int64), "x": np.ones(50)}))
    data = open(good, "rb").read()
    footer = int.from_bytes(data[-8:-4], "little")
    for seed in range(20):
        flipped = bytearray(data)
        rng = np.random.default_rng(seed)
        for at in rng.integers(len(data) - 8 - footer, len(data) - 8, 8):
            flipped[at] ^= int(rng.integers(1, 256))
        (tmp_path / f"z{seed:02d}.parquet").write_bytes(bytes(flipped))
    script = textwrap.dedent(
        f"""
        import warnings
        from dask_windows.sources import ParquetSource
        warnings.simplefilter("ignore")
        source = ParquetSource({str(tmp_path)!r}, series="sid", on_error="skip")
        print("opened", len(source.files), len(source.skipped))
        """
    )
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(os.path.dirname(__file__)))))
    out = forkrun.run([sys.executable, "-c", script], env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    opened, skipped = map(int, out.stdout.split()[1:])
    assert opened + skipped == 21 and opened >= 1


@pytest.mark.parametrize("waits", [False, True])
def test_local_opening_gives_the_same_results_on_one_thread_or_many(waits):
    """``_open_local`` stays on its thread while opening computes and goes to threads while it waits
    (a cold disk); either way every file's result comes back once, in order."""
    import threading
    import time

    from dask_windows.sources.parquet.opening import PROBE_FILES, _open_local

    seen: set[int] = set()

    def one(path: str) -> str:
        seen.add(threading.get_ident())
        if waits:
            time.sleep(0.0005)  # waiting, not computing
        else:
            sum(range(300))  # computing
        return path.upper()

    files = [f"f{i:05d}" for i in range(3 * PROBE_FILES)]
    assert _open_local(one, files, 4) == [f.upper() for f in files]
    if waits:  # (computing goes to threads too on a loaded machine: not asserted)
        assert len(seen) > 1
    seen.clear()
    assert _open_local(one, files[:10], 4) == [f.upper() for f in files[:10]] and len(seen) == 1


def test_a_schema_added_on_one_thread_while_another_looks_through_them_fails_no_file(tmp_path):
    """Files are opened on several threads (every remote one; local blocks): a thread adding a new
    schema while another compares its file's schema with those met so far made that file fail with
    ``RuntimeError: dictionary changed size during iteration`` (found by a CI run on S3; with
    ``on_error="skip"`` a good file would have been left out)."""
    import threading
    import time

    from dask_windows.sources.parquet.opening import ParquetOpening

    opened = []
    for name in ("a", "b"):
        path = _write(tmp_path / f"{name}.parquet", pd.DataFrame({"sid": [1, 1], name: [0.5, 1.5]}))
        opened.append(pq.ParquetFile(path))

    class Slow:
        """A schema met earlier whose comparison takes a while (the thread loses the GIL in it)."""

        entered = threading.Event()

        def equals(self, other) -> bool:
            self.entered.set()
            time.sleep(0.3)
            return False

    opening = ParquetOpening()
    opening.__dict__["_open_schemas"] = {"earlier": [Slow(), None]}
    results: dict = {}

    def open_one(k: int) -> None:
        try:
            results[k] = opening._file_schema(opened[k], opened[k].metadata, "sid")
        except Exception as exc:  # reported below
            results[k] = exc

    first = threading.Thread(target=open_one, args=(0,))
    first.start()
    assert Slow.entered.wait(30)
    open_one(1)  # a new schema, added while the first thread compares
    first.join(30)
    for k, name in enumerate("ab"):
        assert not isinstance(results[k], Exception), results[k]
        schema, column, _ = results[k]
        assert schema.names == ["sid", name] and column == 0


def test_a_hive_folder_missing_its_key_column_hints_partitioning_hive(tmp_path):
    """pandas' partition_cols moves the key into folder names (sid=1/): the error says how to read it back."""
    import pyarrow.dataset as pads

    import dask_windows as dw
    from dask_windows.errors import SchemaError

    frame = pd.DataFrame({"sid": np.repeat([1, 2], 40), "x": np.arange(80, dtype=np.float32)})
    frame.to_parquet(tmp_path / "hive", partition_cols=["sid"])
    with pytest.raises(SchemaError, match=r"series column 'sid' is missing.*'sid' is the key of its folders.*"
                                          r"partitioning=\"hive\""):  # fmt: skip
        dw.WindowDataset(str(tmp_path / "hive"), ["x"], series="sid", window=8)
    with pytest.raises(SchemaError, match=r"feature 'y' is missing.*keyed by \['sid'\].*partitioning=\"hive\""):
        dw.WindowDataset(str(tmp_path / "hive"), ["x", "y"], series=None, window=8)
    hive = pads.dataset(str(tmp_path / "hive"), format="parquet", partitioning="hive")  # the remedy works
    assert len(dw.WindowDataset(hive, ["x"], series="sid", window=8, batch_size=1)) == 2 * (40 - 8 + 1)
    plain = tmp_path / "plain"
    plain.mkdir()
    frame.to_parquet(plain / "p.parquet")
    with pytest.raises(SchemaError) as info:  # no key=value folders: no hint
        dw.WindowDataset(str(plain), ["x", "y"], series="sid", window=8)
    assert "partitioning" not in str(info.value)
