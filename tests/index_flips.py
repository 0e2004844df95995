"""One byte of a dataset index flipped at each given position, each opened in a forked child process.

Used by ``tests/sources/test_index_flips.py`` (a few dozen positions) and
``benchmarks/bench_index_flips.py`` (every position). The parent writes a small
dataset and its index, reads one epoch with the good index (the expected
batches), then per position forks a child that writes the index with that byte
XORed with ``0xA5`` beside the data, opens the dataset with it and reads one
epoch. The child's fate is the outcome:

* ``unchanged``: it opened and gave the expected batches (the byte changes nothing read);
* ``refused``: a ``DataError`` naming the index and the remedy (write it again);
* ``unclear``: any other exception (its type is recorded);
* ``silent``: it opened and gave other batches, with no error;
* ``crash``: the child died by a signal (``SIGABRT`` from C++, ``SIGKILL`` from memory) or hung past the limit.

A child may hold at most ``MEMORY_LIMIT`` of address space (``RLIMIT_AS``), so a damaged number that asks for
128 GiB fails there rather than on the machine.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
import time
import traceback

import numpy as np

MEMORY_LIMIT = 6 << 30
OUTCOMES = ("unchanged", "refused", "unclear", "silent", "crash")
_CODES = {0: "unchanged", 10: "refused", 11: "unclear", 12: "silent"}
KW = dict(features=["f0", "f1"], targets=["y"], series="sid", window=8, stride=2, batch_size=16, return_index=True)


def make_dataset(root: str) -> tuple[str, bytes, list]:
    """A small dataset under ``root``, its index written beside it: ``(index path, index bytes, batches)``."""
    from helpers import collect, make_frames, write_parquet

    from dask_windows.dataset import WindowDataset
    from dask_windows.sources.parquet.footer_index import INDEX_NAME
    from dask_windows.sources.parquet.index_writer import write_index

    write_parquet(make_frames(seed=3, num_files=3, num_series=6), root, row_group_size=17)
    write_index(root, series="sid")
    index = os.path.join(root, INDEX_NAME)
    with open(index, "rb") as src:
        blob = src.read()
    return index, blob, collect(WindowDataset(root, **KW))


def _child(root: str, index: str, blob: bytes, position: int, want: list) -> int:
    """In the forked child: flip, open, read; the exit code of the outcome."""
    import warnings

    from helpers import collect, same_batches

    from dask_windows.dataset import WindowDataset
    from dask_windows.errors import DataError

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    damaged = bytearray(blob)
    damaged[position] ^= 0xA5
    with open(index, "wb") as dst:
        dst.write(damaged)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = collect(WindowDataset(root, **KW))
    except DataError as exc:
        text = str(exc)
        if os.path.basename(index) in text and "dask-windows index" in text:
            return 10
        sys.stderr.write(f"position {position}: DataError without the index or its remedy: {text}\n")
        return 11
    except BaseException:
        sys.stderr.write(f"position {position}: {traceback.format_exc(limit=2)}\n")
        return 11
    return 0 if same_batches(got, want) else 12


def flip_outcomes(
    root: str, index: str, blob: bytes, want: list, positions: list[int], timeout: float = 120.0
) -> dict[int, str]:
    """``position -> outcome`` (``OUTCOMES``) of one byte flipped at each of ``positions``, a child each."""
    out: dict[int, str] = {}
    for position in positions:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the caller
            code = 11
            try:
                code = _child(root, index, blob, position, want)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                status = -1
                break
            time.sleep(0.002)
        if status != -1 and os.WIFEXITED(status):
            out[position] = _CODES.get(os.WEXITSTATUS(status), "crash")
        else:
            out[position] = "crash"
    with open(index, "wb") as dst:  # the good index back
        dst.write(blob)
    return out


def footer_start(blob: bytes) -> int:
    """Where the index's own Parquet footer begins."""
    return len(blob) - 8 - int.from_bytes(blob[-8:-4], "little")


def spread(blob: bytes, count: int, tail: int) -> list[int]:
    """``count`` positions spread over ``blob`` and its last ``tail`` bytes (its footer's end)."""
    body = np.linspace(0, len(blob) - 1, count).astype(int).tolist()
    return sorted(set(body) | set(range(max(0, len(blob) - tail), len(blob))))
