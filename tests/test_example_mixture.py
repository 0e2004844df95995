"""examples/pretrain_mixture.py runs end to end with tiny flags: 2 gloo ranks, checkpoint, 1 rank."""

from __future__ import annotations

import os
import sys

import forkrun

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_mixture_example_restarts_elastically(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    args = ["--steps", "6", "--restart-at", "3", "--window", "32", "--batch-size", "8", "--out", str(tmp_path / "run"),
            "--data", str(tmp_path / "data")]  # fmt: skip
    out = forkrun.run(
        [sys.executable, os.path.join(ROOT, "examples", "pretrain_mixture.py"), *args], cwd=str(tmp_path), env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[2 ranks] step    3" in out.stdout and "[1 rank] step    6" in out.stdout
    assert "predict-the-mean baseline" in out.stdout
    assert "after it" in out.stdout and (tmp_path / "run" / "checkpoint.pt").exists()
