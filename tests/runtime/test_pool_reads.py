"""The pool order reads each row group about once per epoch: decodes counted on local Parquet, GETs on S3."""

from __future__ import annotations

import threading
import time
from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import oracle_starts, parquet_bytes, s3_endpoint

from dask_windows.dataset import WindowDataset

FILES, GROUPS, ROWS = 6, 4, 400  # 6 files of 4 row groups of 100 rows


def _frames() -> list[pd.DataFrame]:
    rng = np.random.default_rng(0)
    out = []
    for f in range(FILES):
        t = np.arange(f * ROWS, (f + 1) * ROWS)
        out.append(pd.DataFrame({"x": t.astype(np.float32), "y": rng.random(ROWS).astype(np.float32)}))
    return out


def _counting(ds: WindowDataset) -> Counter:
    """Row groups decoded by ``ds``'s source from now on, by ``(file, row group)``."""
    counts: Counter = Counter()
    read = ds.source._read_table

    def counted(path, row_groups, columns):
        counts.update((path, g) for g in row_groups)
        return read(path, row_groups, columns)

    ds.source._read_table = counted
    return counts


# (next_pass_seconds=0: the decodes counted are one epoch's, not the next one's first units read ahead)
KW = dict(features=["x"], series=None, window=12, stride=3, batch_size=8, return_index=True, next_pass_seconds=0)


