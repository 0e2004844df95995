"""Corpora read as their writers mean them (issue 34): each test guards one case that was silently wrong.

Written with the ecosystem's own writers (GluonTS's ``ArrowWriter``, Hugging Face ``datasets``,
pyarrow) where they install; ``tests/corpus/test_corpus_conformance.py`` crosses the formats with
hostile values.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dask_windows as dw
from dask_windows.corpus import ListSource
from dask_windows.errors import ConfigError, DataError, SchemaError

KW = dict(patch_size=4, max_length=16, batch_size=4, shuffle=False, return_index=True)


def served(ds):
    """``{(series, channel): {step: value or NaN if masked}}`` of one epoch (each step once)."""
    out: dict = {}
    for b in ds:
        b = {k: v.numpy() for k, v in b.items()}
        for i, t in zip(*np.nonzero(b["sample_id"] > 0)):
            key = (int(b["series_id"][i, t]), int(b["variate_id"][i, t]))
            for k in range(b["target"].shape[-1]):
                step = int(b["step"][i, t]) + k
                if step < 0:
                    continue
                assert step not in out.setdefault(key, {})
                out[key][step] = float(b["target"][i, t, k]) if b["observed_mask"][i, t, k] else np.nan
    return out


def as_arrays(got, lengths):
    return {key: np.array([steps[s] for s in range(lengths[key[0]])]) for key, steps in got.items()}


def test_inf_and_float32_overflow_are_served_masked_and_counted(tmp_path):
    path = str(tmp_path / "x.parquet")
    rows = [[1.0, np.inf, 2.0, -np.inf], [1e39, 3.0, -1e39, np.nan]]
    pq.write_table(pa.table({"target": pa.array(rows, pa.list_(pa.float64()))}), path)
    ds = dw.CorpusDataset(path, **KW)
    got = as_arrays(served(ds), [4, 4])
    np.testing.assert_array_equal(got[(0, 0)], [1.0, np.nan, 2.0, np.nan])
    np.testing.assert_array_equal(got[(1, 0)], [np.nan, 3.0, np.nan, np.nan])
    missing = ds.report(values=True)["datasets"][path]["missing"]
    assert missing["missing_observations"] == 5 and missing["infinite_observations"] == 4
    kept = dw.CorpusDataset(path, nan="keep", **KW)  # left NaN, never inf
    for b in kept:
        assert not np.isinf(b["target"].numpy()).any()


def _gluonts_rows(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


@pytest.mark.parametrize("suffix", ["arrow", "parquet"])
@pytest.mark.parametrize("multivariate", [False, True])
def test_gluonts_writers_are_read_as_channels_by_steps(tmp_path, multivariate, suffix):
    pd = pytest.importorskip("pandas")
    shapes = [(3, 12), (4, 7), (3, 9)] if multivariate else [(12,), (7,), (9,)]
    arrays = _gluonts_rows(shapes)
    path = tmp_path / f"g.{suffix}"
    try:
        from gluonts.dataset.arrow import ArrowWriter, ParquetWriter

        entries = [{"start": pd.Period("2000-01-01", "D"), "target": a, "freq": "D"} for a in arrays]
        writer = ArrowWriter(compression=None) if suffix == "arrow" else ParquetWriter()
        writer.write_to_file(entries, path)
    except ImportError:  # GluonTS's layout by hand: a flat list beside target._np_shape
        columns = {"target": pa.array([a.ravel() for a in arrays], pa.list_(pa.float32())), "freq": ["D"] * 3}
        if multivariate:
            columns["target._np_shape"] = pa.array([list(a.shape) for a in arrays], pa.list_(pa.int64()))
        if suffix == "parquet":
            pq.write_table(pa.table(columns), str(path))
        else:
            with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, pa.table(columns).schema) as w:
                w.write_table(pa.table(columns))
    src = ListSource(str(path))
    assert src.lengths.tolist() == [s[-1] for s in shapes]
    assert src.channels.tolist() == [s[0] if multivariate else 1 for s in shapes]
    got = as_arrays(served(dw.CorpusDataset(str(path), **KW)), src.lengths)
    for r, a in enumerate(arrays):
        for c, channel in enumerate(np.atleast_2d(a)):
            np.testing.assert_array_equal(got[(r, c)], channel)


def test_gluonts_shape_that_does_not_fit_the_values_is_refused(tmp_path):
    table = pa.table({"target": pa.array([[1.0] * 6], pa.list_(pa.float32())), "target._np_shape": pa.array([[4, 2]])})
    pq.write_table(table, str(tmp_path / "x.parquet"))
    with pytest.raises(SchemaError, match=r"_np_shape.*4 x 2 values where column 'target' holds 6"):
        ListSource(str(tmp_path / "x.parquet"))


def test_lotsa_fixed_size_list_is_read_as_multivariate(tmp_path):
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"target": datasets.Sequence(datasets.Sequence(datasets.Value("float32")), length=2)})
    rows = [[[1.0, 2.0, 3.0], [4.0, None, 6.0]], [[7.0] * 5, [8.0] * 5]]
    data = datasets.Dataset.from_dict({"target": rows}, features=features)
    assert pa.types.is_fixed_size_list(data.data.schema.field("target").type)
    data.save_to_disk(str(tmp_path / "lotsa"))
    for given in (str(tmp_path / "lotsa"), data):
        src = ListSource(given)
        assert src.lengths.tolist() == [3, 5] and src.channels.tolist() == [2, 2]
        got = as_arrays(served(dw.CorpusDataset(given, **KW)), src.lengths)
        np.testing.assert_array_equal(got[(0, 1)], [4.0, np.nan, 6.0])
        np.testing.assert_array_equal(got[(1, 0)], [7.0] * 5)


def test_hf_dataset_changed_in_memory_is_read_as_it_is_in_memory(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"target": [[1.0, 2.0], [3.0, 4.0, 5.0]]}).save_to_disk(str(tmp_path / "hf"))
    data = datasets.load_from_disk(str(tmp_path / "hf"))
    changed = data.rename_column("target", "old").add_column("target", [[9.0] * 4, [8.0] * 6])
    src = ListSource(changed)
    assert src.lengths.tolist() == [4, 6]
    got = as_arrays(served(dw.CorpusDataset(changed, **KW)), src.lengths)
    assert got[(0, 0)].tolist() == [9.0] * 4 and got[(1, 0)].tolist() == [8.0] * 6
    mapped = data.map(lambda row: {"target": [v * 10 for v in row["target"]]})
    assert ListSource(mapped).lengths.tolist() == [2, 3]
    got = as_arrays(served(dw.CorpusDataset(mapped, **KW)), [2, 3])
    assert got[(1, 0)].tolist() == [30.0, 40.0, 50.0]
    in_memory = datasets.Dataset.from_dict({"target": [[1.0, 2.0, 3.0]]})  # no cache file at all
    assert ListSource(in_memory).lengths.tolist() == [3]


def test_datasetdict_needs_a_split_chosen(tmp_path):
    datasets = pytest.importorskip("datasets")
    split = datasets.Dataset.from_dict({"target": [[1.0, 2.0]]})
    dd = datasets.DatasetDict({"train": split, "test": split})
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(SchemaError, match=r"DatasetDict folder of the splits \['train', 'test'\].*dd/train"):
        ListSource(str(tmp_path / "dd"))
    with pytest.raises(SchemaError, match=r"DatasetDict holds the splits \['train', 'test'\].*data\['train'\]"):
        ListSource(dd)
    assert ListSource(str(tmp_path / "dd" / "train")).lengths.tolist() == [2]


def test_freq_ids_do_not_depend_on_the_file_format(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = {"target": [[1.0] * 3] * 6, "freq": ["h", None, "D", "h", "W", None]}
    table = pa.table({"target": pa.array(rows["target"], pa.list_(pa.float64())), "freq": rows["freq"]})
    pq.write_table(table, str(tmp_path / "a.parquet"), row_group_size=2)
    with pa.OSFile(str(tmp_path / "b.arrow"), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table, max_chunksize=4)
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "c"))
    sources = [ListSource(str(tmp_path / p)) for p in ("a.parquet", "b.arrow", "c")]
    for src in sources:  # first appearance by row, whatever the partitions
        assert src.freqs == ["h", "unknown", "D", "W"]
        assert [src.freqs[c] for c in src.freq_codes] == ["h", "unknown", "D", "h", "W", "unknown"]
    assert ListSource(str(tmp_path / "a.parquet"), freq="D").freqs == ["h", "D", "W"]  # null rows take freq=


def test_bad_frequencies_and_unmatched_patch_sizes_are_refused(tmp_path):
    path = str(tmp_path / "x.parquet")
    pq.write_table(pa.table({"target": pa.array([[1.0] * 8], pa.list_(pa.float64())), "freq": ["H"]}), path)
    with pytest.raises(ConfigError, match=r"freq='hourly' is not a frequency"):
        dw.CorpusDataset(path, freq="hourly", **KW)
    with pytest.raises(ConfigError, match=r"a key of patch_sizes='1 day' is not a frequency"):
        dw.CorpusDataset(path, patch_sizes={"1 day": 2}, **KW)
    with pytest.raises(ConfigError, match=r"freqs\[...\]='x' is not a frequency"):
        dw.CorpusDataset(path, freqs=["H", "x"], **KW)
    ds = dw.CorpusDataset(path, patch_sizes={"D": 2}, **KW)
    with pytest.raises(ConfigError, match=r"patch_sizes keys \['D'\] match no frequency .*\['H'\]"):
        len(ds)
    with pytest.raises(ConfigError, match=r"patch_sizes keys 'H' and 'h' name one frequency"):
        dw.CorpusDataset(path, patch_sizes={"H": 2, "h": 4}, **KW)
    lower = dw.CorpusDataset(path, patch_sizes={"1h": 2}, **KW)  # "H" and "1h" are one frequency
    assert {int(v) for b in lower for v in b["patch_size"][b["sample_id"] > 0]} == {2}
    pq.write_table(pa.table({"target": pa.array([[1.0]], pa.list_(pa.float64())), "freq": ["daily"]}), path)
    with pytest.raises(SchemaError, match=r"x.parquet.*column 'freq' holds 'daily', which is not a frequency"):
        ListSource(path)


@pytest.mark.parametrize(
    "spellings",
    [("H", "h", "1h", "1H"), ("15T", "15min"), ("A", "Y", "YE", "Y-DEC", "A-DEC"), ("W", "W-SUN"), ("M", "ME"),
     ("Q", "QE-DEC"), ("S", "s", "1s"), ("MS",), ("ms", "L")],
)  # fmt: skip
def test_freq_key_joins_the_spellings_of_one_frequency(spellings):
    from dask_windows.corpus.freqs import freq_key

    keys = {freq_key(f) for f in spellings}
    assert len(keys) == 1
    others = {"H", "15T", "A", "W", "M", "Q", "S", "MS", "ms"} - {spellings[0]}
    assert not keys & {freq_key(f) for f in others}


def test_tampered_report_is_refused(tmp_path):
    from dask_windows.corpus.report import verify_report

    path = str(tmp_path / "x.parquet")
    pq.write_table(pa.table({"target": pa.array([[1.0, None, 3.0]] * 4, pa.list_(pa.float64()))}), path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = dw.CorpusDataset(path, **KW).report(values=True)
    saved = Path(tmp_path / "report.json")
    saved.write_text(json.dumps(report))
    loaded = json.loads(saved.read_text())
    assert verify_report(loaded, str(saved)) == loaded  # a JSON round trip keeps it
    loaded["datasets"][path]["missing"]["missing_observations"] = 0
    with pytest.raises(DataError, match=r"report.json does not match its checksum"):
        verify_report(loaded, str(saved))
    del loaded["checksum"]
    with pytest.raises(DataError, match="has no checksum"):
        verify_report(loaded)


def test_gluonts_covariates_with_shape_are_read_as_channels(tmp_path):
    """GluonTS writes ``feat_dynamic_real`` (features x steps) flat beside ``feat_dynamic_real._np_shape``."""
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(1)
    rows = [(rng.standard_normal(n), rng.standard_normal((2, n))) for n in (9, 13, 6)]
    path = tmp_path / "cov.arrow"
    try:
        from gluonts.dataset.arrow import ArrowWriter

        entries = [{"start": pd.Period("2000-01-01", "D"), "target": t, "feat_dynamic_real": x} for t, x in rows]
        ArrowWriter(compression=None).write_to_file(entries, path)
    except ImportError:
        table = pa.table(
            {
                "target": pa.array([t for t, _ in rows], pa.list_(pa.float64())),
                "feat_dynamic_real._np_shape": pa.array([list(x.shape) for _, x in rows], pa.list_(pa.int64())),
                "feat_dynamic_real": pa.array([x.ravel() for _, x in rows], pa.list_(pa.float64())),
            }
        )
        with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table)
    src = ListSource(str(path), covariates=["feat_dynamic_real"])
    assert src.channels.tolist() == [3, 3, 3] and src.target_channels.tolist() == [1, 1, 1]
    part = src.read(0)
    for r, (t, x) in enumerate(rows):
        n = len(t)
        got = part.values[part.starts[r] : part.starts[r] + 3 * n].reshape(3, n)
        np.testing.assert_array_equal(got, np.vstack([t, x]).astype(np.float32))


def test_hf_dataset_changed_in_memory_reaches_dataloader_workers(tmp_path):
    datasets = pytest.importorskip("datasets")
    torch = pytest.importorskip("torch")
    datasets.Dataset.from_dict({"target": [[0.0] * 5] * 8}).save_to_disk(str(tmp_path / "hf"))
    data = datasets.load_from_disk(str(tmp_path / "hf"))
    changed = data.rename_column("target", "old").add_column("target", [[float(i)] * (3 + i) for i in range(8)])
    ds = dw.CorpusDataset(changed, **{**KW, "return_index": True})
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    seen: dict = {}
    for b in loader:
        real = b["observed_mask"].numpy()
        sid = np.broadcast_to(b["series_id"].numpy()[..., None], real.shape)
        for s, v in zip(sid[real], b["target"].numpy()[real]):
            seen.setdefault(int(s), []).append(float(v))
    assert seen == {i: [float(i)] * (3 + i) for i in range(8)}
