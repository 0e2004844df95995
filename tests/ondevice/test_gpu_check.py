"""benchmarks/gpu_check.py: on a machine without CUDA it says so and exits 0; it imports nothing the GPU
machine lacks; its sections run on the CPU device (the dry run's sizes)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(os.path.dirname(__file__)).resolve().parents[1]


def test_gpu_check_arguments_parse():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    args = gpu_check.parse_args(["--steps", "5", "--num-workers", "0"])
    assert (args.steps, args.num_workers, args.batch_size) == (5, 0, 64)


# Installed here, absent from the GPU machine the check is meant for (torch, numpy, pyarrow, pandas,
# fsspec only): importing any of them on the check's way is an error there.
BLOCKED = (
    "dask", "distributed", "s3fs", "moto", "hypothesis", "lightning", "torchdata", "tqdm", "matplotlib",
    "cloudpickle", "dill", "polars", "datasets", "deltalake", "fastai", "tsai", "pytest",
)  # fmt: skip

CHILD = """
import sys

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is imported on the GPU check's way; that machine lacks it")

sys.meta_path.insert(0, Blocker())
import contextlib, io, runpy
out = io.StringIO()
with contextlib.redirect_stdout(out):  # the script as run on a machine without CUDA: it says so, exits 0
    try:
        runpy.run_path(ROOT + "/benchmarks/gpu_check.py", run_name="__main__")
    except SystemExit as done:
        assert done.code == 0, done.code
assert "needs CUDA" in out.getvalue() and "steps/s" not in out.getvalue(), out.getvalue()
sys.path.insert(0, ROOT + "/benchmarks")
sys.path.insert(0, ROOT + "/examples")
import gpu_check
import dask_windows as dw
from pretrain_mvp import MaskedValueModel, TransformerEncoder, masked_mse
from _synthetic import make_dataset

args = gpu_check.parse_args(["--dry-run"])
gpu_check.dry_run(args)
data = make_dataset(TMP, channels=4, seed=0, **gpu_check.DRY_SIZES)
import torch
alone = gpu_check.loader_alone(args, data, torch.device("cpu"))
assert alone["equal"]["first_batches_equal"] == 1.0, alone
ds = dw.WindowDataset(data, features=gpu_check.FEATURES, series="series_id", window=16, device="cpu")
assert sum(len(x) for x in ds) == ds.num_windows
gpu_check.mask_times(args, torch.device("cpu"), 2)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not loaded, loaded
print("clean")
"""


def test_gpu_check_exits_cleanly_without_cuda_and_imports_only_what_the_gpu_machine_has(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    code = f"BLOCKED = {BLOCKED!r}\nROOT = {str(ROOT)!r}\nTMP = {str(tmp_path / 'data')!r}\n" + CHILD
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("clean")


def test_gpu_check_sections_on_the_cpu_device(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import gpu_check
        from _synthetic import make_dataset
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
        sys.path.remove(str(ROOT / "examples"))
    import torch

    args = gpu_check.parse_args(["--dry-run"])
    gpu_check.dry_run(args)
    data = make_dataset(tmp_path / "data", channels=4, seed=0, **gpu_check.DRY_SIZES)
    alone = gpu_check.loader_alone(args, data, torch.device("cpu"))
    assert alone.pop("equal")["first_batches_equal"] == 1.0
    host, device = alone["host (0 workers)"], alone["device"]
    # B=8 windows of L=32 x 4 float32 per step on the host path; on the device path a start vector of 8
    # int64 per step plus each buffer's rows once, spread over the run's steps (5 here: the first buffer
    # of the tiny dry run weighs; the real run's 630 steps at stride 1 send about 1/300 of the host's)
    assert host["bytes_step"] == 8 * 32 * 4 * 4
    assert 8 * 8 < device["bytes_step"] < host["bytes_step"] and device["resident"] <= 2
    masks = gpu_check.mask_times(args, torch.device("cpu"), 2)
    assert masks["mask_bytes"] == 8 * 4 * 16 and masks["device"] > 0 and masks["cpu"] > 0
