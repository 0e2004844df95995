"""Arrow-world sources (pandas, pyarrow, Polars, Hugging Face, Delta) against a brute-force oracle."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
import torch
from helpers import make_frames, oracle_starts, write_parquet

import dask_windows as dw
from dask_windows.errors import ConfigError
from dask_windows.sources.arrow import ArrowSource, memory_mapped

WINDOW = 7


@pytest.fixture(scope="module")
def frames():
    return make_frames(seed=2, num_files=4, num_series=11, min_len=2, max_len=70)


@pytest.fixture(scope="module")
def whole(frames):
    return pd.concat(frames, ignore_index=True)


def _hf_in_memory(frame, tmp):
    datasets = pytest.importorskip("datasets", reason="pip install datasets")
    return datasets.Dataset.from_pandas(frame, preserve_index=False)


def _hf_on_disk(frame, tmp):
    datasets = pytest.importorskip("datasets", reason="pip install datasets")
    datasets.Dataset.from_pandas(frame, preserve_index=False).save_to_disk(str(tmp / "hf"))
    loaded = datasets.load_from_disk(str(tmp / "hf"))
    assert loaded.cache_files  # backed by Arrow files: travels to workers as file names
    return loaded


def _polars(frame, tmp):
    pl = pytest.importorskip("polars", reason="pip install polars")
    return pl.from_pandas(frame)


def _polars_lazy(frame, tmp):
    pl = pytest.importorskip("polars", reason="pip install polars")
    return pl.from_pandas(frame).lazy()


def _feather(frame, tmp):
    feather.write_feather(pa.Table.from_pandas(frame, preserve_index=False), str(tmp / "t.arrow"))
    return memory_mapped(str(tmp / "t.arrow"))


TABLES = {
    "pandas": lambda frame, tmp: frame,
    "pyarrow-table": lambda frame, tmp: pa.Table.from_pandas(frame, preserve_index=False),
    "pyarrow-batch": lambda frame, tmp: pa.RecordBatch.from_pandas(frame, preserve_index=False),
    "polars": _polars,
    "polars-lazy": _polars_lazy,
    "hf-memory": _hf_in_memory,
    "hf-disk": _hf_on_disk,
    "feather-mmap": _feather,
}


def epoch_batches(ds, **loader):
    return [tuple(t.numpy() for t in b) for b in torch.utils.data.DataLoader(ds, batch_size=None, **loader)]


def check_windows(batches, whole, horizon):
    """Every window holds the rows its start claims; y holds the target ``horizon`` rows on."""
    f0, y = whole["f0"].to_numpy(np.float32), whole["y"].to_numpy(np.float32)
    for x, target, start in batches:
        rows = start[:, None] + np.arange(WINDOW)
        assert np.array_equal(x[:, 0, :], f0[rows])
        if horizon:
            assert np.array_equal(target[:, 0, :], y[start[:, None] + WINDOW + np.arange(horizon)])
        else:
            assert np.array_equal(target[:, 0], y[start + WINDOW - 1])


@pytest.mark.parametrize("kind", sorted(TABLES))
@pytest.mark.parametrize("partition_rows,stride,horizon", [(13, 1, 0), (40, 3, 2), (1_000_000, 2, 0)])
def test_tables_in_memory_yield_every_window_once(kind, partition_rows, stride, horizon, whole, tmp_path):
    data = TABLES[kind](whole, tmp_path)
    ds = dw.WindowDataset(
        data, features=["f0", "f1"], targets=["y"], series="sid", window=WINDOW, stride=stride, horizon=horizon,
        batch_size=16, return_index=True, partition_rows=partition_rows,
    )  # fmt: skip
    assert isinstance(ds.source, ArrowSource)
    batches = epoch_batches(ds)
    starts = np.concatenate([b[-1] for b in batches])
    expected = oracle_starts([whole], "sid", WINDOW, stride, horizon)  # series over the whole table
    assert len(starts) == len(np.unique(starts)) == ds.num_windows
    assert np.array_equal(np.sort(starts), expected)
    check_windows(batches, whole, horizon)


def test_one_series_table_is_cut_without_losing_windows(whole):
    ds = dw.WindowDataset(whole, features=["f0"], window=WINDOW, stride=4, batch_size=8, return_index=True,
                          partition_rows=25)  # fmt: skip
    assert len(ds.partitions) > 10
    starts = np.concatenate([b[-1] for b in epoch_batches(ds)])
    assert np.array_equal(np.sort(starts), oracle_starts([whole], None, WINDOW, 4))


@pytest.mark.parametrize("kind", ["pandas", "hf-disk", "feather-mmap"])
def test_workers_ranks_and_resume_are_exact(kind, whole, tmp_path):
    data = TABLES[kind](whole, tmp_path)
    args = dict(features=["f0", "f1"], targets=["y"], series="sid", window=WINDOW, batch_size=8, return_index=True,
                partition_rows=30, seed=5)  # fmt: skip
    expected = oracle_starts([whole], "sid", WINDOW)
    ranks = [dw.WindowDataset(data, rank=r, world_size=2, **args) for r in range(2)]
    shares = [np.concatenate([b[-1] for b in epoch_batches(ds, num_workers=2)]) for ds in ranks]
    assert len(epoch_batches(ranks[0])) == len(epoch_batches(ranks[1])) == len(ranks[0])
    union = np.concatenate(shares)
    assert len(np.unique(union)) == len(union) == len(expected) // 2 * 2 and np.isin(union, expected).all()
    single = dw.WindowDataset(data, **args)
    full = epoch_batches(single)
    workers = epoch_batches(dw.WindowDataset(data, **args), num_workers=2)
    assert np.array_equal(np.sort(np.concatenate([b[-1] for b in full])), expected)
    assert np.array_equal(np.sort(np.concatenate([b[-1] for b in workers])), expected)
    it = iter(single)  # epoch 1 (the second pass)
    taken = [next(it) for _ in range(3)]
    state = single.state_dict()
    rest = [tuple(t.numpy() for t in b) for b in it]
    resumed = dw.WindowDataset(data, **args)
    resumed.load_state_dict(state)
    again = epoch_batches(resumed)
    assert len(taken) + len(again) == len(single)
    for a, b in zip(rest, again):
        assert all(np.array_equal(u, v) for u, v in zip(a, b))


def test_pickles_file_names_not_data(whole, tmp_path):
    on_disk = dw.WindowDataset(TABLES["hf-disk"](whole, tmp_path), features=["f0"], series="sid", window=WINDOW)
    mapped = dw.WindowDataset(TABLES["feather-mmap"](whole, tmp_path), features=["f0"], series="sid", window=WINDOW)
    in_memory = dw.WindowDataset(whole, features=["f0"], series="sid", window=WINDOW)
    table_bytes = pa.Table.from_pandas(whole).nbytes
    assert len(pickle.dumps(in_memory.source)) > table_bytes  # an in-memory table travels by value
    for ds in (on_disk, mapped):
        assert len(pickle.dumps(ds.source)) < table_bytes / 4
        clone = pickle.loads(pickle.dumps(ds))
        assert np.array_equal(clone.source.read(0, ["f0"])["f0"], ds.source.read(0, ["f0"])["f0"])


def _hf_edits(loaded):
    """A loaded Hugging Face dataset changed in memory, each way that leaves its cache files as they were."""
    replaced = list(np.arange(loaded.num_rows, dtype=np.float64) * 100)
    return {  # "z" is the last column: replacing it keeps the column names and their order
        "remove+add": loaded.remove_columns("z").add_column("z", replaced),
        "rename+add": loaded.rename_column("z", "old_z").add_column("z", replaced),
        "contiguous select": loaded.select(range(5, loaded.num_rows)),
    }


def test_hf_dataset_changed_in_memory_is_read_as_it_is_in_memory(whole, tmp_path):
    loaded = _hf_on_disk(whole, tmp_path)
    assert loaded.column_names[-1] == "z"
    for edit, changed in _hf_edits(loaded).items():
        assert changed.cache_files == loaded.cache_files, edit  # the files still hold the old table
        expected = changed.to_pandas()  # the oracle: the dataset as it is in memory
        ds = dw.WindowDataset(changed, features=["z"], targets=["y"], series="sid", window=WINDOW, batch_size=64,
                              return_index=True)  # fmt: skip
        batches = epoch_batches(ds)
        starts = np.concatenate([b[-1] for b in batches])
        assert np.array_equal(np.sort(starts), oracle_starts([expected], "sid", WINDOW)), edit
        z = expected["z"].to_numpy(np.float32)
        for x, _, start in batches:
            assert np.array_equal(x[:, 0, :], z[start[:, None] + np.arange(WINDOW)]), edit


@pytest.fixture(scope="module")
def parquet_files(frames, tmp_path_factory):
    root = tmp_path_factory.mktemp("pads")
    write_parquet(frames, str(root), row_group_size=23)
    return str(root)


def test_pyarrow_dataset_fragments_are_partitions(frames, parquet_files):
    dataset = pads.dataset(parquet_files, format="parquet")
    ds = dw.WindowDataset(dataset, features=["f0", "f1"], targets=["y"], series="sid", window=WINDOW,
                          batch_size=8, return_index=True)  # fmt: skip
    assert [p.name for p in ds.partitions] == [f.path for f in dataset.get_fragments()]
    assert len(pickle.dumps(ds.source)) < 20_000  # fragments (paths), not rows
    for loader in ({}, {"num_workers": 2}):
        batches = epoch_batches(ds, **loader)
        starts = np.sort(np.concatenate([b[-1] for b in batches]))
        assert np.array_equal(starts, oracle_starts(frames, "sid", WINDOW))  # windows never cross a file
        check_windows(batches, pd.concat(frames, ignore_index=True), 0)


def test_large_fragments_split_at_row_groups(frames, parquet_files):
    ds = dw.WindowDataset(pads.dataset(parquet_files), features=["f0"], series="sid", window=WINDOW,
                          return_index=True, partition_bytes=1)  # fmt: skip
    assert any("row groups" in p.name for p in ds.partitions)
    groups = []  # the oracle: every row group its own frame
    for frame in frames:
        groups += [frame.iloc[a : a + 23] for a in range(0, len(frame), 23)]
    starts = np.sort(np.concatenate([b[-1].numpy() for b in ds]))
    assert np.array_equal(starts, oracle_starts(groups, "sid", WINDOW))


def test_hive_partition_keys_are_columns(tmp_path):
    rng = np.random.default_rng(3)
    lengths = {"S0": [30, 12], "S1": [5], "S2": [41]}
    pieces = []
    for sid, sizes in lengths.items():
        os.makedirs(tmp_path / f"sid={sid}" / "site=4")
        for k, n in enumerate(sizes):
            frame = pd.DataFrame({"f0": rng.standard_normal(n).astype(np.float32), "y": np.arange(n, dtype=np.float32)})
            pq.write_table(pa.Table.from_pandas(frame), tmp_path / f"sid={sid}" / "site=4" / f"part-{k}.parquet")
            pieces.append(frame.assign(sid=sid, site=4))
    dataset = pads.dataset(str(tmp_path), format="parquet", partitioning="hive")
    order = [f.path for f in dataset.get_fragments()]
    pieces = [pieces[[str(p) for p in sorted(order)].index(path)] for path in order]
    ds = dw.WindowDataset(dataset, features=["f0", "site"], targets=["y"], series="sid", window=4,
                          batch_size=8, return_index=True)  # fmt: skip
    batches = [tuple(t.numpy() for t in b) for b in ds]
    starts = np.sort(np.concatenate([b[-1] for b in batches]))
    assert np.array_equal(starts, oracle_starts(pieces, "sid", 4))
    assert all((b[0][:, 1, :] == 4).all() for b in batches)  # the hive key as a feature


def test_delta_table_through_its_pyarrow_dataset(whole, tmp_path):
    deltalake = pytest.importorskip("deltalake", reason="pip install deltalake")
    deltalake.write_deltalake(str(tmp_path / "delta"), pa.Table.from_pandas(whole, preserve_index=False))
    table = deltalake.DeltaTable(str(tmp_path / "delta"))
    ds = dw.WindowDataset(table, features=["f0"], targets=["y"], series="sid", window=WINDOW, return_index=True)
    starts = np.sort(np.concatenate([b[-1].numpy() for b in ds]))
    assert np.array_equal(starts, oracle_starts([whole], "sid", WINDOW))  # one file written: one fragment


def test_refusals_name_the_remedy(whole):
    datasets = pytest.importorskip("datasets", reason="pip install datasets")
    shuffled = datasets.Dataset.from_pandas(whole, preserve_index=False).shuffle(seed=0)
    with pytest.raises(ConfigError, match="flatten_indices"):
        dw.WindowDataset(shuffled, features=["f0"], series="sid", window=WINDOW)
    with pytest.raises(TypeError, match="pandas/Polars DataFrame"):
        dw.WindowDataset({"f0": [1.0]}, features=["f0"], window=WINDOW)
    with pytest.raises(dw.SchemaError, match="'nope'"):
        dw.WindowDataset(whole, features=["nope"], window=WINDOW)


@pytest.mark.parametrize(
    "column",
    [
        pa.chunked_array([pa.array(np.arange(5, dtype=np.float32)), pa.array(np.arange(3, dtype=np.float32) - 9)]),
        pa.chunked_array([pa.array(np.arange(9, dtype=np.float64)), pa.array([np.nan, np.inf, -1.5])]).slice(4, 6),
        pa.chunked_array([pa.array(np.arange(7, dtype=np.int8)).slice(2)]),
        pa.chunked_array([pa.array(np.arange(4, dtype=np.uint32)), pa.array(np.zeros(0, np.uint32))]),
        pa.chunked_array([pa.array(np.arange(6, dtype=np.int64) - 3)]),
        pa.chunked_array([pa.array(np.arange(6, dtype=np.float16))]),
        pa.chunked_array([], pa.float32()),
        pa.array(np.arange(10, dtype=np.int16)).slice(3, 4),
        pa.chunked_array([pa.array([1.5, None, 2.0], pa.float32())]),  # nulls: to_numpy's NaN
        pa.chunked_array([pa.array([True, False, True])]),
        pa.chunked_array([pa.array(np.arange(3).astype("datetime64[ms]"))]),
    ],
)
def test_numpy_column_is_to_numpy(column):
    from dask_windows.sources.arrow import numpy_column

    got = numpy_column(column)
    expected = column.to_numpy(zero_copy_only=False) if isinstance(column, pa.Array) else column.to_numpy()
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert np.array_equal(got, expected, equal_nan=got.dtype.kind == "f")


def test_reading_parquet_numbers_does_not_import_pandas(tmp_path):
    """pyarrow's ``to_numpy`` imports pandas on its first call: 0.3-1 s on the way to the first batch."""
    import subprocess
    import sys

    rows = 50
    pq.write_table(pa.table({"f0": np.arange(rows, dtype=np.float32), "t": np.arange(rows)}), tmp_path / "a.parquet")
    code = (
        "import sys, dask_windows as dw\n"
        f"ds = dw.WindowDataset({str(tmp_path)!r}, features=['f0'], targets=['t'], series=None, window=4,"
        " batch_size=8, seed=1)\n"
        "x, y = next(iter(ds))\n"
        "assert x.shape == (8, 1, 4), x.shape\n"
        "print('pandas' in sys.modules)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(os.path.dirname(__file__))))
    env = dict(os.environ, PYTHONPATH=root)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "False"
