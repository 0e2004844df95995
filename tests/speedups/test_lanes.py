"""Runs of full batches gathered on two lanes (``dask_windows.speedups.lanes``) against one thread and an oracle.

Every batch must be the windows cut by hand from the source rows, for both layouts, small and large
batches, a partial last batch, batches held while later ones are gathered, in the same order as the
one-thread gather, the same in two passes and after a resume inside a run. The helper thread must
end with its run however the run ends (exhausted, closed early, an error in either lane), and errors
in the helper reach the consumer.
"""

from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import pytest
from helpers import make_frames, write_parquet

import dask_windows as dw
from dask_windows.runtime import batch as gathering
from dask_windows.runtime.batch import _run_gather
from dask_windows.speedups import lanes

FEATURES = ["f0", "f1", "f2"]
WINDOW = 16


def lane_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("dask-windows-lane")]


@pytest.fixture(scope="module")
def frames() -> list[pd.DataFrame]:
    return make_frames(seed=5, num_files=4, num_series=30, min_len=3, max_len=400)


@pytest.fixture(scope="module")
def root(tmp_path_factory, frames) -> str:
    path = tmp_path_factory.mktemp("lanes")
    write_parquet(frames, str(path), row_group_size=97)
    return str(path)


@pytest.fixture(params=["both", "switching"])
def forced(request, monkeypatch):
    """Two lanes for every run of at least one unit, units of one to a few batches; ``switching``:
    the timing choice changes its mind every few units, so runs mix both ways of taking units."""
    monkeypatch.setattr(lanes, "lanes_wanted", lambda batch_bytes, made=True: True)
    monkeypatch.setattr(lanes, "MIN_UNITS", 1)
    monkeypatch.setattr(lanes, "UNIT_BYTES", 3 * 8 * WINDOW * len(FEATURES) * 4)  # 3 batches of 8
    # a step's run reads a fifth of the pool's rows (whole partitions: 2 resident, 5 in the pool), so a run at
    # stride 1 copies about 16 / 5 rows per pool row, at stride = window 1 / 5
    monkeypatch.setattr(gathering, "_LANE_RATIO", 1)
    if request.param == "both":
        monkeypatch.setattr(lanes, "LaneChoice", lambda: _Fixed(True))
    else:
        monkeypatch.setattr(lanes, "LaneChoice", lambda: _Flipping())
    return request.param


class _Fixed(lanes.LaneChoice):
    def __init__(self, both: bool) -> None:
        super().__init__(probes=0)
        self.both = both


class _Flipping(lanes.LaneChoice):
    """Spans of 3 units on both lanes and 2 alone, in turn."""

    def __init__(self) -> None:
        super().__init__(probes=0)
        self.spans = 0

    def span(self, left: int) -> tuple[bool, int, bool]:
        self.spans += 1
        both = self.spans % 2 == 1
        return both, min(3 if both else 2, left), self.spans % 4 == 1

    def record(self, both: bool, units: int, seconds: float) -> None:
        pass


def oracle(frames: list[pd.DataFrame], rows: np.ndarray, layout: str) -> np.ndarray:
    """The windows starting at global ``rows``, cut by hand from the files' feature columns."""
    data = pd.concat(frames)[FEATURES].to_numpy(np.float32)  # (rows, C)
    out = np.stack([data[r : r + WINDOW] for r in rows])  # (B, L, C)
    return np.ascontiguousarray(out.transpose(0, 2, 1)) if layout == "NCL" else out


def settings(layout: str, batch: int) -> dict:
    pieces = 1  # whole partitions: steps of about a partition's windows each
    return dict(
        features=FEATURES,
        series="sid",
        window=WINDOW,
        batch_size=batch,
        layout=layout,
        seed=3,
        pieces_per_partition=pieces,
    )


