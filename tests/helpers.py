"""Synthetic partitioned datasets and a brute-force pandas/numpy oracle for the tests."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq


def skip_unless_installed(*modules: str) -> None:
    """Skip the calling test module (at collection) when one of ``modules`` is not installed.

    Looked up with ``importlib.util.find_spec``, not imported: every pytest-xdist worker collects
    every test file, so a module-level ``pytest.importorskip`` of a heavy package (s3fs and moto's
    server, pmdarima, fastai, Lightning) cost each worker its import. The tests import it when
    they run (their fixtures do)."""
    import importlib.util

    import pytest

    for name in modules:
        if importlib.util.find_spec(name.split(".")[0]) is None:
            pytest.skip(f"{name} is not installed (pip install {name.split('.')[0]})", allow_module_level=True)


def make_frames(
    seed: int = 0,
    num_files: int = 4,
    num_series: int = 9,
    min_len: int = 3,
    max_len: int = 80,
    channels: int = 3,
) -> list[pd.DataFrame]:
    """Series of random lengths laid end to end and cut into files at random rows.

    Series span files; some are shorter than typical windows. Feature values encode their
    global row (``f0 == row``) so a window's values prove which rows it holds.
    """
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, max_len, num_series)
    sid = np.repeat(np.arange(num_series) * 7 + 100, lengths)
    rows = len(sid)
    frame = pd.DataFrame({"sid": sid, "ts": np.arange(rows, dtype=np.int64)})
    frame["f0"] = np.arange(rows, dtype=np.float32)
    for c in range(1, channels):
        frame[f"f{c}"] = rng.standard_normal(rows).astype(np.float32)
    frame["y"] = (np.arange(rows) * 10.0).astype(np.float32)
    frame["z"] = -np.arange(rows, dtype=np.float32)
    cuts = np.sort(rng.choice(np.arange(1, rows), num_files - 1, replace=False))
    bounds = [0, *cuts.tolist(), rows]
    return [frame.iloc[a:b].reset_index(drop=True) for a, b in zip(bounds[:-1], bounds[1:])]


def write_parquet(frames: list[pd.DataFrame], root: str, row_group_size: int | None = None) -> list[str]:
    """Write ``frames`` as ``part-000i.parquet`` under ``root``; return the paths in order."""
    os.makedirs(root, exist_ok=True)
    paths = []
    for i, frame in enumerate(frames):
        path = os.path.join(root, f"part-{i:04d}.parquet")
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path, row_group_size=row_group_size)
        paths.append(path)
    return paths


def oracle_starts(
    frames: list[pd.DataFrame], series: str | None, window: int, stride: int = 1, horizon: int = 0
) -> np.ndarray:
    """Global start rows of every valid window, by brute force over each file's rows."""
    out = []
    offset = 0
    for frame in frames:
        keys = frame[series].to_numpy() if series else np.zeros(len(frame))
        n = len(frame)
        run_start = 0
        for r in range(1, n + 1):
            if r == n or keys[r] != keys[r - 1]:
                for s in range(run_start, r - window - horizon + 1, stride):
                    out.append(offset + s)
                run_start = r
        offset += n
    return np.array(sorted(out), dtype=np.int64)


def collect(ds, loader_kwargs: dict | None = None) -> list:
    """Every batch of one epoch through a DataLoader, as numpy tuples."""
    import torch

    loader = torch.utils.data.DataLoader(ds, batch_size=None, **(loader_kwargs or {}))
    out = []
    for batch in loader:
        batch = batch if isinstance(batch, (tuple, list)) else (batch,)
        out.append(tuple(b.numpy() for b in batch))
    return out


def parquet_bytes(frame: pd.DataFrame, **write_options) -> bytes:
    """``frame`` as the bytes of one Parquet file (``pq.write_table`` options passed through)."""
    import io

    out = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), out, **write_options)
    return out.getvalue()


def s3_endpoint(bucket: str, frames: list[pd.DataFrame], encode=None, extra: dict | None = None):
    """A real S3 endpoint (moto behind the counting proxy of ``s3proxy``) holding ``frames``.

    ``frames[i]`` is ``s3://{bucket}/data/part-{i:04d}.parquet`` (written by ``encode``, default
    ``parquet_bytes`` with row groups of 17 rows); ``extra`` maps more keys to bytes. The endpoint
    carries ``fs`` (an ``s3fs`` client straight to moto) and ``frames``; ``close()`` it when done.
    """
    import s3fs
    from s3proxy import S3Endpoint

    encode = encode or (lambda frame: parquet_bytes(frame, row_group_size=17))
    endpoint = S3Endpoint()
    endpoint.make_bucket(bucket)
    endpoint.fs = s3fs.S3FileSystem(**endpoint.storage_options(direct=True))
    endpoint.frames = frames
    for i, frame in enumerate(frames):
        endpoint.fs.pipe(f"{bucket}/data/part-{i:04d}.parquet", encode(frame))
    for key, data in (extra or {}).items():
        endpoint.fs.pipe(f"{bucket}/{key}", data)
    return endpoint


def same_batches(a: list, b: list) -> bool:
    """Whether two epochs of numpy-tuple batches are equal, batch by batch and tensor by tensor."""
    return len(a) == len(b) and all(
        len(x) == len(y) and all(np.array_equal(u, v) for u, v in zip(x, y)) for x, y in zip(a, b)
    )


EARLIER_THREADS: set[threading.Thread] = set()  # alive when the running test began (tests/conftest.py)


def threads_started_here(prefix: str = "dask-windows") -> list[threading.Thread]:
    """The threads named ``prefix...`` that the running test started (not, say, a read pool kept by an
    earlier file's dataset, which ends on its own schedule)."""
    return [t for t in threading.enumerate() if t.name.startswith(prefix) and t not in EARLIER_THREADS]


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(*args: str, expect: int = 0, process: bool = False) -> subprocess.CompletedProcess:
    """``dask-windows ARGS``: in this process through ``main`` (a subprocess costs an interpreter
    and its imports, about 5 CPU-s), or as the console entry point in a subprocess with
    ``process=True`` (the ``converted`` fixture and the version check do)."""
    if not process:
        import contextlib
        import io

        from dask_windows.cli import main

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's usage errors and --version
                code = exc.code or 0
        done = subprocess.CompletedProcess(["dask-windows", *args], code, out.getvalue(), err.getvalue())
        assert done.returncode == expect, done.stderr
        return done
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run(
        [sys.executable, "-m", "dask_windows.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == expect, done.stderr
    return done


def exit_code_forked_while_held(lock, target, args: tuple = (), seconds: float = 10) -> int | None:
    """The exit code of ``target(*args)`` run in a child forked while another thread of this process holds
    ``lock`` (``None``: the child was still running after ``seconds``, and was killed)."""
    import multiprocessing

    inside, leave = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            inside.set()
            leave.wait(seconds)

    thread = threading.Thread(target=holder)
    thread.start()
    inside.wait(seconds)
    try:
        child = multiprocessing.get_context("fork").Process(target=target, args=args)
        child.start()
        child.join(seconds)
        code = child.exitcode
        if code is None:
            child.kill()
            child.join()
    finally:
        leave.set()
        thread.join()
    return code
