"""Elastic resume of a corpus: the rest of an epoch on another number of ranks and workers, each item once.

The corpus is the real statsmodels one (``examples/_real_corpus.py``). An epoch is
interrupted on 2 ranks with 2 DataLoader worker processes each, resumed on 3 ranks
in-process, interrupted again and resumed on 1 rank. The oracle lists every item of
the epoch by brute force from the series lengths (each channel of each kept series
cut from its end into items of ``max_length``): the halves together serve each item
exactly once, but those of the sequences the first topology's equal shares leave out.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections import Counter

import numpy as np
import pytest
import torch

import dask_windows as dw
from dask_windows.corpus import LeftOutSeriesWarning

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "..", "examples"))
from _real_corpus import load_corpus, write_corpus

KW = dict(patch_size=8, max_length=64, min_length=4, batch_size=4, pack_window=64, return_index=True)
NAMES = ["nile", "co2", "macrodata", "fertility", "grunfeld"]
EPOCH = 3


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("elastic")
    paths = write_corpus(str(root), "parquet", row_group_size=16, names=NAMES)
    raw = load_corpus(NAMES)
    return paths, {n: [np.atleast_2d(v) for _, _, v in raw[n]] for n in NAMES}


def _open(paths, rank=0, world_size=1, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeftOutSeriesWarning)
        members = {name: dw.CorpusDataset(paths[name], **{**KW, **kw}) for name in NAMES}
    return dw.mix(members, rank=rank, world_size=world_size)


def _items(batches, names, patch):
    """Each sample served: ``(data set, series, channel, start, stop)``, one per sample of every row."""
    out = []
    for b in batches:
        sid, step = b["sample_id"].numpy(), b["step"].numpy()
        for i in range(sid.shape[0]):
            for k in np.unique(sid[i][sid[i] > 0]):
                at = np.flatnonzero(sid[i] == k)
                d, s = int(b["dataset_id"][i, at[0]]), int(b["series_id"][i, at[0]])
                c = int(b["variate_id"][i, at[0]])
                out.append((names[d], s, c, max(int(step[i, at[0]]), 0), int(step[i, at[-1]]) + patch))
    return out


def _oracle(raw, max_length, min_length):
    want = []
    for name, series in raw.items():
        for s, values in enumerate(series):
            channels, length = values.shape
            if length < min_length:
                continue
            for c in range(channels):
                for j in range(-(-length // max_length)):
                    stop = length - j * max_length
                    want.append((name, s, c, max(stop - max_length, 0), stop))
    return Counter(want)


def _left_out_by_division(ds, world_size):
    """Items of the last ``num_sequences % world_size`` sequences of the epoch (no rank serves them)."""
    plan = ds.plan(EPOCH)
    q = len(plan.sequence_ptr) - 1
    out = []
    for e in plan.entries[plan.sequence_ptr[q - q % world_size] :]:
        member = ds.members[int(plan.member[e])]
        u = int(plan.unit[e])
        out.append((ds.names[int(plan.member[e])], int(member.units.series[u]), int(member.units.channel[u]),
                    int(plan.start[e]), int(plan.stop[e])))  # fmt: skip
    return Counter(out)


def test_elastic_resume_serves_every_item_once(corpus):
    kw: dict = {}
    paths, raw = corpus
    whole = _open(paths, **kw)
    want = _oracle(raw, KW["max_length"], KW["min_length"])
    assert sum(want.values()) == whole.num_items  # the oracle lists the dataset's items

    # first half: 2 ranks, 2 DataLoader worker processes each, 5 batches per rank
    head, state = [], None
    for rank in range(2):
        ds = _open(paths, rank, 2, **kw)
        ds.set_epoch(EPOCH)
        loader = iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
        head += _items([next(loader) for _ in range(5)], ds.names, 8)
        del loader
        state = ds.state_dict(batches=5, num_workers=2)

    # second part: 3 ranks in this process, 2 batches each, then saved again (inside the elastic epoch)
    middle, lens = [], set()
    for rank in range(3):
        ds = _open(paths, rank, 3, **kw)
        ds.load_state_dict(state)
        lens.add(len(ds) - state["batches"])
        it = iter(ds)
        middle += _items([next(it) for _ in range(2)], ds.names, 8)
        second = ds.state_dict(batches=2, num_workers=1)
        it.close()
    assert len(lens) == 1 and "rest" in second

    # the rest: 1 rank
    last = _open(paths, 0, 1, **kw)
    last.load_state_dict(second)
    expected = len(last) - second["batches"]  # len() of an elastic epoch: the state's batches, then the rest's
    tail_batches = list(last)
    assert len(tail_batches) == expected
    tail = _items(tail_batches, last.names, 8)

    got = Counter(head + middle + tail)
    assert max(got.values()) == 1  # nothing twice
    uninterrupted = Counter()
    for rank in range(2):
        ds = _open(paths, rank, 2, **kw)
        ds.set_epoch(EPOCH)
        uninterrupted += Counter(_items(list(ds), ds.names, 8))
    assert got == uninterrupted  # exactly the epoch the first topology serves, in another order
    assert got + _left_out_by_division(whole, 2) == want  # and that is every item but the division's
