"""Telemetry's device-copy stage and its off switch (``runtime.telemetry``), against known copies and sleeps."""

from __future__ import annotations

import time

import numpy as np
import torch

from dask_windows import WindowDataset
from dask_windows.runtime import telemetry
from dask_windows.runtime.seams import TorchOutput

COPY_SLEEP = 0.004  # seconds each batch's "device copy" takes in the copying output below


def _dataset(**kw) -> WindowDataset:
    arrays = [np.random.default_rng(i).standard_normal((400, 2)).astype(np.float32) for i in range(4)]
    return WindowDataset(arrays, window=16, stride=16, batch_size=8, next_pass_seconds=0, **kw)


class CopyingOutput:
    """An output seam that copies each batch (as ``PinnedOutput`` copies into page-locked memory), slowly."""

    copies = True

    def __call__(self, x, y, rows):
        time.sleep(COPY_SLEEP)
        return torch.from_numpy(x.copy())


def test_the_device_copy_stage_reads_zero_on_the_host_path():
    ds = _dataset()
    batches = list(ds)
    stats = ds.stats()
    assert stats.batches == len(batches) == len(ds)
    assert stats.device_copy_seconds == 0 and stats.device_copy_bytes == 0  # TorchOutput wraps: nothing copied
    assert "device copy" in stats.table()


def test_a_copying_output_is_timed_as_device_copy_not_gather():
    plain = _dataset()
    ds = _dataset()
    ds._workflow = CopyingOutput()  # the output seam the dataset wires (as a workflow's output is)
    got = list(ds)
    assert all(torch.equal(a, b) for a, b in zip(got, plain))  # the same batches
    stats = ds.stats()
    assert stats.device_copy_seconds >= COPY_SLEEP * len(got)
    assert stats.device_copy_bytes == sum(b.numel() * 4 for b in got)
    assert stats.gather_seconds < stats.device_copy_seconds  # the copies are not counted as gather too
    assert "device copy" in stats.table()


def test_rows_sent_to_a_device_are_timed_and_counted_per_pass():
    ds = _dataset(device="cpu")
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        before = ds.device_traffic.row_bytes
        list(ds)
        stats = ds.stats()
        assert stats.device_copy_bytes == ds.device_traffic.row_bytes - before > 0  # this pass's, not the sum
        assert stats.device_copy_seconds > 0


def test_timed_output_passes_a_non_copying_output_through():
    out = TorchOutput()
    assert telemetry.timed_output(telemetry.Telemetry(), out) is out
    assert telemetry.timed_output(None, CopyingOutput()).__class__ is CopyingOutput


def test_the_off_switch_leaves_the_batches_and_counts_nothing():
    ds = _dataset()
    want = [b.clone() for b in ds]
    before = telemetry.set_enabled(False)
    try:
        ds.set_epoch(0)
        got = list(ds)
        stats = ds.stats()
    finally:
        telemetry.set_enabled(before)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert stats.batches == 0 and stats.reads == 0  # nothing counted for the pass run with it off
