"""The package namespace: torch-free imports, lazy torch-side exports, a sorted ``__all__``."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import dask_windows as dw

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("statement", [
    "import dask_windows",
    # what Dask workers unpickle for convert and stats tasks, and the CLI up to dispatch
    "import dask_windows.cli.convert, dask_windows.cli.readers, dask_windows.cli.summary, "
    "dask_windows.sources.manifest, dask_windows.cli.bench, dask_windows.cli; "
    "dask_windows.cli.build_parser()",
])
def test_imports_leave_torch_alone(statement):
    done = run_python(f"{statement}; import sys; assert 'torch' not in sys.modules, "
                      f"'torch was imported'")
    assert done.returncode == 0, done.stderr


def test_torch_side_exports_resolve_on_access():
    done = run_python(
        "import sys, dask_windows as dw\n"
        "assert 'torch' not in sys.modules\n"
        "assert dw.WindowDataset.__module__ == 'dask_windows.dataset'\n"
        "assert 'torch' in sys.modules\n"
        "assert callable(dw.masks.subsequence_mask)\n"
        "from dask_windows import DevicePrefetcher, WindowDataset, masks, standardize\n"
        "assert WindowDataset is dw.WindowDataset and masks is sys.modules['dask_windows.masks']\n"
        "assert DevicePrefetcher.__module__ == 'dask_windows.device' and callable(standardize)\n"
    )
    assert done.returncode == 0, done.stderr


def test_namespace():
    assert dw.__all__ == sorted(dw.__all__)
    for name in dw.__all__:
        assert getattr(dw, name) is not None
    assert set(dw.__all__) <= set(dir(dw))
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        dw.no_such_name  # noqa: B018
    from dask_windows.dataset import WindowDataset

    assert dw.WindowDataset is WindowDataset


@pytest.mark.parametrize("old", sorted(__import__("dask_windows._moved", fromlist=["MOVED"]).MOVED))
def test_old_module_paths_warn_and_are_the_new_modules(old):
    from dask_windows._moved import MOVED

    done = run_python(
        "import importlib, sys, warnings\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        f"    old = importlib.import_module({old!r})\n"
        f"assert old is importlib.import_module({MOVED[old]!r})\n"
        f"assert any(issubclass(w.category, DeprecationWarning) and {MOVED[old]!r} in str(w.message) "
        "for w in seen), [str(w.message) for w in seen]\n"
        "assert 'torch' not in sys.modules\n"
    )
    assert done.returncode == 0, done.stderr