@pytest.mark.parametrize("layout", ["NCL", "NLC"])
@pytest.mark.parametrize("batch", [8, 200])
def test_two_lanes_give_the_oracle_and_the_one_thread_batches(root, frames, forced, monkeypatch, layout, batch):
    args = settings(layout, batch)
    indexed = [(x.numpy().copy(), r.numpy()) for x, r in dw.WindowDataset(root, return_index=True, **args)]
    seen = []
    got = []
    for x in dw.WindowDataset(root, **args):
        got.append(x)  # every batch held to the end: none may be written again
        seen.append(len(lane_threads()))
    assert max(seen) >= 1  # the helper ran
    assert not lane_threads()
    assert len(got) == len(indexed) > 3
    windows = sum(len(r) for _, r in indexed)
    assert windows % batch and len(got[-1]) == windows % batch  # a partial last batch
    for x, (want, rows) in zip(got, indexed):
        assert x.is_contiguous()
        np.testing.assert_array_equal(x.numpy(), oracle(frames, rows, layout))
        np.testing.assert_array_equal(x.numpy(), want)
    alone = [x.numpy() for x in dw.WindowDataset(root, **args)]
    monkeypatch.undo()  # lanes as the machine allows (none with DASK_WINDOWS_LANES=0)
    monkeypatch.setenv("DASK_WINDOWS_LANES", "0")
    plain = [x.numpy() for x in dw.WindowDataset(root, **args)]
    assert len(plain) == len(got) == len(alone)
    for a, b, c in zip(plain, got, alone):
        assert a.tobytes() == b.numpy().tobytes() == c.tobytes()


def test_no_lane_where_the_stride_nears_the_window(root, forced):
    # stride = window copies each row about once: the other core is the readers', not a lane's
    args = dict(settings("NCL", 8), stride=WINDOW)
    seen = []
    for _ in dw.WindowDataset(root, **args):
        seen.append(len(lane_threads()))
    assert len(seen) > 3 and max(seen) == 0
    dense = []
    for _ in dw.WindowDataset(root, **settings("NCL", 8)):
        dense.append(len(lane_threads()))
    assert max(dense) >= 1  # the same data at stride 1 does use one


def test_two_passes_and_a_resume_inside_a_run_give_the_same_batches(root, forced):
    args = settings("NCL", 8)
    ds = dw.WindowDataset(root, **args)
    ds.set_epoch(2)
    first = [x.numpy().copy() for x in ds]
    ds.set_epoch(2)  # (a new pass takes the next epoch otherwise)
    second = [x.numpy().copy() for x in ds]
    assert len(first) == len(second) > 40
    assert all(a.tobytes() == b.tobytes() for a, b in zip(first, second))
    for k in (1, 17, len(first) // 2 + 1):  # inside the first buffer's runs, at unit edges and inside units
        again = dw.WindowDataset(root, **args)
        again.set_epoch(2)
        it = iter(again)
        head = [next(it).numpy().copy() for _ in range(k)]
        state = again.state_dict()
        it.close()
        resumed = dw.WindowDataset(root, **args)
        resumed.load_state_dict(state)
        assert state["epoch"] == 2 and state["batches"] == k
        rest = [x.numpy().copy() for x in resumed]
        assert len(head) + len(rest) == len(first)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(head + rest, first))


@pytest.mark.parametrize("how", ["close", "break", "drop", "error"])
def test_leaving_a_pass_early_ends_its_lane(root, forced, how):
    ds = dw.WindowDataset(root, **settings("NLC", 8))
    before = set(threading.enumerate())
    it = iter(ds)
    try:
        for n, _ in enumerate(it):
            if n == 7:
                assert lane_threads()
                if how == "error":
                    raise KeyboardInterrupt
                if how != "close":
                    break
                it.close()
                break
    except KeyboardInterrupt:
        pass
    if how in ("drop", "error"):
        del it
    if how == "break":
        it.close()  # what the end of a for loop over the dataset does once the iterator is dropped
    assert not lane_threads()
    assert set(threading.enumerate()) <= before


def test_two_live_passes_each_give_their_batches(root, forced):
    args = settings("NCL", 8)
    want = [x.numpy().copy() for x in dw.WindowDataset(root, **args)]
    a, b = iter(dw.WindowDataset(root, **args)), iter(dw.WindowDataset(root, **args))
    got_a, got_b = [], []
    for x in a:
        got_a.append(x.numpy().copy())
        y = next(b, None)
        if y is not None:
            got_b.append(y.numpy().copy())
    got_b += [y.numpy().copy() for y in b]
    assert all(len(g) == len(want) for g in (got_a, got_b))
    assert all(p.tobytes() == q.tobytes() == r.tobytes() for p, q, r in zip(want, got_a, got_b))
    assert not lane_threads()


