"""The padded multivariate view (``channels="padded"``) on the real corpus, against a numpy oracle.

Each item holds all its series' channels side by side, one plane of the batch each,
up to ``max_channels``: ``target`` ``(B, C, S, P)``, ``channel_mask`` ``(B, C, S)``.
The oracle reads the original arrays: every value and mask of every plane, the
padding planes empty, each observation of each kept series exactly once per epoch,
series of more channels left out and counted.
"""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import pytest

import dask_windows as dw
from dask_windows.corpus import LeftOutSeriesWarning
from dask_windows.errors import ConfigError, SchemaError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "..", "examples"))
from _real_corpus import load_corpus, write_corpus

PATCH, MAX_CHANNELS = 8, 4
KW = dict(patch_size=PATCH, max_length=64, min_length=4, batch_size=4, pack_window=64, return_index=True)
KW.update(channels="padded", max_channels=MAX_CHANNELS)
NAMES = ["nile", "co2", "fertility", "grunfeld", "interest", "macrodata"]  # 1, 1, 1, 3, 2 and 12 channels


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    paths = write_corpus(str(tmp_path_factory.mktemp("padded")), "parquet", row_group_size=16, names=NAMES)
    raw = load_corpus(NAMES)
    return paths, {n: [np.atleast_2d(v) for _, _, v in raw[n]] for n in NAMES}


def _open(paths, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeftOutSeriesWarning)
        members = {n: dw.CorpusDataset(paths[n], **{**KW, **kw}) for n in NAMES}
    return dw.mix(members)


def _check(batches, raw, names, packed=True):
    """Every token of every plane against the oracle; ``{(name, series): (C, T) times served}``."""
    served: dict = {}
    for b in (({k: v.numpy() for k, v in b.items()}) for b in batches):
        rows, planes, tokens, patch = b["target"].shape
        assert planes == MAX_CHANNELS and patch == PATCH and b["channel_mask"].shape == (rows, planes, tokens)
        for i in range(rows):
            ids = b["sample_id"][i]
            for t in range(tokens):
                if ids[t] == 0:  # padding: nothing in any plane
                    assert not b["channel_mask"][i, :, t].any() and not b["observed_mask"][i, :, t].any()
                    assert (b["target"][i, :, t] == 0).all()
                    continue
                name, s, first = names[b["dataset_id"][i, t]], int(b["series_id"][i, t]), int(b["step"][i, t])
                values = raw[name][s]
                channels = values.shape[0]
                assert np.array_equal(b["channel_mask"][i, :, t], np.arange(planes) < channels)
                count = served.setdefault((name, s), np.zeros(values.shape, np.int64))
                steps = first + np.arange(patch)
                inside = steps >= 0
                for c in range(planes):
                    expect = np.zeros(patch, np.float32)
                    if c < channels:
                        expect[inside] = values[c, steps[inside]]
                        count[c, steps[inside]] += 1
                    observed = inside & ~np.isnan(expect) & (c < channels)
                    assert np.array_equal(b["observed_mask"][i, c, t], observed)
                    assert np.array_equal(b["target"][i, c, t], np.where(observed, expect, 0).astype(np.float32))
            if not packed:  # one item, right-aligned
                assert set(np.unique(ids)) <= {0, 1} and ids[-1] == 1
    return served


def test_padded_view_every_observation_once_with_channel_masks(corpus):
    paths, raw = corpus
    ds = _open(paths)
    assert ds.left_out["macrodata"].wide == 1 and ds.left_out["macrodata"].wide_steps == 12 * 203
    ds.set_epoch(1)
    batches = list(ds)
    assert len(batches) == len(ds)
    served = _check(batches, raw, ds.names)
    for name, series in raw.items():
        for s, values in enumerate(series):
            if values.shape[0] > MAX_CHANNELS:
                assert (name, s) not in served
            else:
                assert (served[(name, s)] == 1).all(), (name, s)
    report = ds.report(world_size=1)["datasets"]["macrodata"]["left_out"]
    assert report["wide_series"] == 1 and report["observations"] == 12 * 203


def test_padded_view_unpacked_context_keeps_the_last_steps(corpus):
    paths, raw = corpus
    ds = _open(paths, pack=False, context_length=(16, 48))
    ds.set_epoch(2)
    batches = list(ds)
    assert len({b["target"].shape[2] for b in batches}) > 1
    served = _check(batches, raw, ds.names, packed=False)
    assert all((c <= 1).all() for c in served.values())


