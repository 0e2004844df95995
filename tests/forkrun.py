"""Python child processes for tests, forked from a warm interpreter instead of started cold.

Each test child (a gloo rank, an example script, a ``python -c`` check) used to start a new
interpreter and import torch, numpy, pandas, pyarrow and dask_windows again: about 3 CPU-s
before it did anything, on a 2-core machine that runs the whole suite. Here one *zygote*
process per pytest worker imports them once; every child is ``fork``-ed from it, runs its
script as ``__main__`` (or its ``-c`` code) with its own arguments, environment, working
folder and output files, and exits like an interpreter (``threading._shutdown``, exit
functions), in a session of its own so that a kill takes its children too.

It is still a real process (its own pid, memory, gloo sockets, DataLoader workers); what it
does not do is start Python. So a test that is *about* interpreter start or exit (imports,
finalisation at exit, a hang at shutdown) keeps ``subprocess``; so does a child whose
environment differs in a variable that an imported module has already read
(``DASK_WINDOWS_*``, ``DASK_*``, ``OMP_*``, ``MKL_*``, ``TORCH*``, ``PYTHON*`` other than
``PYTHONPATH``): ``popen`` and ``run`` start those with ``subprocess`` themselves. Every child
gets ``OMP_NUM_THREADS=1`` and ``MKL_NUM_THREADS=1`` unless its environment says otherwise (the
zygote's torch was imported with them).
The zygote imports under the pytest worker's environment as it is when a child starts: when that
environment has changed in such a variable since (a test set it, a library wrote ``os.environ``), a
new zygote is started for the children that follow and the old one exits once its own children have.
``DASK_WINDOWS_TEST_FORK=0`` starts every child with ``subprocess``.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_READ_AT_IMPORT = ("DASK_WINDOWS_", "DASK_", "OMP_", "MKL_", "TORCH", "PYTHON")
_BASE_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

_SERVER = r"""
import json, os, selectors, sys, threading, time, traceback, atexit, runpy, types
import numpy, pandas, pyarrow, pyarrow.parquet, torch, torch.distributed
import dask_windows, dask_windows.dataset

