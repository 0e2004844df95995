"""Issue 34 item 8: a loader thread that cannot start under a memory limit never hangs the loop.

Each case runs in a child process that reads one epoch as usual (its threads' stacks are then cached
by the C library, so a new thread is created without new memory), then lowers ``RLIMIT_AS`` to the
memory the process already maps just while one named thread of the default path starts, and reads
another epoch. The new thread then cannot allocate the first frame of its bootstrap: no Python code
of it runs and ``Thread.start`` used to wait forever. Now the lane helper's work falls back to the
consumer's thread (the same batches), and a reader or builder thread that cannot start raises
``MemoryError`` naming it in the consumer. The child runs under a hard timeout, so a hang fails the
test instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import sys
import threading

import forkrun
import pytest

from dask_windows.runtime.prefetch import GuardedThread

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD_SECONDS = 120  # generous: the machine is shared; a hang is what fails

_CHILD = r"""
import hashlib, json, logging, os, resource, sys
import numpy as np, pandas as pd, torch
import dask_windows as dw
from dask_windows.runtime import prefetch
from dask_windows.speedups import lanes

root, order, target, settings = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
torch.set_num_threads(2)  # lanes need torch allowed two threads and two CPUs
lanes.usable_cpus = lambda: 2
rng = np.random.default_rng(0)
features = [f"c{j}" for j in range(8)]
for i in range(3):
    frame = pd.DataFrame(rng.standard_normal((6000, 8)).astype(np.float32), columns=features)
    frame["s"] = i
    frame.to_parquet(os.path.join(root, f"p{i}.parquet"), row_group_size=2000)
kw = dict(pieces_per_partition=1) if order == "whole" else {}
# batches of 1 MiB (256 windows x 8 channels x 128 steps x 4 B), on lanes (DASK_WINDOWS_LANES=1 in the env)
ds = dw.WindowDataset(root, features, series="s", window=128, batch_size=256, seed=3, **kw, **settings)

def digest(epoch):
    ds.set_epoch(epoch)
    h = hashlib.sha256()
    for b in ds:
        h.update(np.ascontiguousarray(b.numpy()).tobytes())
    return h.hexdigest()

expected = digest(1)
digest(0)  # the threads have run and ended: their stacks are cached, a new one needs no new memory

def mapped():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))

starts = []
start = prefetch.GuardedThread.start

def start_under_limit(self):
    if self.name != target or starts:
        return start(self)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (mapped(), hard))  # no new mapping from here
    try:
        start(self)
        starts.append("started")
    except MemoryError as exc:
        starts.append(f"MemoryError: {exc}")
        raise
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))

prefetch.GuardedThread.start = start_under_limit
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="LOG %(name)s %(message)s")
try:
    outcome = {"same": digest(1) == expected}
except MemoryError as exc:
    outcome = {"error": str(exc)}
