"""``examples/ddp_train.py`` runs under torchrun with 2 CPU ranks (gloo), checkpoints and resumes."""

from __future__ import annotations

import os
import subprocess
import sys

import forkrun
from s3proxy import free_port
from scale_helpers import ROOT

SCRIPT = os.path.join(ROOT, "examples", "ddp_train.py")


def torchrun(out: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", SCRIPT]
    options = ["--out", out, "--window", "32", "--horizon", "4", "--batch-size", "32", "--save-every", "3"]
    done = subprocess.run(command + options + list(args), env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def ranks(out: str, *args: str) -> str:
    """The two ranks torchrun would start, with the environment it gives them (``env://``), forked from
    the suite's warm interpreter (``tests/forkrun.py``); their outputs, rank 0's first."""
    options = ["--out", out, "--window", "32", "--horizon", "4", "--batch-size", "32", "--save-every", "3"]
    world = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    procs = [
        forkrun.popen(
            [sys.executable, SCRIPT, *options, *args],
            env={
                **os.environ,
                **world,
                "RANK": str(r),
                "LOCAL_RANK": str(r),
                "PYTHONPATH": ROOT,
                "OMP_NUM_THREADS": "1",
            },
        )
        for r in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()  # a rank left waiting for its peer after the other failed (nothing once it ended)
    for p, output in zip(procs, outputs):
        assert p.returncode == 0, output
    return "".join(outputs)


def test_example_trains_checkpoints_and_resumes(tmp_path):
    """The first run goes through torchrun itself; the resumed ones start its two ranks directly."""
    first = torchrun(str(tmp_path), "--steps", "6")
    assert "2 ranks on cpu" in first and "step 6 epoch 0" in first
    second = ranks(str(tmp_path), "--steps", "9", "--resume")
    assert "resumed at step 6, epoch 0, 6 batches into it" in second and "done at step 9" in second
    assert "predict-the-mean baseline" in second  # the score beside a baseline (issue 34 item 9)
    assert "checkpoint " + os.path.join(str(tmp_path), "checkpoint.pt") in second
    again = ranks(str(tmp_path), "--steps", "9", "--resume")  # already there: trains nothing
    assert "resumed at step 9" in again and "nothing to train" in again and "done at step 9" in again
    assert "(checkpoint saved)" not in again
