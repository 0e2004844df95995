"""The examples run end to end (a few steps each) from a checkout."""

from __future__ import annotations

import os
import sys

import forkrun
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(script: str, *args: str, cwd: str) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    out = forkrun.run([sys.executable, os.path.join(ROOT, "examples", script), *args], cwd=cwd, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout + out.stderr


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(tmp_path_factory.mktemp("demo") / "data")


def test_forecast_example_trains_and_reports(data, tmp_path):
    out = run(
        "train_forecast.py",
        "--data",
        data,
        "--steps",
        "4",
        "--eval-batches",
        "2",
        "--num-workers",
        "0",
        cwd=str(tmp_path),
    )
    assert "windows in 8 partitions" in out and "held-out MSE" in out and "windows_per_s" in out


def test_pretrain_example_saves_encoder_and_curve(data, tmp_path):
    out = run(
        "pretrain_mvp.py",
        "--data",
        data,
        "--steps",
        "4",
        "--eval-batches",
        "2",
        "--num-workers",
        "0",
        "--out",
        str(tmp_path / "run"),
        cwd=str(tmp_path),
    )
    assert "baseline" in out
    assert (tmp_path / "run" / "encoder.pt").exists() and (tmp_path / "run" / "loss.png").exists()


def test_examples_share_the_demo_data_in_any_order(data, tmp_path):
    """After the demo and the forecaster (module order), the data folder holds exactly the demo's
    two folders: no copies beside them, and a forecaster run again still reads 8 partitions."""
    import pyarrow.parquet as pq

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from _synthetic import make_dataset

    assert sorted(os.listdir(data)) == ["train", "valid"]
    files = sorted(
        os.path.relpath(os.path.join(d, n), data)
        for d, _, names in os.walk(data)
        for n in names
        if n.endswith(".parquet")
    )
    assert len(files) == 9 and len([f for f in files if f.startswith("train")]) == 8
    train = pq.read_table(os.path.join(data, "train")).to_pandas()
    assert not train.duplicated(["series_id", "timestamp"]).any()  # no series read twice
    with pytest.raises(ValueError, match="subfolders.*train"):
        make_dataset(data)  # the demo's folder is recognised, never written into
    with pytest.raises(ValueError, match="written with"):
        make_dataset(os.path.join(data, "train"), seed=5)  # other settings: not silently reused
    out = run(
        "pretrain_mvp.py",
        "--data",
        data,
        "--model",
        "cnn",
        "--steps",
        "2",
        "--eval-batches",
        "1",
        "--num-workers",
        "0",
        cwd=str(tmp_path),
    )
    assert f"reusing {os.path.join(data, 'train')}" in out
    assert (tmp_path / "runs" / "mvp" / "cnn" / "encoder.pt").exists()
    assert not (tmp_path / "runs" / "mvp" / "encoder.pt").exists()  # the transformer's folder is its own
    assert sorted(os.listdir(data)) == ["train", "valid"]
