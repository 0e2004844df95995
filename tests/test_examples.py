"""The examples run end to end (a few steps each) from a checkout."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(script: str, *args: str, cwd: str) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", script), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout + out.stderr


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return str(tmp_path_factory.mktemp("demo") / "data")


def test_forecast_example_trains_and_reports(data, tmp_path):
    out = run("train_forecast.py", "--data", data, "--steps", "4", "--eval-batches", "2", "--num-workers", "0", cwd=str(tmp_path))
    assert "windows in 8 partitions" in out and "held-out MSE" in out and "windows_per_s" in out


def test_pretrain_example_saves_encoder_and_curve(data, tmp_path):
    out = run(
        "pretrain_mvp.py", "--data", data, "--steps", "4", "--eval-batches", "2", "--num-workers", "0",
        "--out", str(tmp_path / "run"), cwd=str(tmp_path),
    )
    assert "baseline" in out
    assert (tmp_path / "run" / "encoder.pt").exists() and (tmp_path / "run" / "loss.png").exists()
