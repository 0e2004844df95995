"""dask_windows.integrations.fastai with fastai's own Learner: tuples, every window reaches the model, new order per epoch."""

from __future__ import annotations

import importlib.util
import os
import types

import numpy as np
import pytest
import torch
from helpers import make_frames, oracle_starts, write_parquet

import dask_windows as dw

# Looked up, not imported: importing fastai.learner costs about as much CPU as torch, paid by the tests
# here (the `fa` fixture) rather than by every pytest-xdist worker that collects this file.
if importlib.util.find_spec("fastai") is None:
    pytest.skip("fastai is not installed (pip install fastai)", allow_module_level=True)

WINDOW = 8


@pytest.fixture(scope="module")
def fa():
    """fastai's ``Learner`` and ``Callback``, the adapter's classes and this file's epoch-marking callback."""
    pytest.importorskip("fastai.learner", reason="pip install fastai")
    from fastai.callback.core import Callback
    from fastai.learner import Learner

    from dask_windows.integrations.fastai import WindowDataLoaders, WindowDL

    class EpochMark(Callback):
        def before_epoch(self):
            self.learn.model.seen["train"].append(None)

    return types.SimpleNamespace(
        Learner=Learner, EpochMark=EpochMark, WindowDataLoaders=WindowDataLoaders, WindowDL=WindowDL
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("fastai")
    frames = make_frames(seed=7, num_files=3, num_series=7, min_len=12, max_len=70)
    write_parquet(frames, str(root))
    return str(root), frames


class Seen(torch.nn.Module):
    """Records the first value of ``f0`` in each window (``f0`` is the row: the window's start) per mode."""

    def __init__(self, channels: int, outputs: int) -> None:
        super().__init__()
        self.net = torch.nn.Conv1d(channels, outputs, 1)
        self.seen: dict = {"train": [], "valid": []}
        self.head_nf = channels

    def forward(self, x):
        self.seen["train" if self.training else "valid"].append(x[:, 0, 0].detach().numpy().astype(np.int64))
        return self.net(x)


def split_epochs(records):
    out, current = [], None
    for r in records:
        if r is None:
            current = []
            out.append(current)
        else:
            current.append(r)
    return [np.concatenate(e) for e in out]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_learner_sees_every_window_once_per_epoch_in_a_new_order(fa, data, num_workers):
    root, frames = data
    ds = dw.WindowDataset(root, features=["f0", "f1"], series="sid", window=WINDOW, batch_size=16, seed=1)
    train, valid = ds.split(valid=0.3)
    dls = fa.WindowDataLoaders.from_datasets(train, valid, num_workers=num_workers, multiprocessing_context="fork")
    assert isinstance(dls.one_batch(), tuple) and len(dls.one_batch()) == 1  # (x,) without targets
    model = Seen(2, 2)
    learn = fa.Learner(dls, model, loss_func=lambda pred, *yb: pred.pow(2).mean(), cbs=[fa.EpochMark()])
    learn.fit(2, lr=1e-3)
    epochs = split_epochs(model.seen["train"])
    assert len(epochs) == 2
    expected = set(oracle_starts(frames, "sid", WINDOW).tolist())
    for starts in epochs:
        assert len(starts) == train.num_windows == len(np.unique(starts))  # all B windows of every batch
        assert set(starts.tolist()) <= expected
    assert np.array_equal(np.sort(epochs[0]), np.sort(epochs[1]))
    assert not np.array_equal(epochs[0], epochs[1])  # reshuffled without any set_epoch
    valid_seen = np.concatenate(model.seen["valid"])
    assert len(valid_seen) == 2 * valid.num_windows  # validation after each epoch
    assert len(learn.recorder.values) == 2
    # close() stops the persistent workers now: left to the cycle collector (fastai's Learner holds cycles),
    # torch's shutdown waits 5 s on each worker in whichever later test happens to collect them.
    iterators = [dl.loader._iterator for dl in (dls.train, dls.valid)]
    workers = [w for it in iterators if it is not None for w in it._workers]
    assert len(workers) == (2 * num_workers if num_workers else 0)
    dls.close()
    assert not any(w.is_alive() for w in workers)
    assert all(dl.loader._iterator is None for dl in (dls.train, dls.valid))


def test_targets_become_yb_and_tsai_attributes(fa, data):
    root, _ = data
    ds = dw.WindowDataset(root, features=["f0", "f1"], targets=["y"], series="sid", window=WINDOW, horizon=3,
                          batch_size=16)  # fmt: skip
    dls = fa.WindowDataLoaders.from_datasets(*ds.split(valid=0.3), device=torch.device("cpu"))
    assert (dls.vars, dls.len, dls.c, dls.d, dls.cat, dls.n_inp) == (2, WINDOW, 1, [1, 3], False, 1)
    got = []

    def loss(pred, y):
        got.append(tuple(y.shape))
        return pred.mean() * 0 + (pred.mean() - y.mean()) ** 2

    learn = fa.Learner(dls, Seen(2, 1), loss_func=loss)
    learn.fit(1, lr=1e-3)
    assert got and all(s[1:] == (1, 3) for s in got)  # y, not a slice of x, reaches the loss


def test_one_batch_does_not_advance_the_epoch(fa, data):
    root, _ = data
    ds = dw.WindowDataset(root, features=["f0"], series="sid", window=WINDOW, batch_size=8)
    dl = fa.WindowDL(ds)
    peek = dl.one_batch()[0]
    first = next(iter(dl))[0]
    assert torch.equal(peek, first) and ds.epoch == 0
    assert not torch.equal(next(iter(dl))[0], first) and ds.epoch == 1
    import matplotlib

    matplotlib.use("Agg")
    assert len(dl.show_batch(max_n=4).axes) >= 4
    with pytest.raises(ValueError, match="return_index"):
        fa.WindowDL(dw.WindowDataset(root, features=["f0"], window=WINDOW, return_index=True))


def test_tsai_mvp_example_pretrains_and_fine_tunes(tmp_path):
    try:
        import tsai.callback.MVP
        import tsai.learner  # noqa: F401
    except ImportError as exc:  # tsai's models import fastai.vision.models, which imports torchvision
        pytest.skip(f"tsai does not import beside this torch: {exc!r}")
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(os.path.dirname(__file__))))
    script = os.path.join(root, "examples", "tsai_mvp.py")
    for arch in ("TSTPlus", "InceptionTimePlus"):
        args = ["--arch", arch, "--epochs", "1", "--rows", "512", "--window", "32", "--horizon", "4",
                "--data", str(tmp_path / "data"), "--out", str(tmp_path / "out")]  # fmt: skip
        out = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=600,
                             env=dict(os.environ, PYTHONPATH=root), cwd=str(tmp_path))  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        assert os.path.exists(tmp_path / "out" / f"{arch}_mvp.pth")
        assert os.path.exists(tmp_path / "out" / f"{arch}_losses.png")
