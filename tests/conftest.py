"""Shared test settings: one torch thread (the CI machine has two cores)."""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
torch.set_num_threads(1)


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _release_next_passes():
    """Each test's read-ahead of a next pass (``nextpass``) ends with the test: its threads and buffers
    must not show in the next test's thread or memory checks (a module-scoped dataset keeps one)."""
    yield
    from dask_windows.speedups import nextpass

    nextpass.release_all()


@pytest.fixture(autouse=True)
def _earlier_threads():
    """The threads alive when each test begins, for ``helpers.threads_started_here``."""
    import threading

    from helpers import EARLIER_THREADS

    EARLIER_THREADS.clear()
    EARLIER_THREADS.update(threading.enumerate())
    yield
    EARLIER_THREADS.clear()
