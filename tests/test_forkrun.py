"""tests/forkrun.py, the suite's runner of child scripts, behaves like ``subprocess`` where tests rely on it."""

from __future__ import annotations

import os
import subprocess
import sys

import forkrun
import pytest


def test_a_forked_child_is_a_process_with_its_own_argv_cwd_env_and_exit_code(tmp_path):
    code = "import os, sys; print(sys.argv[1:], os.getcwd(), os.environ['PROBE'], os.getpid()); sys.exit(3)"
    env = dict(os.environ, PROBE="seen")
    done = forkrun.run([sys.executable, "-c", code, "a", "b"], env=env, cwd=str(tmp_path))
    assert done.returncode == 3
    argv, cwd, probe, pid = done.stdout.rsplit(" ", 3)
    assert (argv, cwd, probe) == ("['a', 'b']", str(tmp_path), "seen") and int(pid) != os.getpid()
    failed = forkrun.run([sys.executable, "-c", "print('out'); raise ValueError('boom')"])
    assert failed.returncode == 1 and failed.stdout == "out\n" and "ValueError: boom" in failed.stderr


def test_a_script_runs_as_main_with_its_folder_on_the_path(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(
        "import pickle, sys\n"
        "def named(): pass\n"
        "print(__name__, sys.argv[1:], sys.path[0] == sys.argv[0].rsplit('/', 1)[0], len(pickle.dumps(named)) > 0)\n"
        "raise SystemExit('bad input')\n"
    )
    child = forkrun.popen([sys.executable, str(script), "x"])
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 1  # SystemExit with a message, as the interpreter exits
    assert "__main__ ['x'] True True\n" in out and "bad input\n" in out  # stderr merged into the output


def test_a_child_past_its_time_is_killed_and_the_wait_raises():
    child = forkrun.popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with pytest.raises(subprocess.TimeoutExpired):
        child.communicate(timeout=0.5)
    assert child.poll() is None
    child.kill()
    assert child.wait(60) == -9
    with pytest.raises(subprocess.TimeoutExpired):
        forkrun.run([sys.executable, "-c", "import time; time.sleep(600)"], timeout=0.5)


def test_an_environment_an_import_already_read_starts_cold(monkeypatch):
    code = "import sys; print('dask_windows' in sys.modules)"
    assert forkrun.run([sys.executable, "-c", code]).stdout == "True\n"  # forked: imported by the zygote
    cold = dict(os.environ, DASK_WINDOWS_TELEMETRY="0")
    assert forkrun.run([sys.executable, "-c", code], env=cold).stdout == "False\n"
    monkeypatch.setenv("DASK_WINDOWS_TEST_FORK", "0")
    assert forkrun.run([sys.executable, "-c", code]).stdout == "False\n"


def test_a_zygote_started_under_another_environment_is_started_again(monkeypatch):
    code = "import os, sys; print('dask_windows' in sys.modules, os.environ.get('DASK_WINDOWS_PROBE'))"
    monkeypatch.setenv("DASK_WINDOWS_PROBE", "set")
    assert forkrun.run([sys.executable, "-c", code]).stdout == "True set\n"  # a zygote imported under it
    monkeypatch.delenv("DASK_WINDOWS_PROBE")
    assert forkrun.run([sys.executable, "-c", code]).stdout == "True None\n"  # not left to start cold


def test_a_variable_set_for_good_by_an_earlier_test_still_forks(monkeypatch):
    code = "import os, sys; print('dask_windows' in sys.modules, os.environ['OMP_NUM_THREADS'])"
    assert forkrun.run([sys.executable, "-c", code]).stdout == "True 1\n"
    monkeypatch.setitem(os.environ, "OMP_NUM_THREADS", "2")  # as a library that writes os.environ does
    assert forkrun.run([sys.executable, "-c", code]).stdout == "True 2\n"
