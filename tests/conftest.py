"""Shared test settings: one torch thread (the CI machine has two cores), and how many pytest-xdist
worker processes run the suite (``-n auto`` in setup.cfg)."""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
torch.set_num_threads(1)


import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# Hypothesis draws the same examples on every run ("suite", the default: a test that passed once cannot
# fail later on new random draws, so the suite is never flaky); `--hypothesis-profile=explore` draws
# new ones each run (do that when you change index, plan or schedule arithmetic, and keep what it finds
# as an @example). No deadline and no too-slow check in either: timing is not what these tests assert,
# and a loaded 2-core machine would make it fail.
_QUIET = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("suite", derandomize=True, **_QUIET)
settings.register_profile("explore", derandomize=False, **_QUIET)
settings.load_profile("suite")

# Suite workers (pytest-xdist): most slow tests wait on processes, sockets or sleeps, so more workers
# than the CI machine's two cores pay. DASK_WINDOWS_TEST_WORKERS overrides; `-n N` on the command line too.
SUITE_WORKERS = 4

# Files that take longest, started first so that none of them starts last and alone (each file's
# tests run in one worker: --dist loadfile). Measured with `--durations` (a run of the suite, 4 workers).
SLOW_FILES = (
    "test_cli.py",
    "test_docs.py",
    "test_convert.py",
    "test_lightning.py",
    "test_hostile_reads.py",
    "test_example_ddp.py",
    "test_elastic.py",
    "test_cache.py",
    "test_layout.py",
    "test_examples.py",
    "test_resume.py",
    "test_pieces.py",
)


def _test_files(config) -> int:
    """How many test files the command line names (a folder counts its test files)."""
    count = 0
    for arg in config.args or ["tests"]:
        path = os.path.join(str(config.invocation_params.dir), arg.split("::")[0])
        if os.path.isdir(path):
            count += sum(
                name.startswith("test_") and name.endswith(".py") for _, _, names in os.walk(path) for name in names
            )
        else:
            count += 1
    return count


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: no worker process for a file or two (they run in this process, as without
    xdist), SUITE_WORKERS for more."""
    if os.environ.get("DASK_WINDOWS_TEST_WORKERS"):
        return int(os.environ["DASK_WINDOWS_TEST_WORKERS"])
    return SUITE_WORKERS if _test_files(config) > 2 else 0


#: The tests marked ``slow`` (``python -m pytest -m "not slow"`` leaves them out: about a minute on 2 cores,
#: where the whole suite takes about six): file -> its slow tests by function name (every parametrisation),
#: or ``ALL``. Chosen from ``python -m pytest -n 0 --durations=0 tests/<folder>`` run one folder at a time;
#: a test of several seconds may carry ``@pytest.mark.slow`` itself instead. tests/test_package.py checks
#: that every name here is a test that exists.
ALL = "*"
SLOW_TESTS: dict[str, str | set[str]] = {}


@pytest.hookimpl(tryfirst=True)  # before -m "not slow" deselects
def pytest_collection_modifyitems(config, items) -> None:
    """Mark ``SLOW_TESTS`` slow; the slowest files first (a stable sort keeps every file's own order)."""
    root = str(config.rootpath)
    for item in items:
        slow = SLOW_TESTS.get(os.path.relpath(str(item.path), root).replace(os.sep, "/"), ())
        if slow == ALL or getattr(item, "originalname", item.name) in slow:
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(os.path.basename(str(item.path)), len(rank)))


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
