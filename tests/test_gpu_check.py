"""benchmarks/gpu_check.py: on a machine without CUDA it says so and exits 0."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_gpu_check_exits_cleanly_without_cuda():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--steps", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "needs CUDA" in done.stdout
    assert "steps/s" not in done.stdout  # nothing measured


def test_gpu_check_arguments_parse():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    args = gpu_check.parse_args(["--steps", "5", "--num-workers", "0"])
    assert (args.steps, args.num_workers, args.batch_size) == (5, 0, 64)
