"""Issue 23's hangs: a thread that cannot start, a read worker that stops answering, workers left orphaned.

Each case would wait forever before the fix; the tests bound every wait (a probe thread joined with a
generous timeout, a small read deadline, a subprocess timeout) so that a regression fails rather
than hangs the suite.
"""

from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import pytest

import dask_windows as dw
from dask_windows.threadguard import GuardedThread

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

    def refused(*args, **kwargs):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading, "_start_new_thread", refused)
    with pytest.raises(MemoryError, match="cannot start the thread 'other'.*can't start new thread"):
        GuardedThread(target=print, name="other").start()


@pytest.mark.parametrize("settings", [dict(prefetch_partitions=1), dict(prefetch_partitions=2, read_workers=1)])
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
