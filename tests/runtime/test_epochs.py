"""Epochs advancing per pass: the shared counter, and real DataLoader workers agreeing on the epoch."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from helpers import make_frames, oracle_starts, write_parquet

import dask_windows as dw
from dask_windows.errors import ConfigError
from dask_windows.runtime.epochs import EpochCounter, worker_token


def test_counter_claims_pins_and_lets_workers_of_one_pass_agree():
    c = EpochCounter()
    assert c.epoch == 0
    assert [c.begin_pass() for _ in range(3)] == [0, 1, 2]  # main-process passes
    c.pin(7)
    assert c.epoch == 7 and c.begin_pass() == 7 and c.begin_pass() == 8
    t1, t2 = worker_token(123, 1), worker_token(456, 1)
    assert t1 != t2 and min(t1, t2) >= 2
    assert [c.begin_pass(t1) for _ in range(4)] == [9, 9, 9, 9]  # four workers of one pass
    assert c.begin_pass(t2) == 10 and c.begin_pass(t2) == 10  # the next pass
    assert worker_token(456, 2) != t2  # a persistent worker's next pass has another token
    c.pin(3)
    assert c.begin_pass(t2) == 3  # set_epoch wins over a token already seen
    with pytest.raises(ConfigError, match="larger than"):
        c.pin(2**31)


def test_copies_count_their_own_passes():
    import copy

    c = EpochCounter(4)
    c.begin_pass()
    d = copy.copy(c)
    e = pickle.loads(pickle.dumps(c))
    assert d.begin_pass() == 4 and c.begin_pass() == 5  # a split/probe copy starts at the epoch it was made in
    assert e.begin_pass() == 5  # a pickle carries the state: its next pass is the original's next


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("epochs")
    frames = make_frames(seed=8, num_files=5, num_series=9, min_len=10, max_len=60)
    write_parquet(frames, str(root))
    return str(root), frames


def order(loader):
    return np.concatenate([b[-1].numpy() for b in loader])


SPAWN = {"num_workers": 2, "multiprocessing_context": "spawn", "persistent_workers": True}


@pytest.mark.parametrize("loader", [{"num_workers": 0}, {"num_workers": 2}, SPAWN])
def test_pass_k_is_epoch_k_in_every_worker(data, loader):
    root, frames = data
    args = dict(features=["f0"], series="sid", window=6, batch_size=8, return_index=True, buffer_partitions=1)
    auto = dw.WindowDataset(root, **args)
    it = torch.utils.data.DataLoader(auto, batch_size=None, **loader)
    passes = [order(it) for _ in range(3)]
    expected = oracle_starts(frames, "sid", 6)
    explicit = dw.WindowDataset(root, **args)
    for epoch, got in enumerate(passes):
        assert np.array_equal(np.sort(got), expected)  # each pass exact: the workers agreed on one epoch
        explicit.set_epoch(epoch)
        assert np.array_equal(
            got, order(torch.utils.data.DataLoader(explicit, batch_size=None, num_workers=loader["num_workers"]))
        )
    assert not np.array_equal(passes[0], passes[1]) and not np.array_equal(passes[1], passes[2])
    assert auto.epoch == 2
