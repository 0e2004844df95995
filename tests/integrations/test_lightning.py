"""WindowDataModule with Lightning's real Trainer on CPU: epochs, validation, DDP, checkpoint resume."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

# Looked up, not imported: importing Lightning costs seconds of CPU, paid by the test that uses it
# (the `lc` fixture) rather than by every pytest-xdist worker that collects this file.
for _module, _install in (("lightning", "pip install lightning"), ("torchdata", "pip install torchdata")):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"{_module} is not installed ({_install})", allow_module_level=True)

from helpers import make_frames, oracle_starts, write_parquet  # noqa: E402

WINDOW = 6
CHILD = os.path.join(os.path.dirname(os.path.abspath(os.path.dirname(__file__))), "lightning_child.py")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("lightning")
    frames = make_frames(seed=6, num_files=4, num_series=8, min_len=10, max_len=60)
    write_parquet(frames, str(root))
    return str(root), frames


@pytest.fixture(scope="module")
def lc():
    """``tests/lightning_child.py``: the Lightning model, dataset and trainer of these tests."""
    import lightning_child

    return lightning_child


def starts_of(model, epoch):
    return np.concatenate([s for e, _, s in model.seen if e == epoch])


@pytest.mark.parametrize("num_workers", [0, 1])
def test_two_epochs_differ_and_validate_without_len_warning(lc, data, num_workers):
    root, frames = data
    module = lc.WindowDataModule(lc.dataset(root, WINDOW), split={"valid": 0.25}, num_workers=num_workers,
                              multiprocessing_context="fork")  # fmt: skip
    model = lc.Recorder(WINDOW)
    with warnings.catch_warnings(record=True) as caught:
        lc.trainer(2).fit(model, module)
    assert not [w for w in caught if "__len__" in str(w.message)]
    e0, e1 = starts_of(model, 0), starts_of(model, 1)
    assert len([1 for e, _, _ in model.seen if e == 0]) == len(module.train_set)  # len() is what Lightning gets
    assert not np.array_equal(e0, e1)  # a new order each epoch, no set_epoch called
    assert np.array_equal(np.sort(e0), np.sort(e1)) and len(np.unique(e0)) == len(e0) == module.train_set.num_windows
    assert set(e0.tolist()) < set(oracle_starts(frames, "sid", WINDOW).tolist())
    valid = [s for e, s in model.validated]
    assert len(valid) == 2 * len(module.valid_set)  # validation ran after each epoch
    assert not set(np.concatenate(valid).tolist()) & set(e0.tolist())


@pytest.mark.parametrize("num_workers", [0, 2])
def test_mid_epoch_resume_from_a_lightning_checkpoint(lc, data, tmp_path, num_workers):
    root, _ = data

    def module():
        return lc.WindowDataModule(lc.dataset(root, WINDOW), num_workers=num_workers, multiprocessing_context="fork")

    full = lc.Recorder(WINDOW)
    lc.trainer(2).fit(full, module())
    steps = len(full.seen)
    stop = steps // 2 + 3  # inside epoch 1
    ckpt = str(tmp_path / "mid.ckpt")
    first = lc.Recorder(WINDOW, stop_at=stop, save_to=ckpt)
    with pytest.raises(lc.Interrupted):
        lc.trainer(2).fit(first, module())
    resumed = lc.Recorder(WINDOW)
    lc.trainer(2).fit(resumed, module(), ckpt_path=ckpt)
    assert [(e, i) for e, i, _ in first.seen + resumed.seen] == [(e, i) for e, i, _ in full.seen]
    for (_, _, a), (_, _, b) in zip(first.seen + resumed.seen, full.seen):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_ddp_two_cpu_ranks_get_equal_disjoint_batches(data, tmp_path, num_workers):
    """Two gloo ranks, each with 0 or 2 DataLoader workers (forked, persistent: started once per loader)."""
    root, _ = data
    config = {"data": root, "window": WINDOW, "num_workers": num_workers, "out": str(tmp_path)}
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(CHILD)), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, CHILD, json.dumps(config)], capture_output=True, text=True, env=env,
                         timeout=600, cwd=str(tmp_path))  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert {r["rank"] for r in ranks} == {0, 1}
    for epoch in range(2):
        batches = [r[f"train{epoch}"] for r in ranks]
        assert len(batches[0]) == len(batches[1]) == ranks[0]["len"]  # equal batches: DDP cannot hang
        shares = [np.concatenate(b) for b in batches]
        assert not set(shares[0].tolist()) & set(shares[1].tolist())  # disjoint windows
        assert len(np.unique(shares[0])) == len(shares[0])
        windows = ranks[0]["windows"]  # every window once, less the last few that do not divide evenly
        assert len(np.concatenate(shares)) == windows - windows % 2
        valid = [np.concatenate(r[f"valid{epoch}"]) for r in ranks]
        assert not set(valid[0].tolist()) & set(valid[1].tolist())
    orders = [np.concatenate(ranks[0][f"train{e}"]) for e in range(2)]
    assert not np.array_equal(orders[0], orders[1])


@pytest.mark.parametrize("num_workers", [0, 1])
def test_window_stats_callback_logs_the_loops_figures(lc, data, num_workers):
    from dask_windows.integrations.lightning_stats import WindowStats

    root, _ = data
    module = lc.WindowDataModule(lc.dataset(root, WINDOW), num_workers=num_workers, multiprocessing_context="fork")
    stats = WindowStats()
    fit = lc.trainer(1, callbacks=[stats])
    fit.fit(lc.Recorder(WINDOW), module)
    metrics = fit.callback_metrics
    assert 0 <= float(metrics["data/wait_share"]) <= 1 and float(metrics["data/open_s"]) > 0
    assert float(metrics["data/input_bound"]) in (0.0, 1.0)
    # without workers the dataset saw every batch of the epoch and its stages; with them only the loop
    assert stats.last.batches == (len(module.train_set) if num_workers == 0 else 0)
    assert stats.last.stages_seen == (num_workers == 0)