def run_batches(channel_major: bool, size: int, batches: int, choice: lanes.LaneChoice, seed: int = 0):
    rng = np.random.default_rng(seed)
    rows = 300
    data = rng.standard_normal((3, rows) if channel_major else (rows, 3)).astype(np.float32)
    runs = _run_gather(data, 20, channel_major)
    run = rng.integers(0, rows - 20 + 1, size * batches).astype(np.int64)
    return runs, run


@pytest.mark.parametrize("channel_major", [True, False])
@pytest.mark.parametrize("unit_bytes", [1, 5000, 1 << 30])
def test_lane_batches_equal_the_run_gather(monkeypatch, channel_major, unit_bytes):
    monkeypatch.setattr(lanes, "UNIT_BYTES", unit_bytes)  # a batch, a few, the whole run per unit
    for choice in (_Fixed(True), _Fixed(False), _Flipping(), lanes.LaneChoice(probes=3, every=4)):
        runs, run = run_batches(channel_major, 7, 23, choice)
        got = list(lanes.lane_batches(runs, run, 7, choice))
        want = list(runs.batches(run, 7))
        assert len(got) == len(want) == 23
        for x, y in zip(got, want):
            assert x.flags.c_contiguous and x.shape == y.shape
            assert x.tobytes() == y.tobytes()
    assert not lane_threads()


@pytest.mark.parametrize("failing", [3, 4])  # a unit the helper gathers, one the consumer gathers
def test_an_error_in_either_lane_reaches_the_consumer_and_ends_the_lane(failing):
    def gather(u: int) -> list[int]:
        if u == failing:
            raise ValueError(f"unit {u} is unreadable")
        return [u]

    lane = lanes.Lanes(gather, 10, ahead=2)
    lane.both = True
    taken = []
    with pytest.raises(ValueError, match=f"unit {failing} is unreadable"):
        for u in range(10):
            taken += lane.take(u)
    lane.close()
    assert taken == list(range(failing))
    assert not lane_threads()


def test_a_keyboard_interrupt_in_the_helper_is_relayed():
    def gather(u: int) -> list[int]:
        if u == 1:
            raise KeyboardInterrupt
        return [u]

    lane = lanes.Lanes(gather, 4)
    lane.both = True
    assert lane.take(0) == [0]
    with pytest.raises(KeyboardInterrupt):
        lane.take(1)
    lane.close()
    assert not lane_threads()


@pytest.mark.parametrize("slow_helper", [False, True])
def test_each_unit_is_gathered_once_the_helper_only_odd_ones_and_a_late_one_is_taken_back(slow_helper):
    import time

    gathered: list[tuple[int, bool]] = []

    def gather(u: int) -> list[int]:
        helper = threading.current_thread().name.startswith("dask-windows-lane")
        if helper and slow_helper:
            time.sleep(0.02)  # a helper waiting for a core: the consumer does not wait for it to begin
        gathered.append((u, helper))
        return [u]

    lane = lanes.Lanes(gather, 21, ahead=2)
    lane.both = True
    assert [lane.take(u)[0] for u in range(21)] == list(range(21))
    lane.close()
    assert sorted(u for u, _ in gathered) == list(range(21))  # each unit once
    by_helper = {u for u, helper in gathered if helper}
    assert all(u % 2 == 1 for u in by_helper)
    if slow_helper:  # odd units taken back while the helper slept on an earlier one
        assert len(by_helper) < 10
    assert not lane_threads()


