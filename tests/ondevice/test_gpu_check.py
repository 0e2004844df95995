"""benchmarks/gpu_check.py: on a machine without CUDA it says so and exits 2 (``--allow-cpu``: runs on the CPU
device); an inequality exits 1; a hang ends in a stack dump; it writes JSON; it imports nothing the GPU machine
lacks; its sections run on the CPU device (the dry run's sizes)."""

from __future__ import annotations

import json
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
with contextlib.redirect_stdout(out):  # the script as run on a machine without CUDA: it says so, exits 2
    try:
        runpy.run_path(ROOT + "/benchmarks/gpu_check.py", run_name="__main__")
    except SystemExit as done:
        assert done.code == 2, done.code
    else:
        raise AssertionError("gpu_check returned without an exit status")
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


def _gpu_check():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import gpu_check
        from _synthetic import make_dataset
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
        sys.path.remove(str(ROOT / "examples"))
    return gpu_check, make_dataset


def test_gpu_check_sections_on_the_cpu_device(tmp_path):
    gpu_check, make_dataset = _gpu_check()
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
    counted = gpu_check.epoch_bytes(args, data, torch.device("cpu"), dict(
        features=gpu_check.FEATURES, series="series_id", window=32, batch_size=8, seed=0
    ))  # fmt: skip
    # a whole epoch on a pool smaller than the data: every batch counted on the host side, every unit sent
    assert counted["pool_bytes"] < counted["data_bytes"] and counted["batches"] > 0
    assert counted["host_bytes"] == counted["batches"] * 8 * 32 * 4 * 4 or counted["host_bytes"] < (
        counted["batches"] * 8 * 32 * 4 * 4
    )  # the last batch may be short
    assert 1.0 <= counted["rows_sent"] < 1.5 and counted["device_bytes"] < counted["host_bytes"]


EQUAL = {"first_batches_equal": 1.0, "epoch_equal": 1.0, "stride": 4.0, "rows_sent": 1.1}
COUNTED = {"pool_bytes": 10.0, "data_bytes": 40.0, "rows_sent": 1.1}
RESUMED = {"resume_equal": 1.0, "taken": 2.0, "epoch_batches": 5.0, "resumed_batches": 3.0, "units_resumed": 1.0}
CHECKS = {"resume": RESUMED, "stream": {"stream_equal": 1.0, "epoch_batches": 5.0}}


def test_gpu_check_failures_name_each_inequality():
    gpu_check, _ = _gpu_check()
    assert gpu_check.failures({"equal": EQUAL}, COUNTED, CHECKS) == []
    unequal = {"equal": {**EQUAL, "first_batches_equal": 0.0}}
    assert "first batches" in gpu_check.failures(unequal, COUNTED, CHECKS)[0]
    unequal = {"equal": {**EQUAL, "epoch_equal": 0.0}}
    assert "whole epoch at stride 4" in gpu_check.failures(unequal, COUNTED, CHECKS)[0]
    assert "--bytes-budget" in gpu_check.failures({"equal": EQUAL}, {**COUNTED, "pool_bytes": 40.0}, CHECKS)[0]
    resumed = {**CHECKS, "resume": {**RESUMED, "resume_equal": 0.0}}
    assert "resumed after 2 batches" in gpu_check.failures({"equal": EQUAL}, COUNTED, resumed)[0]
    streamed = {**CHECKS, "stream": {"stream_equal": 0.0, "epoch_batches": 5.0}}
    assert "non-default CUDA stream" in gpu_check.failures({"equal": EQUAL}, COUNTED, streamed)[0]
    skipped = {**CHECKS, "stream": {"stream_equal": float("nan"), "skipped": "no CUDA"}}
    assert gpu_check.failures({"equal": EQUAL}, COUNTED, skipped) == []  # skipped: no failure


