"""``pieces_per_partition > 1`` is deprecated and served by the pool order; ``1`` (whole partitions) stays.

The piece order it asked for is gone (issue 22): a count above 1 warns once, naming the remedies, and
the pool order serves it under a budget of the memory the piece order held (two buffers of
``buffer_partitions`` partitions). A resume state the piece order saved is refused with the error
of a foreign state.
"""

from __future__ import annotations

import contextlib
import io
import math
import warnings

import numpy as np
import pytest
from helpers import make_frames, oracle_starts, write_parquet

from dask_windows.dataset import WindowDataset
from dask_windows.errors import ConfigError

KW = dict(features=["f0", "f1"], targets=["y"], series="sid", window=8, stride=2, batch_size=16, return_index=True)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    frames = make_frames(seed=11, num_files=5, num_series=8, min_len=20, max_len=90)
    root = str(tmp_path_factory.mktemp("retired") / "d")
    write_parquet(frames, root, row_group_size=25)
    return root, frames


def _open(root, **kw):
    """The dataset and the deprecation warnings its opening gave."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        ds = WindowDataset(root, **{**KW, **kw})
    return ds, [w for w in got if issubclass(w.category, DeprecationWarning)]


def _starts(ds) -> np.ndarray:
    return np.sort(np.concatenate([batch[-1].numpy() for batch in ds]))


@pytest.mark.parametrize("pieces", [2, 16])
def test_a_count_above_one_warns_once_with_the_remedies_and_the_pool_order_serves_it(data, pieces):
    root, frames = data
    ds, got = _open(root, pieces_per_partition=pieces, buffer_partitions=3)
    assert len(got) == 1
    message = str(got[0].message)
    assert f"pieces_per_partition={pieces} is deprecated" in message
    for remedy in ("Drop pieces_per_partition", "buffer_bytes", "pieces_per_partition=1"):
        assert remedy in message
    assert got[0].filename == __file__  # attributed to the line that opened the dataset
    # the pool order, with the piece order's memory: two buffers of 3 partitions of average size
    rows = math.ceil(sum(p.num_rows for p in ds.partitions) / len(ds.partitions))
    assert ds.spec.buffer_bytes == int(2 * 3 * rows * (4 * 3 + 8 / 2))
    assert ds.config.order.pieces_per_partition is None and ds.config.order.buffer_bytes == ds.spec.buffer_bytes
    assert np.array_equal(_starts(ds), oracle_starts(frames, "sid", 8, 2))  # every window once
    # its configuration reopens the same dataset without the deprecated keyword: same batches, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        again = WindowDataset(root, **ds.config.keywords())
    ds.set_epoch(0)
    for a, b in zip(iter(ds), iter(again), strict=True):
        assert all(np.array_equal(x.numpy(), y.numpy()) for x, y in zip(a, b))


def test_a_count_above_one_with_buffer_bytes_takes_that_budget(data):
    root, _ = data
    ds, got = _open(root, pieces_per_partition=4, buffer_bytes=50_000)
    assert len(got) == 1 and ds.spec.buffer_bytes == 50_000


def test_whole_partitions_and_the_default_do_not_warn(data):
    root, frames = data
    whole, got = _open(root, pieces_per_partition=1)
    assert not got and whole.spec.buffer_bytes is None and whole.spec.pieces_per_partition == 1
    assert np.array_equal(_starts(whole), oracle_starts(frames, "sid", 8, 2))
    default, got = _open(root)
    assert not got and default.config.order.pieces_per_partition is None
    with pytest.raises(ConfigError, match="ask for two orders"):  # whole partitions and a budget: unchanged
        _open(root, pieces_per_partition=1, buffer_bytes=1 << 20)
    for bad in (0, -3):
        with pytest.raises(ConfigError, match="pieces_per_partition"):
            _open(root, pieces_per_partition=bad)


def test_device_mode_takes_the_pool_order(data):
    root, frames = data
    ds, got = _open(root, device="cpu")
    assert not got and ds.config.order.pieces_per_partition is None and ds.spec.buffer_bytes is not None
    ds, got = _open(root, device="cpu", pieces_per_partition=8)  # served by the pool order, on the device
    assert len(got) == 1 and "pool order" in str(got[0].message)
    assert ds.config.order.pieces_per_partition is None and ds.spec.buffer_bytes is not None
    assert np.array_equal(_starts(ds), oracle_starts(frames, "sid", 8, 2))


def test_a_state_saved_by_the_piece_order_is_refused(data):
    root, _ = data
    ds, _ = _open(root, pieces_per_partition=1)
    state = ds.state_dict(batches=2, num_workers=0)
    # What the piece order recorded (0.3): its count, no budget, and how its pieces were ordered.
    state["dataset"] = {**state["dataset"], "pieces_per_partition": 6, "piece_order": "stratified-units"}
    for opened in (ds, _open(root, pieces_per_partition=6)[0], _open(root)[0]):
        with pytest.raises(
            ConfigError, match=r"saved by the piece order \(pieces_per_partition=6\).*start the epoch over"
        ):
            opened.load_state_dict(state)


@pytest.mark.parametrize("command", ["inspect", "bench"])
def test_the_command_line_flag_keeps_working_through_the_deprecation(data, command):
    from dask_windows.cli.main import main

    root, _ = data
    args = [command, root, "--window", "8", "--series", "sid", "--features", "f0", "--pieces-per-partition", "4"]
    args += ["--seconds", "0.2", "--no-progress"] if command == "bench" else ["--mixing"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        assert main(args) == 0
    assert any("pieces_per_partition=4 is deprecated" in str(w.message) for w in got)