outcome["starts"] = starts
pending = ds._read_ahead.pending  # a next pass read ahead, not released (nextpass)
outcome["held"] = pending is not None and not pending.done.is_set()
print("OUTCOME", json.dumps(outcome), flush=True)
"""


def _run(tmp_path, order: str, target: str, **settings) -> tuple[dict, str]:
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    data = tmp_path / "data"
    data.mkdir()
    env = dict(os.environ, PYTHONPATH=ROOT, DASK_WINDOWS_LANES="1")  # lanes for features alone: asked for
    argv = [sys.executable, str(script), str(data), order, target, json.dumps(settings)]
    out = forkrun.run(argv, env=env, timeout=CHILD_SECONDS)  # raises TimeoutExpired on a hang
    assert out.returncode == 0, out.stderr[-3000:]
    outcome = json.loads(out.stdout.split("OUTCOME", 1)[1])
    return outcome, out.stdout


ORDERS = [pytest.param("pool", id="pool-order"), pytest.param("whole", id="whole-partition-order")]


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="measures the process's mappings through /proc (Linux)")
@pytest.mark.parametrize("order", ORDERS)
def test_a_lane_helper_that_cannot_start_leaves_the_work_to_the_consumer(tmp_path, order):
    # prefetch_partitions=0: no reader or builder thread runs while the memory is limited
    outcome, stdout = _run(tmp_path, order, "dask-windows-lane", prefetch_partitions=0)
    assert outcome["starts"] and outcome["starts"][0].startswith("MemoryError"), outcome
    assert "'dask-windows-lane' died while starting" in outcome["starts"][0] or "cannot start" in outcome["starts"][0]
    assert outcome.get("same") is True, outcome  # the same batches, gathered on one thread
    assert "gathering on one thread" in stdout


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="measures the process's mappings through /proc (Linux)")
def test_a_next_pass_timer_that_cannot_start_releases_the_read_ahead(tmp_path):
    """The timer that would release an unclaimed read-ahead starts when a pass ends: if it cannot, the
    read-ahead is released at once and the pass ends as usual (the next one reads for itself)."""
    outcome, _ = _run(tmp_path, "whole", "dask-windows-next-pass")
    assert outcome["starts"] and outcome["starts"][0].startswith("MemoryError"), outcome
    assert outcome.get("same") is True, outcome
    assert outcome["held"] is False, "a read-ahead no timer will release is still held"


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="measures the process's mappings through /proc (Linux)")
@pytest.mark.parametrize(
    ("order", "target"),
    [
        pytest.param("pool", "dask-windows-pool", id="pool-order-reader"),
        pytest.param("pool", "dask-windows-build", id="pool-order-builder"),
        pytest.param("whole", "dask-windows-pool", id="whole-partition-reader"),
        pytest.param("whole", "dask-windows-build", id="whole-partition-builder"),
    ],
)
def test_a_reader_or_builder_that_cannot_start_raises_memory_error(tmp_path, order, target):
    outcome, _ = _run(tmp_path, order, target, next_pass_seconds=0)
    assert outcome["starts"] and outcome["starts"][0].startswith("MemoryError"), outcome
    assert f"{target!r}" in outcome["starts"][0] and "buffer_partitions" in outcome["starts"][0]
    assert "error" in outcome and "out of memory" in outcome["error"], outcome  # raised in the consumer


# -- the mechanisms, in this process ------------------------------------------------------------------


def test_a_thread_that_ends_before_running_any_code_fails_its_start(monkeypatch):
    """The bootstrap fails in C, as when its first frame cannot be allocated: no Python code runs."""
    import functools
    import operator

    # a fresh C callable per thread, raising before any Python frame (held by the new thread alone)
    monkeypatch.setattr(
        GuardedThread, "_guarded_bootstrap", property(lambda self: functools.partial(operator.truediv, 1, 0))
    )
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: None)  # keeps no reference to it
    ran = []
    thread = GuardedThread(target=lambda: ran.append(1), name="doomed", daemon=True)
    box: dict = {}

    def start():
        try:
            thread.start()
        except BaseException as exc:
            box["error"] = exc

    probe = threading.Thread(target=start, daemon=True)
    probe.start()
    probe.join(CHILD_SECONDS)
    assert not probe.is_alive(), "start() waited forever for a thread that had ended"
    error = box.get("error")
    assert isinstance(error, MemoryError) and "'doomed' died while starting" in str(error), error
    assert not ran and not thread.is_alive()
    thread.join(5)
    assert thread not in threading.enumerate()


def test_a_reader_thread_that_dies_without_reporting_fails_the_consumer():
    """A thread gone without handing over its item (its own error could not be relayed) ends the wait."""
    from dask_windows.runtime.prefetch import Prefetcher

    def read(key):
        if key == 2:
            raise SystemExit  # ends the thread silently, past the relay (which records exceptions as items)
        return key

    import dask_windows.runtime.prefetch as prefetch

    relay = prefetch._read_ahead

    def unrelayed(read, keys, results, slots, stop):
        while True:
            slots.acquire()
            k = results.claim()
            if k >= len(keys):
                return
            results.put(k, read(keys[k]))  # no try: an error kills the thread

    prefetch._read_ahead = unrelayed
    try:
        reader = Prefetcher(read, list(range(5)), depth=2, name="dask-windows-silent")
    finally:
        prefetch._read_ahead = relay
    got, box = [], {}

    def consume():
        try:
            got.extend(reader)
        except BaseException as exc:
            box["error"] = exc

    probe = threading.Thread(target=consume, daemon=True)
    probe.start()
    probe.join(CHILD_SECONDS)
    assert not probe.is_alive(), "the consumer waited forever for a thread that had ended"
    assert got == [0, 1]
    assert isinstance(box.get("error"), MemoryError) and "without handing over item 2" in str(box["error"])