def child(job):
    os.setsid()
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    out = os.open(job["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    err = out if job["err"] is None else os.open(job["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(out, 1)
    os.dup2(err, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    argv = job["argv"]
    extra = [p for p in job["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [""] + extra + [p for p in sys.path[1:] if p not in extra]
    code = 0
    try:
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            main = types.ModuleType("__main__")  # as ``python -c``: a __main__ module without __file__
            sys.modules["__main__"] = main
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

jobs = {}
with selectors.DefaultSelector() as sel:
    sel.register(sys.stdin, selectors.EVENT_READ)
    open_ = True
    while open_ or jobs:
        if open_ and sel.select(timeout=0.02):
            line = sys.stdin.readline()
            if not line:
                open_ = False
                continue
            job = json.loads(line)
            pid = os.fork()
            if pid == 0:
                child(job)
            jobs[pid] = job["id"]
            print(json.dumps({"id": job["id"], "pid": pid}), flush=True)
        elif not open_:
            time.sleep(0.02)
        while jobs:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            print(json.dumps({"id": jobs.pop(pid), "rc": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class _Zygote:
    """The pytest worker's end of the zygote: starts jobs, and a thread that files its answers."""

    def __init__(self) -> None:
        env = {**_BASE_ENV, **os.environ}  # as ``run`` and ``popen`` make a child's
        env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        self.env = env
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
        )
        self.lock = threading.Condition()
        self.answers: dict[int, dict] = {}
        self.next_id = 0
        self.dead = False
        threading.Thread(target=self._read, name="forkrun-zygote", daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            answer = json.loads(line)
            with self.lock:
                self.answers.setdefault(answer["id"], {}).update(answer)
                self.lock.notify_all()
        with self.lock:
            self.dead = True
            self.lock.notify_all()

    def start(self, argv: list[str], env: dict, cwd: str, out: str, err: str | None) -> tuple[int, int]:
        with self.lock:
            self.next_id += 1
            job_id = self.next_id
            job = {"id": job_id, "argv": argv, "env": env, "cwd": cwd, "out": out, "err": err}
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            while "pid" not in self.answers.get(job_id, {}):
                if self.dead or not self.lock.wait(timeout=60):
                    raise RuntimeError(f"the test zygote did not start {argv[:2]} (exit {self.proc.poll()})")
            return job_id, self.answers[job_id]["pid"]

    def returncode(self, job_id: int, timeout: float | None) -> int | None:
        with self.lock:
            self.lock.wait_for(lambda: "rc" in self.answers.get(job_id, {}) or self.dead, timeout=timeout)
            return self.answers.get(job_id, {}).get("rc")

    def retire(self) -> None:
        """No new jobs: the zygote exits once the children it started have (their answers still come)."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def close(self) -> None:
        self.retire()
        try:
            self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()


_ZYGOTE: list[_Zygote] = []


def _read_at_import(env: dict) -> dict:
    """The part of an environment that an import may already have read (``PYTHONPATH`` aside)."""
    return {k: v for k, v in env.items() if k.startswith(_READ_AT_IMPORT) and k != "PYTHONPATH"}


def _zygote() -> _Zygote:
    """The zygote, started again when it died or when this process's environment no longer is the one
    it imported under (a test that set ``DASK_WINDOWS_*`` when the first child started must not leave
    every later child of this pytest worker to start cold)."""
    now = _read_at_import({**_BASE_ENV, **os.environ})
    if _ZYGOTE and (_ZYGOTE[0].proc.poll() is not None or _read_at_import(_ZYGOTE[0].env) != now):
        _ZYGOTE.pop().retire()
    if not _ZYGOTE:
        _ZYGOTE.append(_Zygote())
        atexit.register(_ZYGOTE[0].close)
    return _ZYGOTE[0]


class ForkedChild:
    """What the tests use of ``subprocess.Popen``: ``pid``, ``poll``, ``wait``, ``communicate``
    (the output as text), ``kill`` and ``returncode``."""

    def __init__(self, argv: list[str], env: dict, cwd: str, merge: bool) -> None:
        self.args = argv
        folder = tempfile.mkdtemp(prefix="forkrun-")
        self._out = os.path.join(folder, "out")
        self._err = None if merge else os.path.join(folder, "err")
        self._zygote = _zygote()
        self._id, self.pid = self._zygote.start(argv, env, cwd, self._out, self._err)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.returncode(self._id, timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._zygote.returncode(self._id, timeout=timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def _text(self, path: str | None) -> str | None:
        if path is None or not os.path.exists(path):
            return None if path is None else ""
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        self.wait(timeout)
        texts = self._text(self._out), self._text(self._err)
        shutil.rmtree(os.path.dirname(self._out), ignore_errors=True)
        return texts

    def kill(self) -> None:
        """The child and its session (its gloo peers' launcher aside: each child is its own); nothing once
        the zygote reaped it (its pid may then be another process's)."""
        if self.poll() is not None:
            return
        for kill in (os.killpg, os.kill):  # the group, and the child itself should it not lead one yet
            try:
                kill(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _forkable(argv: list[str], env: dict) -> bool:
    if os.environ.get("DASK_WINDOWS_TEST_FORK", "1") == "0" or argv[0] != sys.executable or len(argv) < 2:
        return False
    if argv[1].startswith("-") and argv[1] != "-c":
        return False  # -m, -X, ...
    return _read_at_import(env) == _read_at_import(_zygote().env)


def popen(argv: list[str], env: dict | None = None, cwd: str | None = None) -> Any:
    """``subprocess.Popen(argv, env=env, cwd=cwd, stdout=PIPE, stderr=STDOUT, text=True)``, forked
    from the zygote when it can be (``argv[0]`` is ``sys.executable``, then a script or ``-c``)."""
    env = {**_BASE_ENV, **(os.environ if env is None else env)}
    if _forkable(argv, env):
        return ForkedChild(argv[1:], env, cwd or os.getcwd(), merge=True)
    return subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run(argv: list[str], env: dict | None = None, cwd: str | None = None, timeout: float = 300) -> Any:
    """``subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)``,
    forked from the zygote when it can be; a child past ``timeout`` is killed, then raises."""
    env = {**_BASE_ENV, **(os.environ if env is None else env)}
    if not _forkable(argv, env):
        return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    child = ForkedChild(argv[1:], env, cwd or os.getcwd(), merge=False)
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(60)
        raise
    return subprocess.CompletedProcess(argv, child.returncode, out, err)