def _stub_sections(gpu_check, monkeypatch, equal: dict) -> None:
    """The sections replaced by canned figures: the exit status and the JSON without the minutes."""
    alone = {
        "host (0 workers)": {"windows_s": 1.0, "bytes_step": 4.0, "peak_mib": 0.0},
        "device": {"windows_s": 2.0, "bytes_step": 1.0, "peak_mib": 0.0, "pool_mib": 0.1, "units": 2, "resident": 1},
        "equal": {**equal, "epoch_batches": 3.0, "units": 2.0, "pool_mib": 0.1},
    }
    counted = {**COUNTED, "epochs": 1.0, "batches": 3.0, "host_bytes": 8.0, "device_bytes": 2.0, "fewer_bytes": 4.0}
    monkeypatch.setattr(gpu_check, "loader_alone", lambda *a: alone)
    monkeypatch.setattr(gpu_check, "epoch_bytes", lambda *a: counted)
    trained = {
        "wait_share": 0.0,
        "steps_s": 1.0,
        "step_ms": 1.0,
        "host_cpu_ms": 1.0,
        "device_copy_s": 0.0,
        "verdict": "-",
    }
    monkeypatch.setattr(gpu_check, "train", lambda *a: trained)
    monkeypatch.setattr(gpu_check, "mask_times", lambda *a: {"device": 1.0, "cpu": 1.0, "mask_bytes": 8})


def test_gpu_check_exit_codes_and_json(tmp_path, monkeypatch, capsys):
    gpu_check, _ = _gpu_check()
    import torch

    out = tmp_path / "result.json"
    common = ["--dry-run", "--data", str(tmp_path / "data"), "--json", str(out)]
    _stub_sections(gpu_check, monkeypatch, EQUAL)
    assert gpu_check.main(common) == 0
    written = json.loads(out.read_text())
    assert written["ok"] and written["exit"] == 0 and written["failures"] == [] and written["estimate_seconds"] > 0
    assert capsys.readouterr().out.startswith("estimate: about ")

    _stub_sections(gpu_check, monkeypatch, {**EQUAL, "epoch_equal": 0.0})
    assert gpu_check.main(common) == 1
    written = json.loads(out.read_text())
    assert not written["ok"] and written["exit"] == 1 and "whole epoch" in written["failures"][0]
    assert "FAILED: the whole epoch" in capsys.readouterr().out

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--json", str(out)]) == 2  # no CUDA, no --allow-cpu: nothing measured is no pass
    assert json.loads(out.read_text())["exit"] == 2 and "needs CUDA" in capsys.readouterr().out
    _stub_sections(gpu_check, monkeypatch, EQUAL)
    monkeypatch.setattr(gpu_check, "resume_equal", lambda *a: RESUMED)  # full sizes: the real one is tested below
    assert gpu_check.main(["--allow-cpu", "--data", str(tmp_path / "full"), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["checks"]["stream"]["skipped"] == "no CUDA"
    assert "non-default CUDA stream: skipped: no CUDA" in capsys.readouterr().out


def test_gpu_check_resume_on_the_cpu_path_fails_the_run_when_the_resume_differs(tmp_path, monkeypatch, capsys):
    """The resume check runs for real on the CPU device (the stream check is skipped there), and a resume
    that does not continue the epoch (here: a ``load_state_dict`` that restores nothing) exits 1."""
    gpu_check, _ = _gpu_check()
    import dask_windows as dw

    out = tmp_path / "result.json"
    common = ["--dry-run", "--data", str(tmp_path / "data"), "--json", str(out)]
    _stub_sections(gpu_check, monkeypatch, EQUAL)  # every section but the resume and stream checks
    assert gpu_check.main(common) == 0
    written = json.loads(out.read_text())
    resume = written["checks"]["resume"]
    assert resume["resume_equal"] == 1.0 and 0 < resume["taken"] < resume["epoch_batches"]
    assert resume["taken"] + resume["resumed_batches"] == resume["epoch_batches"]
    assert written["checks"]["stream"]["skipped"] == "no CUDA"
    assert "bit for bit the uninterrupted epoch" in capsys.readouterr().out

    monkeypatch.setattr(dw.WindowDataset, "load_state_dict", lambda self, state: None)
    assert gpu_check.main(common) == 1
    written = json.loads(out.read_text())
    assert written["checks"]["resume"]["resume_equal"] == 0.0 and "resumed after" in written["failures"][0]
    assert "NOT EQUAL to the uninterrupted epoch" in capsys.readouterr().out


def test_gpu_check_past_its_timeout_dumps_every_thread_and_exits_1(tmp_path):
    from tests import forkrun

    script = str(ROOT / "benchmarks" / "gpu_check.py")
    done = forkrun.run(
        [sys.executable, script, "--dry-run", "--timeout", "0.5", "--data", str(tmp_path / "d")], timeout=300
    )
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert "Timeout (0:00:00" in done.stderr and "most recent call first" in done.stderr
