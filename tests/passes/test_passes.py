"""The one pass protocol (``dask_windows.passes``) of ``WindowDataset``, ``Mixture`` and ``CorpusDataset``.

Each is checked against the same reference: a fresh object pinned with ``set_epoch(k)``. Pass ``k``
over an object never told its epoch yields those batches bit for bit (so a mixture advances its
epochs per pass exactly as a dataset does), and a state saved ``k`` batches into a pass resumes the
rest of it in a new object.
"""

from __future__ import annotations

import os
import pickle
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dask_windows as dw
from dask_windows.corpus import LeftOutSeriesWarning
from dask_windows.errors import ConfigError
from dask_windows.passes import PassProtocol

KINDS = ["dataset", "mixture", "corpus"]


def member(rows: int, offset: int, **kw) -> dw.WindowDataset:
    data = np.arange(offset, offset + rows + 2, dtype=np.float32)[:, None]
    kw = {"window": 3, "batch_size": 8, "return_index": True, "seed": rows, "partition_rows": 40, **kw}
    return dw.WindowDataset([data], **kw)


@pytest.fixture(scope="module")
def corpus_path(tmp_path_factory) -> str:
    rng = np.random.default_rng(5)
    lengths = rng.integers(20, 80, size=40)
    table = pa.table({"target": [rng.normal(size=int(n)).tolist() for n in lengths]})
    path = str(tmp_path_factory.mktemp("passes") / "corpus.parquet")
    pq.write_table(table, path, row_group_size=8)
    return path


#: per kind, a setting that makes another configuration (its states are refused)
OTHER = {"dataset": {"seed": 99}, "mixture": {"windows_per_epoch": 130}, "corpus": {"seed": 99}}


@pytest.fixture
def make(corpus_path):
    def build(kind: str, **kw):
        if kind == "dataset":
            return member(90, 0, **kw)
        if kind == "mixture":
            members = {"a": member(90, 0), "b": member(150, 1000)}
            kw = {"windows_per_epoch": 120, "batch_size": 10, "return_source": True, **kw}
            return dw.mix(members, {"a": 1, "b": 1}, **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LeftOutSeriesWarning)
            return dw.CorpusDataset(corpus_path, freq="D", patch_size=8, max_length=32, batch_size=4, **kw)

    return build


def bits(batches) -> list[tuple[bytes, ...]]:
    """Each batch as the bytes of its tensors (a tuple, a dict in key order, or one tensor)."""
    out = []
    for batch in batches:
        parts = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, tuple) else (batch,)
        out.append(tuple(p.numpy().tobytes() for p in parts))
    return out


def pinned(make, kind: str, epoch: int) -> list:
    fresh = make(kind)
    fresh.set_epoch(epoch)
    return bits(fresh)


def test_the_three_datasets_share_one_protocol():
    """No class carries its own copy of the protocol's methods."""
    from dask_windows.corpus import CorpusDataset

    shared = ("epoch", "set_epoch", "state_dict", "load_state_dict", "__getstate__", "rank", "world_size")
    for cls in (dw.WindowDataset, dw.Mixture, CorpusDataset):
        assert issubclass(cls, PassProtocol)
        assert not [name for name in shared if name in vars(cls)], cls


@pytest.mark.parametrize("kind", KINDS)
def test_each_pass_takes_the_next_epoch_as_a_dataset_does(make, kind):
    """Two passes without set_epoch are epochs 0 and 1 (a Mixture too), each the batches of its pinned epoch."""
    obj = make(kind)
    first = bits(obj)
    assert obj.epoch == 0
    second = bits(obj)
    assert obj.epoch == 1
    assert first != second  # another epoch, another order
    assert first == pinned(make, kind, 0) and second == pinned(make, kind, 1)
    obj.set_epoch(0)  # pins the next pass; the passes count on from there
    assert bits(obj) == first and bits(obj) == second and obj.epoch == 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_state_saved_mid_pass_resumes_the_rest_in_a_new_object(make, kind):
    obj = make(kind)
    bits(obj)  # epoch 0
    it = iter(obj)  # epoch 1, not pinned: claimed by the pass
    taken = [next(it) for _ in range(2)]
    state = obj.state_dict()
    # the saved format, as earlier releases wrote it (old states keep loading)
    assert state == {
        "format": "dask_windows.WindowDataset",
        "version": 1,
        "dataset": obj._fingerprint(),
        "world_size": 1,
        "scope": "loader",
        "epoch": 1,
        "num_workers": 1,
        "batches": 2,
    }
    whole = pinned(make, kind, 1)
    assert bits(taken) == whole[:2]
    resumed = make(kind)
    resumed.load_state_dict(state)
    assert resumed.epoch == 1
    rest = bits(resumed)
    assert rest == whole[2:] and len(rest) == len(resumed) - 2
    assert bits(resumed) == pinned(make, kind, 2)  # the pass after the resumed one is the next epoch
    with pytest.raises(ConfigError, match="different dataset or configuration"):
        make(kind, **OTHER[kind]).load_state_dict(state)


@pytest.mark.parametrize("kind", KINDS)
def test_a_pickled_copy_keeps_the_ranks_and_leaves_this_process_behind(make, kind):
    obj = make(kind, rank=1, world_size=2)
    assert (obj.rank, obj.world_size) == (1, 2)
    next(iter(obj))  # builds what belongs to this process (the corpus's plan cache)
    copy = pickle.loads(pickle.dumps(obj))
    assert copy._ranks == (1, 2) and copy._pickled_by == os.getpid()
    assert not set(type(obj)._process_local) & set(vars(copy))
    want = make(kind, rank=1, world_size=2)
    want.set_epoch(1)
    assert bits(copy) == bits(want)  # the copy counts on from the original's pass: epoch 1 of rank 1


@pytest.mark.parametrize("kind", ["dataset", "mixture"])
def test_a_state_claiming_more_than_an_epoch_is_refused_at_load(make, kind):
    obj = make(kind)
    state = {**obj.state_dict(batches=0, num_workers=1), "batches": len(obj) + 1}
    with pytest.raises(ConfigError, match="more than a whole epoch"):
        make(kind).load_state_dict(state)