def test_lanes_by_default_for_large_made_batches_only_where_two_cpus_and_torch_threads_allow(monkeypatch):
    import torch

    wanted = lanes.lanes_wanted
    monkeypatch.setattr(lanes, "usable_cpus", lambda: 2)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        big, small = 2 << 20, 128 << 10  # B=256 L=512 C=4 float32, and B=64 L=128
        monkeypatch.delenv("DASK_WINDOWS_LANES", raising=False)
        assert wanted(big) and not wanted(small)  # by default: made batches of 1 MiB and more
        assert wanted(lanes.DEFAULT_BATCH_BYTES) and not wanted(lanes.DEFAULT_BATCH_BYTES - 1)
        assert not wanted(big, made=False) and not wanted(small, made=False)  # by default never features alone
        monkeypatch.setenv("DASK_WINDOWS_LANES", "1")
        assert wanted(big) and wanted(small) and wanted(big, made=False) and wanted(small, made=False)
        monkeypatch.setenv("DASK_WINDOWS_LANES", "0")
        assert not wanted(big) and not wanted(small) and not wanted(big, made=False)
        for asked in ("1", ""):
            monkeypatch.setenv("DASK_WINDOWS_LANES", asked)
            torch.set_num_threads(1)  # as in a DataLoader worker
            assert not wanted(big)
            torch.set_num_threads(2)
            monkeypatch.setattr(lanes, "usable_cpus", lambda: 1)
            assert not wanted(big)
            monkeypatch.setattr(lanes, "usable_cpus", lambda: 2)
    finally:
        torch.set_num_threads(threads)


def test_the_choice_keeps_the_faster_way():
    choice = lanes.LaneChoice(probes=4, every=10)
    for seconds_alone, seconds_both, expect in ((1.0, 0.5, True), (0.5, 1.0, False)):
        assert choice.span(100) == (False, 4, True)
        choice.record(False, 4, 2 * seconds_alone)  # two units timed
        assert choice.span(100) == (True, 4, True)
        choice.record(True, 4, 2 * seconds_both)
        assert choice.both is expect
        assert choice.span(100) == (expect, 10, False)
        assert choice.span(3) == (expect, 3, False)
        choice.record(expect, 10, 0.0)
    assert choice.span(2) == (False, 2, True)
    choice.record(False, 2, 5.0)  # cut short by the run's end: no measurement
    assert choice.span(100) == (False, 4, True)


EXIT_SCRIPT = """
import sys
import dask_windows as dw
from dask_windows.runtime import batch
from dask_windows.speedups import lanes

class Both(lanes.LaneChoice):
    def __init__(self):
        super().__init__(probes=0)

lanes.lanes_wanted = lambda batch_bytes, made=True: True
lanes.MIN_UNITS = 1
batch._LANE_RATIO = 1  # (as the ``forced`` fixture: a step reads a fifth of the pool's rows)
lanes.LaneChoice = Both
ds = dw.WindowDataset(sys.argv[1], features=["f0", "f1", "f2"], series="sid", window=16, batch_size=8, pieces_per_partition=1)
it = iter(ds)
for _ in range(5):
    next(it)
assert any(t.name.startswith("dask-windows-lane") for t in __import__("threading").enumerate())
print("left open")
"""


