"""The fastai adapter logs the telemetry's verdict each epoch, under a real ``Learner`` (skipped without fastai)."""

from __future__ import annotations

import importlib.util
import logging
import time

import numpy as np
import pytest
import torch

import dask_windows as dw

# Looked up, not imported (as in test_fastai.py): fastai.learner is imported by the test that uses it.
if importlib.util.find_spec("fastai") is None:
    pytest.skip("fastai is not installed (pip install fastai; bash .ci/extras)", allow_module_level=True)

# seconds of "training" per training batch: long beside a batch's few milliseconds of loading even on a loaded CI
# machine (at 0.02 s a batch, 3-4 ms of scheduling delay a batch under load read as input-bound)
STEP = 0.5
READ_DELAY = 0.12  # seconds added to every read of the slowed loader
LOGGER = "dask_windows.integrations.fastai"


class SlowReads:
    def __init__(self, read, delay: float) -> None:
        self.read, self.delay = read, delay

    def __call__(self, *args, **kwargs):
        time.sleep(self.delay)
        return self.read(*args, **kwargs)


class Sleepy(torch.nn.Module):
    """A model whose training step takes ``step`` seconds."""

    def __init__(self, step: float) -> None:
        super().__init__()
        self.net = torch.nn.Conv1d(1, 1, 1)
        self.step = step

    def forward(self, x):
        if self.training:
            time.sleep(self.step)
        return self.net(x)


def _fit(step: float, read_delay: float, caplog, batch_size: int = 8) -> list[str]:
    pytest.importorskip("fastai.learner", reason="pip install fastai (bash .ci/extras)")
    from fastai.learner import Learner

    from dask_windows.integrations.fastai import WindowDataLoaders

    arrays = [np.random.default_rng(i).standard_normal((320, 1)).astype(np.float32) for i in range(4)]
    ds = dw.WindowDataset(arrays, window=16, stride=16, batch_size=batch_size, partition_rows=320, buffer_partitions=1,
                          pieces_per_partition=1, next_pass_seconds=0)  # fmt: skip
    train, valid = ds.split(valid=0.25)
    if read_delay:
        train.source.read_rows = SlowReads(train.source.read_rows, read_delay)
    dls = WindowDataLoaders.from_datasets(train, valid, device=torch.device("cpu"))
    learn = Learner(dls, Sleepy(step), loss_func=lambda pred, *yb: pred.pow(2).mean())
    with caplog.at_level(logging.INFO, logger=LOGGER):
        learn.fit(2, lr=1e-3)
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_a_compute_bound_learner_logs_not_input_bound_each_epoch(caplog):
    logged = _fit(STEP, 0.0, caplog, batch_size=20)  # 3 training batches of STEP an epoch
    assert len(logged) == 4  # the training and the validation loader, each of 2 epochs
    train = logged[0::2]
    # a short epoch's first batch can be most of its waiting: "bound by start-up" (not input-bound either)
    assert all("not input-bound" in m or "bound by start-up" in m for m in train), train


def test_a_learner_waiting_on_slow_reads_logs_input_bound_by_fetch(caplog):
    logged = _fit(0.0, READ_DELAY, caplog)
    train = logged[0::2]
    assert len(train) == 2 and all("input-bound" in m and "not input-bound" not in m for m in train), train
    assert all("bound by fetch" in m for m in train), train
