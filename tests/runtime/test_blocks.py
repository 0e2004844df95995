"""The NaN/inf check of a unit's decode: the reductions' fast path against the elementwise check.

``blocks._all_finite`` decides from a column's minimum and maximum that no value is NaN, ``±inf`` or
(wider than float32) beyond float32's range, and only then skips the elementwise mask. Here it is
compared with ``np.isfinite`` and the range check value by value, with such values placed anywhere
(huge finite ones too, whose sum or squares would overflow), and ``decode_blocks`` with the rows
``checks.bad_value_rows`` finds in the joined columns, in both layouts.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_windows.opening.checks import FLOAT32_MAX, bad_value_rows
from dask_windows.runtime.blocks import _all_finite, decode_blocks

_BEYOND = np.float64(FLOAT32_MAX) * (1 + 1e-9)  # beyond float32, yet rounds to its max: still a bad value

#: Values placed among ordinary ones: non-finite, at float32's edge (their sum overflows), beyond it.
_SPECIAL = {
    np.float16: [np.nan, np.inf, -np.inf, 65504.0, -65504.0],
    np.float32: [np.nan, np.inf, -np.inf, FLOAT32_MAX, -FLOAT32_MAX, 3e38, -1e-45, 0.0, -0.0],
    np.float64: [np.nan, np.inf, -np.inf, FLOAT32_MAX, -FLOAT32_MAX, _BEYOND, -_BEYOND, 1e300, -1e300, 5e-324],
}


def _elementwise(values: np.ndarray) -> bool:
    """The brute-force answer: every value finite, and within float32's range where wider."""
    fine = np.isfinite(values)
    if values.dtype.itemsize > 4:
        fine &= np.abs(values) <= FLOAT32_MAX
    return bool(fine.all())


@st.composite
def _columns(draw, dtype: type | None = None) -> np.ndarray:
    """A float column of ordinary values with special ones at drawn positions (maybe none)."""
    dtype = dtype or draw(st.sampled_from([np.float16, np.float32, np.float64]))
    n = draw(st.integers(0, 40))
    seed = draw(st.integers(0, 2**16))
    scale = draw(st.sampled_from([1.0, 1e4, 1e30]))
    with np.errstate(over="ignore"):
        values = (np.random.default_rng(seed).standard_normal(n) * scale).astype(dtype)
    if n:
        for _ in range(draw(st.integers(0, 3))):
            values[draw(st.integers(0, n - 1))] = draw(st.sampled_from(_SPECIAL[dtype]))
    if draw(st.booleans()):  # a strided view, as a column of the row-major layout
        wide = np.zeros((n, 3), dtype)
        wide[:, 1] = values
        values = wide[:, 1]
    return values


@settings(max_examples=100)
@given(_columns())
def test_all_finite_agrees_with_the_elementwise_check(values):
    assert _all_finite(values) == _elementwise(values)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf, _BEYOND, -_BEYOND, 3e38, FLOAT32_MAX])
def test_all_finite_sees_one_special_value_at_every_position(dtype, special):
    """Each position of a short column, in turn: first, last and between (no reduction misses an edge)."""
    if dtype is np.float32 and abs(special) == _BEYOND:
        special = np.float32(np.inf) * np.sign(special)  # beyond float32: inf once in float32
    for at in range(17):
        values = np.linspace(-1, 1, 17).astype(dtype)
        values[at] = special
        assert _all_finite(values) == _elementwise(values)


@settings(max_examples=60)
@given(st.sampled_from([np.float16, np.float32, np.float64]), st.booleans(), st.data())
def test_decoded_bad_rows_are_the_elementwise_bad_rows(dtype, channel_major, data):
    """``decode_blocks``' bad rows (fast path or mask) are those of the joined columns, value by value."""
    blocks = data.draw(st.lists(_columns(dtype), min_size=1, max_size=3))  # one partition's blocks: one dtype
    lengths = [len(b) for b in blocks]
    other = data.draw(st.sampled_from([np.float32, np.float64]))
    pieces = []
    for block in blocks:  # f0 as drawn; f1 ordinary values in another float type, y a copy of f0
        pieces.append({"f0": np.ascontiguousarray(block), "f1": np.arange(len(block), dtype=other), "y": block})
    if lengths[-1] and data.draw(st.booleans()):  # a NaN in f1 too
        pieces[-1]["f1"][data.draw(st.integers(0, lengths[-1] - 1))] = np.nan
    with np.errstate(over="ignore", invalid="ignore"):
        x, y, nan_x, nan_y, offsets = decode_blocks(pieces, ["f0", "f1"], ["y"], channel_major, True, np.float32)
    joined = {c: np.concatenate([p[c] for p in pieces]) for c in ("f0", "f1", "y")}
    assert np.array_equal(nan_x, bad_value_rows({c: joined[c] for c in ("f0", "f1")}))
    assert np.array_equal(nan_y, bad_value_rows({"y": joined["y"]}))
    assert np.array_equal(offsets, np.cumsum([0, *lengths]))