def test_a_pass_left_open_at_exit_lets_the_interpreter_exit(root, tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "left_open.py"
    script.write_text(EXIT_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(dw.__file__)), *sys.path]))
    done = subprocess.run([sys.executable, str(script), root], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "left open" in done.stdout


def test_rounds_lost_in_a_row_back_off_and_a_win_resets():
    choice = lanes.LaneChoice(probes=4, every=10)
    spans = []
    for both_wins in (False, False, False, True, False):
        choice.span(10**6)
        choice.record(False, 4, 1.0)
        choice.span(10**6)
        choice.record(True, 4, 0.5 if both_wins else 2.0)
        spans.append(choice.span(10**6)[1])
        choice.record(choice.both, spans[-1], 0.0)
    assert spans == [10, 20, 40, 10, 10]


def test_by_default_only_made_batches_from_the_size_threshold_go_on_two_lanes(root, frames, monkeypatch):
    import torch

    batch_bytes = lambda b: b * WINDOW * len(FEATURES) * 4
    monkeypatch.delenv("DASK_WINDOWS_LANES", raising=False)
    monkeypatch.setattr(lanes, "usable_cpus", lambda: 2)
    monkeypatch.setattr(lanes, "DEFAULT_BATCH_BYTES", batch_bytes(100))  # 100 windows: between 8 and 200
    monkeypatch.setattr(lanes, "MIN_UNITS", 1)
    monkeypatch.setattr(lanes, "UNIT_BYTES", 1)  # a unit per batch
    monkeypatch.setattr(lanes, "LaneChoice", lambda: _Fixed(True))
    monkeypatch.setattr(gathering, "_LANE_RATIO", 0)  # short windows: the pool's runs count as dense
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for batch, expect in ((8, False), (200, True)):
            args = dict(settings("NCL", batch), pieces_per_partition=None)  # the default pool order
            indexed, made = [], []
            for _, r in dw.WindowDataset(root, return_index=True, **args):  # made batches: features and rows
                made.append(len(lane_threads()))
                indexed.append(r.numpy())
            assert (max(made) >= 1) is expect, (batch, max(made))
            seen, got = [], []
            for x in dw.WindowDataset(root, **args):  # features alone: on one thread unless asked
                seen.append(len(lane_threads()))
                got.append(x.numpy())
            assert max(seen) == 0, (batch, max(seen))
            assert not lane_threads()
            assert len(got) == len(indexed)
            for x, rows in zip(got, indexed):
                np.testing.assert_array_equal(x, oracle(frames, rows, "NCL"))
    finally:
        torch.set_num_threads(threads)


KINDS = np.array(["a", "b", "c", "d"])


@pytest.fixture(scope="module")
def coded(tmp_path_factory, frames) -> tuple[str, pd.DataFrame]:
    """``frames`` with a category column (``kind``, from the row), for a workflow's named batches."""
    path = tmp_path_factory.mktemp("lanes_named")
    with_kind = [f.assign(kind=KINDS[f["ts"].to_numpy() % 4]) for f in frames]
    write_parquet(with_kind, str(path), row_group_size=97)
    return str(path), pd.concat(with_kind, ignore_index=True)


@pytest.mark.parametrize("horizon", [0, 3])
def test_named_batches_made_on_two_lanes_equal_one_thread_and_the_oracle(coded, forced, monkeypatch, horizon):
    """A workflow's named batches gathered on both lanes (features, codes, the series code): the same batches, in
    the same order, as on one thread, each the windows cut by hand from the rows."""
    from dask_windows.workflow import Categorify, Workflow

    path, frame = coded
    target = ["y"] if horizon else []
    wf = Workflow([Categorify(["kind"])], series="sid", continuous=FEATURES, categorical=["kind"], target=target)
    wf = wf.fit(frame, scheduler="sync")
    args = dict(settings("NCL", 8), horizon=horizon, workflow=wf.named(index=True))
    del args["features"]
    got, seen = [], []
    for b in dw.WindowDataset(path, **args):
        got.append(b)  # every batch held to the end
        seen.append(len(lane_threads()))
    assert max(seen) >= 1  # made on the helper too
    assert not lane_threads()
    monkeypatch.setattr(lanes, "lanes_wanted", lambda batch_bytes, made=True: False)  # one thread
    plain = list(dw.WindowDataset(path, **args))
    assert len(plain) == len(got) > 10
    codes = {k: i for i, k in enumerate(sorted(KINDS))}
    values = frame[FEATURES].to_numpy(np.float32)
    reserved = wf.ops[0].cardinality("kind") - len(KINDS)  # the codes below the first value's (missing, unseen)
    kinds = frame["kind"].map(lambda k: codes[k] + reserved).to_numpy()
    for b, p in zip(got, plain):
        assert list(b) == list(p)
        for key in b:
            assert b[key].dtype == p[key].dtype and b[key].numpy().tobytes() == p[key].numpy().tobytes(), key
        rows = b["index"].numpy()
        span = rows[:, None] + np.arange(WINDOW)
        np.testing.assert_array_equal(b["past_cont"].numpy(), values[span].transpose(0, 2, 1))
        np.testing.assert_array_equal(b["past_cat"].numpy()[:, 0], kinds[span])
        np.testing.assert_array_equal(np.array(wf.series_keys)[b["series"].numpy()], frame["sid"].to_numpy()[rows])
        if horizon:
            after = rows[:, None] + WINDOW + np.arange(horizon)
            np.testing.assert_array_equal(b["target"].numpy()[:, 0], frame["y"].to_numpy(np.float32)[after])