def test_padded_settings_are_checked(corpus):
    paths, _ = corpus
    with pytest.raises(ConfigError, match="needs max_channels="):
        dw.CorpusDataset(paths["nile"], channels="padded")
    with pytest.raises(ConfigError, match="needs max_channels="):
        dw.CorpusDataset(paths["nile"], max_channels=3)
    with pytest.warns(LeftOutSeriesWarning, match="more channels than max_channels=4"):
        dw.CorpusDataset(paths["macrodata"], **KW)


def test_covariates_are_marked_planes_of_their_data_set(corpus):
    """Chronos-2's extra rows: a data set's covariate channels flagged per plane, the values served as the rest."""
    paths, raw = corpus
    covariates = {"grunfeld": [1, 2], "interest": [1]}  # value and capital beside investment; the rate beside inflation
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeftOutSeriesWarning)
        members = {n: dw.CorpusDataset(paths[n], covariates=covariates.get(n), **KW) for n in NAMES}
    ds = dw.mix(members)
    batches = list(ds)
    _check(batches, raw, ds.names)  # values and masks as without covariates
    seen = set()
    for b in batches:
        d = b["dataset_id"].numpy()  # (B, S)
        want = np.zeros(b["channel_mask"].shape, bool)
        for name, planes in covariates.items():
            for c in planes:
                want[:, c] |= d == ds.names.index(name)
        assert np.array_equal(b["covariate_mask"].numpy(), want & b["channel_mask"].numpy())
        seen |= {ds.names[i] for i in np.unique(d[b["covariate_mask"].numpy().any(axis=1)])}
    assert seen == set(covariates)
    with pytest.raises(ConfigError, match="pass channels='padded'"):
        dw.CorpusDataset(paths["nile"], covariates=[0])
    with pytest.raises(ConfigError, match="not below max_channels=4"):
        dw.CorpusDataset(paths["grunfeld"], covariates=[4], **KW)


def test_covariates_from_their_own_list_column(corpus, tmp_path):
    """GluonTS's layout: ``target`` list<float> and ``feat_dynamic_real`` list<list<float>>, read as planes 0 and 1, 2."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths, raw = corpus
    series = raw["grunfeld"]  # invest, value, capital per firm
    table = pa.table(
        {
            "target": pa.array([s[0].tolist() for s in series], pa.list_(pa.float64())),
            "feat_dynamic_real": pa.array([s[1:].tolist() for s in series], pa.list_(pa.list_(pa.float32()))),
        }
    )
    pq.write_table(table, str(tmp_path / "gluonts.parquet"), row_group_size=4)
    ds = dw.CorpusDataset(
        str(tmp_path / "gluonts.parquet"), covariates=["feat_dynamic_real"], name="grunfeld", freq="Y", **KW
    )
    assert ds.members[0].covariates == (1, 2)
    batches = list(ds)
    served = _check(batches, {"grunfeld": [s.astype(np.float32).astype(float) for s in series]}, ds.names)
    assert all((served[("grunfeld", s)] == 1).all() for s in range(len(series)))
    for b in batches:
        want = b["channel_mask"].numpy() & (np.arange(MAX_CHANNELS) >= 1)[None, :, None]
        assert np.array_equal(b["covariate_mask"].numpy(), want)
    sink = str(tmp_path / "gluonts.arrow")  # Arrow IPC, record batches as the row groups
    with pa.OSFile(sink, "wb") as out, pa.ipc.new_file(out, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=4):
            writer.write_batch(batch)
    arrow = dw.CorpusDataset(
        str(tmp_path / "gluonts.arrow"), covariates=["feat_dynamic_real"], name="grunfeld", freq="Y", **KW
    )
    for x, y in zip(list(arrow), batches, strict=True):
        assert all(np.array_equal(x[k].numpy(), y[k].numpy()) for k in y)
    short = table.set_column(1, "feat_dynamic_real", pa.array([s[1:, :-1].tolist() for s in series]))
    pq.write_table(short, str(tmp_path / "short.parquet"))
    with pytest.raises(
        SchemaError, match="covariate column 'feat_dynamic_real' holds 19 steps where 'target' holds 20"
    ):
        dw.CorpusDataset(str(tmp_path / "short.parquet"), covariates=["feat_dynamic_real"], **KW)
