"""Per-frequency patch sizes (``patch_sizes={freq: p}``) on the real corpus, against a numpy oracle.

Yearly and quarterly series take patches of 4 steps, monthly of 8, others the batch's
16: each token holds its values in the first ``p`` of 16 columns (the rest empty and
unobserved), ``patch_size`` names ``p``, an item holds at most ``sequence_tokens``
tokens of its own patch, and every observation is served exactly once per epoch.
"""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import pytest

import dask_windows as dw
from dask_windows.corpus import LeftOutSeriesWarning
from dask_windows.errors import ConfigError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "..", "examples"))
from _real_corpus import CORPUS_FREQS, load_corpus, write_corpus

SIZES = {"Y": 4, "Q": 4, "M": 8}
KW = dict(patch_size=16, patch_sizes=SIZES, max_length=128, min_length=4, batch_size=4, pack_window=64)
KW.update(return_index=True, prediction_length=8)
NAMES = ["nile", "elnino", "fertility", "grunfeld", "interest"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    paths = write_corpus(str(tmp_path_factory.mktemp("patches")), "parquet", row_group_size=16, names=NAMES)
    raw = load_corpus(NAMES)
    return paths, {n: [np.atleast_2d(v) for _, _, v in raw[n]] for n in NAMES}


def _open(paths, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeftOutSeriesWarning)
        members = {n: dw.CorpusDataset(paths[n], **{**KW, **kw}) for n in NAMES}
    return dw.mix(members)


@pytest.mark.parametrize("channels", ["independent", "padded"])
def test_each_frequency_its_patch_every_observation_once(corpus, channels):
    paths, raw = corpus
    kw = {"channels": "padded", "max_channels": 4} if channels == "padded" else {}
    ds = _open(paths, **kw)
    ds.set_epoch(1)
    batches = [{k: v.numpy() for k, v in b.items()} for b in ds]
    assert len(batches) == len(ds)
    served: dict = {}
    for b in batches:
        target, observed = b["target"], b["observed_mask"]
        if channels == "independent":  # one plane
            target, observed = target[:, None], observed[:, None]
        rows, planes, tokens, width = target.shape
        assert width == 16
        for i in range(rows):
            ids = b["sample_id"][i]
            for k in np.unique(ids[ids > 0]):
                at = np.flatnonzero(ids == k)
                name = ds.names[b["dataset_id"][i, at[0]]]
                p = SIZES.get(CORPUS_FREQS[name], 16)
                assert (b["patch_size"][i, at] == p).all()
                variates = b["variate_id"][i, at] if "variate_id" in b else np.zeros(len(at), np.int64)
                assert len(at) <= tokens and np.array_equal(b["time_id"][i, at], np.arange(len(at)))
                hidden = min(-(-8 // p), len(at) - 1)  # 8 steps to predict: whole patches of p
                assert np.array_equal(b["prediction_mask"][i, at], np.arange(len(at)) >= len(at) - hidden)
                assert np.array_equal(np.diff(b["step"][i, at]), np.full(len(at) - 1, p))
                for t, v in zip(at, variates):
                    s = int(b["series_id"][i, t])
                    values = raw[name][s]
                    count = served.setdefault((name, s), np.zeros(values.shape, np.int64))
                    steps = int(b["step"][i, t]) + np.arange(p)
                    inside = steps >= 0
                    for c in range(planes) if channels == "padded" else [int(v)]:
                        plane = c if channels == "padded" else 0
                        expect = np.full(width, np.nan, np.float32)
                        if c < values.shape[0]:
                            expect[:p][inside] = values[c, steps[inside]]
                            count[c, steps[inside]] += 1
                        seen = ~np.isnan(expect)
                        assert np.array_equal(observed[i, plane, t], seen)
                        assert np.array_equal(target[i, plane, t], np.where(seen, expect, 0).astype(np.float32))
            assert (b["patch_size"][i][ids == 0] == 0).all()
    for name, series in raw.items():
        for s, values in enumerate(series):
            assert (served[(name, s)] == 1).all(), (name, s)


def test_patch_sizes_settings(corpus):
    paths, _ = corpus
    with pytest.raises(ConfigError, match=r"patch_sizes\['Y'\]=32 is larger than patch_size=16"):
        dw.CorpusDataset(paths["nile"], patch_size=16, patch_sizes={"Y": 32})
    with pytest.raises(ConfigError, match="context_length"):
        dw.CorpusDataset(paths["nile"], patch_size=16, patch_sizes={"Y": 4}, context_length=(16, 64))
    plain = _open(paths, patch_sizes=None)
    assert "patch_size" not in next(iter(plain))  # the field comes with patch_sizes only
