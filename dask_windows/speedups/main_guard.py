"""Refuse to start ``read_workers`` from a script's unguarded top-level code.

Read workers start by ``forkserver`` (or ``spawn``): each new process imports
the script that started it again, as ``__mp_main__``. Code at the script's
top level, outside ``if __name__ == "__main__":``, then runs once more in
every worker: a script without the guard trained twice (once in the worker,
before it took its first read) and exited 0. ``multiprocessing`` catches this
only inside the child, while it imports the script, where the error is easy
to miss.

This module tells it in the parent, before any process starts: it finds the
frame of the script's top-level code on the main thread's stack and looks in
the script's syntax tree for an ``if __name__ == "__main__":`` block around
the line running. No guard around it: ``RuntimeError`` naming the file, the
line and the remedy. A script it cannot read (``python -c``, a notebook, a
frozen program) is trusted, as multiprocessing trusts it. Inside a worker
that imports the script (``_inheriting``), the same error is raised there.
"""

from __future__ import annotations

import ast
import functools
import multiprocessing
import os
import sys
import threading

__all__ = ["check_main_guard"]


def _message(where: str) -> str:
    return (
        f"read_workers start worker processes that import the script again ({where} runs at its top "
        'level, outside `if __name__ == "__main__":`), so every worker would run the whole script once '
        'more; put the script\'s top-level code under `if __name__ == "__main__":` (or in a main() '
        "called there), or use read_workers=0"
    )


def _is_main_test(test: ast.expr) -> str | None:
    """``"=="`` or ``"!="`` when ``test`` compares ``__name__`` with ``"__main__"``, else ``None``
    (``"=="`` also for ``__name__ == "__main__" and ...``)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return "==" if any(_is_main_test(v) == "==" for v in test.values) else None
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and len(test.comparators) == 1):
        return None
    sides = {type(s).__name__: s for s in (test.left, test.comparators[0])}
    name, const = sides.get("Name"), sides.get("Constant")
    if not (isinstance(name, ast.Name) and name.id == "__name__"):
        return None
    if not (isinstance(const, ast.Constant) and const.value == "__main__"):
        return None
    return {ast.Eq: "==", ast.NotEq: "!="}.get(type(test.ops[0]))


@functools.lru_cache(maxsize=8)
def _guarded_lines(path: str, mtime: float) -> tuple[tuple[int, int], ...] | None:
    """Line ranges of ``path`` run only when it is ``__main__``; ``None`` when it cannot be parsed."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    ranges = []
    for node in ast.walk(tree):  # a guard inside a top-level try: or with: counts too
        if isinstance(node, ast.If) and (kind := _is_main_test(node.test)):
            body = node.body if kind == "==" else node.orelse
            if body:
                ranges.append((body[0].lineno, max(getattr(n, "end_lineno", n.lineno) or n.lineno for n in body)))
    return tuple(ranges)


def _script_line() -> tuple[str, int] | None:
    """The script's file and the line its top-level code is running, on the main thread."""
    import __main__

    path = getattr(__main__, "__file__", None)
    if not path:
        return None
    path = os.path.abspath(path)
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and os.path.abspath(frame.f_code.co_filename) == path:
            return path, frame.f_lineno
        frame = frame.f_back
    return None


def check_main_guard(start_method: str | None) -> None:
    """Raise ``RuntimeError`` when starting processes by ``start_method`` would run the script again.

    Args:
        start_method: ``"forkserver"``, ``"spawn"``, ``"fork"`` or ``None`` (the platform's default).
    """
    method = start_method or multiprocessing.get_start_method(allow_none=True) or "spawn"
    if method == "fork":
        return  # a forked child does not import the script
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError(_message("this worker is importing the script, which"))
    found = _script_line()
    if found is None:
        return
    path, line = found
    try:
        ranges = _guarded_lines(path, os.path.getmtime(path))
    except OSError:
        return
    if ranges is None or any(first <= line <= last for first, last in ranges):
        return
    raise RuntimeError(_message(f"line {line} of {path}"))
