"""A corpus of real data sets from more than one package (pmdarima beside statsmodels), against an oracle.

pmdarima ships half-hourly demand, heart rate every half second, daily prices and volume
(5 channels, 7,983 days), and monthly to yearly series; statsmodels adds many short
yearly series with nulls and a 3-channel panel. All are read from files inside the
packages (``examples/_real_corpus.py``; nothing downloaded), written as list-column
Parquet (``tests/test_corpus.py`` reads ``datasets`` folders) and mixed into one corpus.
The oracle reads the original arrays: every token's values and masks, every
observation exactly once per epoch, and the report's counts.
Skipped when pmdarima is not installed.
"""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import pytest
from helpers import skip_unless_installed

import dask_windows as dw
from dask_windows.corpus import LeftOutSeriesWarning

skip_unless_installed("pmdarima")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "..", "examples"))
from _real_corpus import PACKAGE_FREQS, load_corpus, write_corpus  # noqa: E402

NAMES = [*PACKAGE_FREQS, "fertility", "grunfeld"]
PATCH = 16
KW = dict(patch_size=PATCH, max_length=256, min_length=8, batch_size=8, pack_window=256, return_index=True)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("packages")
    paths = write_corpus(str(root / "parquet"), "parquet", row_group_size=32, names=NAMES)
    raw = {n: [np.atleast_2d(v) for _, _, v in rows] for n, rows in load_corpus(NAMES).items()}
    return root, paths, raw


def _open(paths, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeftOutSeriesWarning)
        members = {n: dw.CorpusDataset(paths[n], **{**KW, **kw}) for n in NAMES}
    return dw.mix(members)


def _served(batches, raw, names):
    """Check every real token against ``raw``; ``{(name, series): (C, T) times each value was served}``."""
    served: dict = {}
    for b in (({k: v.numpy() for k, v in b.items()}) for b in batches):
        rows, tokens = b["sample_id"].shape
        real = b["sample_id"] > 0
        assert not b["observed_mask"][~real].any() and (b["target"][~real] == 0).all()
        for i, t in zip(*np.nonzero(real)):
            name, s = names[b["dataset_id"][i, t]], int(b["series_id"][i, t])
            c, steps = int(b["variate_id"][i, t]), int(b["step"][i, t]) + np.arange(PATCH)
            values = raw[name][s]
            inside = steps >= 0
            expect = np.full(PATCH, np.nan, np.float32)
            expect[inside] = values[c, steps[inside]]
            observed = ~np.isnan(expect)
            assert np.array_equal(b["observed_mask"][i, t], observed)
            assert np.array_equal(b["target"][i, t], np.where(observed, expect, 0).astype(np.float32))
            count = served.setdefault((name, s), np.zeros(values.shape, np.int64))
            count[c, steps[inside]] += 1
    return served


def test_two_packages_one_corpus_every_observation_once(corpus):
    root, paths, raw = corpus
    lengths = [v.shape[1] for series in raw.values() for v in series]
    assert min(lengths) < 60 and max(lengths) > 7_000  # yearly to daily and sub-hourly
    ds = _open(paths)
    assert set(ds.freqs) >= {"500ms", "30min", "D", "M", "Q", "Y"}
    ds.set_epoch(1)
    batches = list(ds)
    assert len(batches) == len(ds)
    served = _served(batches, raw, ds.names)
    for name, series in raw.items():
        for s, values in enumerate(series):
            if values.shape[1] < KW["min_length"]:
                assert (name, s) not in served
                continue
            assert (served[(name, s)] == 1).all(), (name, s)
    assert ds.packing_efficiency(1) > 0.95
    assert max(int(b["variate_id"].max()) for b in batches) == 4  # msft's 5 channels, each its own item

    # what the report counts, against the arrays
    report = ds.report(values=True, world_size=1)["datasets"]
    for name, series in raw.items():
        missing = sum(int(np.isnan(v).sum()) for v in series)
        assert report[name]["missing"]["missing_observations"] == missing
        assert report[name]["observations"] == sum(v.size for v in series)
    assert report["ausbeer"]["missing"]["series_with_missing"] == 1
