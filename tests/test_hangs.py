"""Issue 23's hangs: a thread that cannot start, workers left orphaned.

Each case would wait forever before the fix; the tests bound every wait (a probe thread joined with a
generous timeout, a subprocess timeout) so that a regression fails rather than hangs the suite.
"""

from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import pytest

import dask_windows as dw
from dask_windows.runtime.prefetch import GuardedThread

PROBE_SECONDS = 120  # generous: the machine is shared; a hang is what fails


def _in_probe(fn):
    """``fn()`` on a probe thread joined for at most PROBE_SECONDS: ``("hung", None)`` or ``("done", result/error)``."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["value"] = exc

    probe = threading.Thread(target=run, name="probe", daemon=True)
    probe.start()
    probe.join(PROBE_SECONDS)
    return ("hung", None) if probe.is_alive() else ("done", box.get("value"))


def _failing_bootstrap(monkeypatch, prefix: str = "dask"):
    """Threads whose name starts with ``prefix`` die in Python's bootstrap, as under memory exhaustion."""
    inner = threading.Thread._bootstrap_inner

    def bootstrap_inner(self):
        if self.name.startswith(prefix):
            raise MemoryError("no memory for the thread state")
        return inner(self)

    monkeypatch.setattr(threading.Thread, "_bootstrap_inner", bootstrap_inner)


# -- item 7: a thread that cannot start raises MemoryError -----------------------------------------------


def test_a_guarded_thread_that_dies_in_its_bootstrap_raises(monkeypatch):
    _failing_bootstrap(monkeypatch, prefix="doomed")
    ran = []
    thread = GuardedThread(target=lambda: ran.append(1), name="doomed-1", daemon=True)
    state, error = _in_probe(thread.start)
    assert state == "done" and isinstance(error, MemoryError), error
    assert "'doomed-1' died while starting" in str(error) and "buffer_partitions" in str(error)
    assert not ran
    thread.join(5)  # returns: the thread counts as stopped
    assert thread not in threading.enumerate()

    def refused(*args, **kwargs):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading, "_start_new_thread", refused)
    with pytest.raises(MemoryError, match="cannot start the thread 'other'.*can't start new thread"):
        GuardedThread(target=print, name="other").start()


@pytest.mark.parametrize("settings", [dict(prefetch_partitions=1), dict(prefetch_partitions=2)])
def test_an_epoch_whose_threads_cannot_start_raises_memory_error(tmp_path, monkeypatch, settings):
    frame = pd.DataFrame({"x": np.arange(4000, dtype=np.float32)})
    for i in range(4):
        frame.iloc[i * 1000 : (i + 1) * 1000].to_parquet(tmp_path / f"part-{i}.parquet", index=False)
    ds = dw.WindowDataset(str(tmp_path), ["x"], series=None, window=8, batch_size=64, **settings)
    assert sum(len(b) for b in ds) == ds.num_windows  # the threads start as usual
    _failing_bootstrap(monkeypatch)
    ds.set_epoch(1)
    state, error = _in_probe(lambda: sum(len(b) for b in ds))
    assert state == "done", f"the epoch hung for {PROBE_SECONDS} s on a thread that could not start"
    assert isinstance(error, MemoryError) and "died while starting" in str(error), error


# -- item 9: no worker outlives the training process ---------------------------------------------------

_TRAINING = r"""
import os, sys
import numpy as np, pandas as pd
import dask_windows as dw
from dask_windows.integrations.loaders import window_loader

if __name__ == "__main__":
    root = sys.argv[1]
    pd.DataFrame({"x": np.arange(4000, dtype=np.float32)}).to_parquet(os.path.join(root, "p.parquet"))
    ds = dw.WindowDataset(root, ["x"], series=None, window=8, batch_size=32)
    loader = window_loader(ds, num_workers=1, stateful=False)  # forkserver workers, persistent
    it = iter(loader)
    next(it)
    import multiprocessing.forkserver as fsv
    server = fsv._forkserver._forkserver_pid  # the fork server, the workers' parent
    print("PIDS", server, *[w.pid for w in it._workers], flush=True)
    os._exit(0)  # a hard death: no cleanup, no atexit
"""


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie waiting for its reaper counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:  # pragma: no cover - no /proc: ask the kernel
        import os

        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False


@pytest.mark.skipif(not __import__("os").path.isdir("/proc"), reason="checks processes through /proc (Linux)")
def test_forkserver_workers_end_with_a_training_process_that_dies_hard(tmp_path):
    import os
    import subprocess
    import sys
    import time

    script = tmp_path / "train.py"
    script.write_text(_TRAINING)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out, "w") as stdout, open(err, "w") as stderr:  # files, not pipes: orphans cannot hold run() open
        code = subprocess.run([sys.executable, str(script), str(tmp_path)], stdout=stdout, stderr=stderr, env=env,
                              timeout=300).returncode  # fmt: skip
    assert code == 0, err.read_text()[-3000:]
    pids = [int(p) for p in out.read_text().split("PIDS", 1)[1].split()]
    assert len(pids) == 2  # the fork server and the worker
    deadline = time.monotonic() + 60  # generous; the watch wakes within milliseconds of the death
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if not _gone(p)]
    for p in left:  # never leave them running, whatever the result
        os.kill(p, 9)
    assert not left, f"the fork server and DataLoader workers {pids}: {left} outlived their training process"
