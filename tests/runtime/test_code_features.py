"""``WindowSpec.code_features``: the last ``K`` feature channels gathered as int64 codes on their own.

A buffer's owner (``Buffer``, the pool) keeps an int64 copy of those channels' rows; the
gatherer's features are then the other ``C - K`` channels and ``codes_at`` gathers the codes.
Both are checked against windows cut by hand from the float32 rows.
"""

from __future__ import annotations

import numpy as np
import pytest

from dask_windows.errors import ConfigError
from dask_windows.runtime.batch import Gatherer, OutputPool
from dask_windows.settings.spec import WindowSpec


def rows_with_codes(channels: int, codes: int, rows: int, seed: int = 0) -> np.ndarray:
    """``(channels, rows)`` float32 whose last ``codes`` channels hold small integer codes (and -1)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((channels, rows)).astype(np.float32)
    x[channels - codes :] = rng.integers(-1, 40, (codes, rows))
    return x


@pytest.mark.parametrize("channels, codes", [(5, 2), (3, 3), (4, 1)])
@pytest.mark.parametrize("window", [1, 7, 64])
def test_codes_and_features_equal_windows_cut_by_hand(channels, codes, window):
    rows = 300
    x = rows_with_codes(channels, codes, rows, seed=window)
    y = np.arange(2 * rows, dtype=np.float32).reshape(2, rows)
    gatherer = Gatherer(x, y, window, 0, "NCL", codes=x[channels - codes :].astype(np.int64))
    rng = np.random.default_rng(1)
    pool = OutputPool()
    for size in (1, 33, 64):
        starts = rng.integers(0, rows - window + 1, size).astype(np.int32)
        cut = np.stack([x[:, s : s + window] for s in starts])  # (B, C, L) by hand
        got = gatherer.codes_at(starts)
        assert got.dtype == np.int64 and got.flags.c_contiguous
        np.testing.assert_array_equal(got, cut[:, channels - codes :].astype(np.int64))
        for features in (
            gatherer.features(starts, pool),
            gatherer.features(starts),
            gatherer.gather_for(size, pool)(starts),
        ):
            assert features.dtype == np.float32 and features.shape == (size, channels - codes, window)
            np.testing.assert_array_equal(features, cut[:, : channels - codes])
        np.testing.assert_array_equal(gatherer.targets(starts), y[:, starts + window - 1].T)


def test_without_codes_the_gather_is_unchanged():
    x = rows_with_codes(4, 2, 100)
    gatherer = Gatherer(x, None, 9, 0, "NCL")
    starts = np.array([0, 50, 91])
    np.testing.assert_array_equal(gatherer.features(starts), np.stack([x[:, s : s + 9] for s in starts]))


def test_codes_need_the_channel_major_layout():
    x = np.zeros((100, 3), np.float32)
    with pytest.raises(ValueError, match="NCL"):
        Gatherer(x, None, 4, 0, "NLC", codes=np.zeros((1, 100), np.int64))


@pytest.mark.parametrize(
    "settings, match",
    [
        (dict(code_features=3), "more than the 2 features"),
        (dict(code_features=-1), "code_features=-1 must be"),
        (dict(code_features=1, layout="NLC"), "layout='NCL'"),
        (dict(code_features=1.0), "must be an int"),
    ],
)
def test_spec_refuses_impossible_code_features(settings, match):
    with pytest.raises(ConfigError, match=match):
        WindowSpec(features=("a", "b"), **settings)


def test_spec_keeps_code_features():
    assert WindowSpec(features=("a", "b")).code_features == 0
    assert WindowSpec(features=("a", "b"), code_features=2).code_features == 2