@pytest.mark.parametrize("budget", [None, 20_000])  # the whole dataset resident; a pool of about 10 row groups
def test_each_row_group_decoded_about_once_per_epoch(tmp_path, budget):
    for i, frame in enumerate(_frames()):
        frame.to_parquet(tmp_path / f"part-{i}.parquet", row_group_size=ROWS // GROUPS)
    ds = WindowDataset(str(tmp_path), buffer_bytes=budget, **KW)
    counts = _counting(ds)
    starts = np.concatenate([rows.numpy() for _, rows in ds])
    want = oracle_starts(_frames(), None, 12, 3)
    assert np.array_equal(np.sort(starts), want)  # every window once, those across row-group cuts too
    assert len(counts) == FILES * GROUPS
    assert sum(counts.values()) <= 1.25 * FILES * GROUPS
    if budget is not None:  # the pool was smaller than the dataset: a unit per row group
        assert ds._plan(_world()).spread < len(ds._plan(_world()).units) == FILES * GROUPS
    # The retired piece order's keyword is served by the pool order: each row group about once too.
    with pytest.warns(DeprecationWarning, match="pieces_per_partition=8 is deprecated"):
        pieces = WindowDataset(str(tmp_path), pieces_per_partition=8, buffer_partitions=1, **KW)
    piece_counts = _counting(pieces)
    assert np.array_equal(np.sort(np.concatenate([rows.numpy() for _, rows in pieces])), want)
    assert sum(piece_counts.values()) <= 1.25 * FILES * GROUPS


def test_two_ranks_read_each_row_group_about_once_between_them(tmp_path):
    for i, frame in enumerate(_frames()):
        frame.to_parquet(tmp_path / f"part-{i}.parquet", row_group_size=ROWS // GROUPS)
    total: Counter = Counter()
    starts = []
    for rank in (0, 1):
        ds = WindowDataset(str(tmp_path), rank=rank, world_size=2, **KW)
        counts = _counting(ds)
        starts.extend(np.concatenate([rows.numpy() for _, rows in ds]).tolist())
        total.update(counts)
    assert len(starts) == len(set(starts))
    assert sum(total.values()) <= 1.25 * FILES * GROUPS


def _world():
    from dask_windows.planning.world import World

    return World(0, 1, 0, 1)


def test_s3_gets_about_one_per_row_group():
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    # a bucket of its own: the moto server outlives this test, and other files use "bucket"
    endpoint = s3_endpoint("pool-reads", _frames(), encode=lambda f: parquet_bytes(f, row_group_size=ROWS // GROUPS))
    try:
        options = endpoint.storage_options()
        ds = WindowDataset(
            "s3://pool-reads/data/", storage_options=options, buffer_bytes=20_000, **KW
        )  # a unit per row group
        endpoint.reset()
        starts = np.concatenate([rows.numpy() for _, rows in ds])
        assert np.array_equal(np.sort(starts), oracle_starts(_frames(), None, 12, 3))
        gets = endpoint.log.count("get")
        assert FILES * GROUPS <= gets <= 1.25 * FILES * GROUPS  # one GET per row group read
    finally:
        endpoint.close()


def test_a_budget_of_too_few_units_warns_once_at_open_and_inspect_says_so(tmp_path):
    from dask_windows.cli.main import main
    from dask_windows.runtime.pool import PoolWarning

    for i, frame in enumerate(_frames()):
        frame.to_parquet(tmp_path / f"part-{i}.parquet", row_group_size=ROWS // GROUPS)
    import re
    import warnings

    with pytest.warns(PoolWarning, match=r"holds \d+ of the 24 units.*Raise buffer_bytes.*dask-windows convert") as got:
        WindowDataset(str(tmp_path), buffer_bytes=8_000, **KW)
    assert len([w for w in got if issubclass(w.category, PoolWarning)]) == 1
    warned = re.search(r"Raise buffer_bytes to about ([\d,]+) bytes", str(got[0].message))[1]

    for batch_size in (8, 32):  # 2B units fewer than the 24, and more: then every unit is enough
        kw = {**KW, "batch_size": batch_size}
        with pytest.warns(PoolWarning) as got:
            WindowDataset(str(tmp_path), buffer_bytes=8_000, **kw)
        advised = int(re.search(r"Raise buffer_bytes to about ([\d,]+)", str(got[0].message))[1].replace(",", ""))
        with warnings.catch_warnings():
            warnings.simplefilter("error", PoolWarning)
            WindowDataset(str(tmp_path), buffer_bytes=advised, **kw)  # the advice is enough...
        with pytest.warns(PoolWarning):
            WindowDataset(str(tmp_path), buffer_bytes=int(advised * 0.8), **kw)  # ...and not inflated

    with warnings.catch_warnings():
        warnings.simplefilter("error", PoolWarning)  # a budget holding 2B units and more: silent
        WindowDataset(str(tmp_path), **KW)
    text = _run_cli(main, [str(tmp_path), "--window", "12", "--stride", "3", "--batch-size", "8", "--mixing",
                           "--buffer-bytes", "8000"])  # fmt: skip
    assert "reads per epoch: each of 24 units (row groups) decoded once" in text
    assert f"raise buffer_bytes (now 8,000) to about {warned} bytes" in text  # the figure the warning checked


def test_a_row_group_larger_than_the_budget_warns_at_open_with_what_the_pool_holds(tmp_path):
    """One row group many times buffer_bytes: the pool holds it whole (over the budget), and says so."""
    import re
    import warnings

    from dask_windows.runtime.pool import PoolWarning

    rows = 20_000
    pd.DataFrame({"x": np.arange(rows, dtype=np.float32)}).to_parquet(tmp_path / "one.parquet", row_group_size=rows)
    with pytest.warns(PoolWarning, match=r"buffer_bytes=4,000 is smaller than the largest unit.*row_group_size") as got:
        WindowDataset(str(tmp_path), ["x"], series=None, window=8, buffer_bytes=4_000)
    message = str(got[0].message)
    held = int(re.search(r"the pool holds about ([\d,]+) bytes", message)[1].replace(",", ""))
    assert held >= rows * 4  # at least the row group's decoded features (a row: 4 B of x and its start)
    assert f"{held / 4000:,.1f}x the budget" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error", PoolWarning)  # the advised budget: silent
        WindowDataset(str(tmp_path), ["x"], series=None, window=8, buffer_bytes=held)


def _run_cli(main, args: list) -> str:
    import contextlib
    import io
    import warnings

    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        main(["inspect", *args])
    return out.getvalue()


@pytest.mark.parametrize("order", [dict(), dict(pieces_per_partition=1)], ids=["pool", "whole partitions"])
def test_read_workers_warn_that_they_are_deprecated_and_change_no_batch(tmp_path, order):
    for i, frame in enumerate(_frames()):
        frame.to_parquet(tmp_path / f"part-{i}.parquet", row_group_size=ROWS // GROUPS)
    kw = {**KW, **order}
    plain = [[t.numpy() for t in batch] for batch in WindowDataset(str(tmp_path), **kw)]
    with pytest.warns(
        DeprecationWarning, match=r"read_workers=2 is deprecated and ignored, and will be removed in 0\.4"
    ):
        ds = WindowDataset(str(tmp_path), read_workers=2, **kw)
    got = [[t.numpy() for t in batch] for batch in ds]
    assert len(got) == len(plain) > 1
    assert all(np.array_equal(a, b) for g, w in zip(got, plain) for a, b in zip(g, w, strict=True))
    with pytest.warns(DeprecationWarning, match=r"read_deadline=5 is deprecated.*pool order reads each unit once"):
        WindowDataset(str(tmp_path), read_deadline=5, **kw)


def test_a_pool_filled_progressively_yields_every_window_once_and_resumes_to_the_tail(tmp_path, monkeypatch):
    """With a first fill of one unit, the first step draws before the pool is full; every window still comes
    once (its rows right), in the same batches for any run, and a resume mid-fill yields the rest."""
    import torch

    import dask_windows.planning.budget as budget_module

    for i, frame in enumerate(_frames()):
        frame.to_parquet(tmp_path / f"part-{i}.parquet", row_group_size=ROWS // GROUPS)
    kw = {**KW, "buffer_bytes": 20_000}  # a pool of about 10 of the 24 row groups
    ds = WindowDataset(str(tmp_path), **kw)
    monkeypatch.setattr(budget_module, "POOL_FIRST_BYTES", int(ds._read_values().row_bytes * 120))
    plan = ds._plan(_world())
    assert plan.fill == 1 and plan.spread >= 4 and len(plan.units) == FILES * GROUPS  # one unit, then one per step
    batches = [(x.clone(), rows.clone()) for x, rows in ds]
    starts = np.concatenate([rows.numpy() for _, rows in batches])
    assert np.array_equal(np.sort(starts), oracle_starts(_frames(), None, 12, 3))
    for x, rows in batches:  # x is the row number: each window's rows are its own
        assert torch.equal(x[:, 0, :], rows[:, None].float() + torch.arange(12).float())
    again = WindowDataset(str(tmp_path), **kw)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(batches, again, strict=True))  # the same batches again
    state = WindowDataset(str(tmp_path), **kw).state_dict(batches=5, num_workers=0)
    again = WindowDataset(str(tmp_path), **kw)
    again.load_state_dict(state)
    tail = np.concatenate([rows.numpy() for _, rows in again])
    assert np.array_equal(tail, starts[5 * KW["batch_size"] :])


def _slowed(ds: WindowDataset, seconds: float) -> dict:
    """Make each read of ``ds``'s source take ``seconds`` more (a store's latency); count reads in flight."""
    state = {"now": 0, "most": 0}
    lock = threading.Lock()
    read = ds.source._read_table

    def slow(path, row_groups, columns):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        try:
            time.sleep(seconds)
            return read(path, row_groups, columns)
        finally:
            with lock:
                state["now"] -= 1

    ds.source._read_table = slow
    return state


def test_the_fill_of_a_remote_store_is_read_several_units_at_a_time_into_the_same_batches(monkeypatch):
    """On S3 the pool's fill is read on several threads (its reads wait on latency): they overlap, and
    the batches (units keeping rows for later units included) equal those of one reader thread, resumed too."""
    import dask_windows.runtime.pool as pool_module

    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    endpoint = s3_endpoint("pool-fill", _frames(), encode=lambda f: parquet_bytes(f, row_group_size=ROWS // GROUPS))
    try:
        options = endpoint.storage_options()
        kw = {**KW, "buffer_bytes": 20_000}  # a unit per row group, about 10 in the pool

        def epoch(threads: int) -> tuple[list, int]:
            monkeypatch.setattr(pool_module, "FILL_THREADS", threads, raising=False)
            ds = WindowDataset("s3://pool-fill/data/", storage_options=options, **kw)
            plan = ds._plan(_world())
            assert any(u.keep for u in plan.units)  # windows across a cut: rows kept for a later unit
            slowed = _slowed(ds, 0.02 if threads > 1 else 0.0)
            return [(x.clone(), rows.clone()) for x, rows in ds], slowed["most"]

        one, most = epoch(1)
        assert most == 1
        several, most = epoch(4)
        assert most > 1  # the fill's reads overlapped
        assert len(several) == len(one)
        assert all(torch.equal(a, b) for s, t in zip(several, one) for a, b in zip(s, t))
        starts = np.concatenate([rows.numpy() for _, rows in several])
        assert np.array_equal(np.sort(starts), oracle_starts(_frames(), None, 12, 3))
        ds = WindowDataset("s3://pool-fill/data/", storage_options=options, **kw)
        resumed = WindowDataset("s3://pool-fill/data/", storage_options=options, **kw)
        resumed.load_state_dict(ds.state_dict(batches=5, num_workers=0))
        assert np.array_equal(np.concatenate([rows.numpy() for _, rows in resumed]), starts[5 * KW["batch_size"] :])
    finally:
        endpoint.close()


def test_a_failed_read_of_the_fill_wakes_a_unit_waiting_on_another_thread_for_its_kept_rows():
    """A unit whose read fails hands its kept rows over as missing: the later unit that waits for them on
    another reader thread reads them itself, and the pass raises the error instead of hanging at close."""
    from dask_windows.errors import SourceReadError
    from dask_windows.runtime.pool import _Pool

    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    endpoint = s3_endpoint("pool-fail", _frames(), encode=lambda f: parquet_bytes(f, row_group_size=ROWS // GROUPS))
    try:
        options = endpoint.storage_options()
        ds = WindowDataset("s3://pool-fail/data/", storage_options=options, buffer_bytes=20_000, **KW)
        units = ds._plan(_world()).units
        first = next(i for i, u in enumerate(units) if u.keep)  # the first unit keeping rows for a later one
        p, (a, b) = units[first].partition, units[first].fresh
        wanted = {(p, lo, hi) for lo, hi in units[first].keep}
        later = [j for j, u in enumerate(units) if j > first and _takes(u) & wanted]
        assert later  # a later unit of the fill waits for those rows
        read = _Pool._rows

        def failing(pool, q, lo, hi):
            if (q, lo, hi) == (p, a, b):
                time.sleep(0.3)  # the later unit is read meanwhile, and waits
                raise SourceReadError("part unreadable on purpose")
            return read(pool, q, lo, hi)

        outcome: list = []

        def run() -> None:
            try:
                list(ds)
            except SourceReadError as exc:
                outcome.append(exc)

        _Pool._rows = failing
        try:
            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            thread.join(30)
        finally:
            _Pool._rows = read
        assert not thread.is_alive(), "the pass hung"
        assert len(outcome) == 1 and "on purpose" in str(outcome[0])
    finally:
        endpoint.close()


def _takes(unit) -> set:
    """``(partition, lo, hi)`` of the rows ``unit`` may take from another unit: before and after its read."""
    (r0, r1), (fa, fb) = unit.rows, unit.fresh
    return {(unit.partition, r0, fa), (unit.partition, fb, r1)}
