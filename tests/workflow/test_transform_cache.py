"""The transformed reads kept across epochs (``Workflow(cache_bytes=)``, ``workflow.cache``).

Batches with the cache equal batches without it, epoch after epoch, and equal a pandas reference
(groupby per series); the second epoch is answered from memory; the bytes kept never pass the
budget; a refit workflow's rows are not reused, and a dataset whose workflow is refit in place refuses to
go on; a DataLoader worker starts with its own, empty.
"""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest
import torch

from dask_windows import WindowDataset
from dask_windows.errors import ConfigError
from dask_windows.workflow import Categorify, FillMissing, Lag, Normalize, Workflow
from dask_windows.workflow.cache import TransformCache, held_bytes

WINDOW, HORIZON = 12, 3


def panel() -> pd.DataFrame:
    """6 series x 300 rows: a value with 5% missing, a category."""
    rng = np.random.default_rng(3)
    sid = np.repeat(np.arange(6), 300)
    value = rng.uniform(5, 50, 6)[sid] * (1 + 0.2 * rng.standard_normal(len(sid)))
    value[rng.random(len(sid)) < 0.05] = np.nan
    return pd.DataFrame({"sid": sid, "value": value, "kind": np.array(["a", "b", "c"])[rng.integers(0, 3, len(sid))]})


def make_workflow(cache_bytes: int) -> Workflow:
    ops = [FillMissing(["value"], value=0.0), Lag("value", [2]), Normalize(["value"], per_series=True)]
    roles = dict(continuous=["value", "value_lag2"], categorical=["kind"], target=["value"])
    return Workflow([*ops, Categorify(["kind"])], series="sid", cache_bytes=cache_bytes, **roles)


def reference(df: pd.DataFrame) -> pd.DataFrame:
    """The workflow in pandas."""
    filled = df["value"].fillna(0.0)
    g = filled.groupby(df["sid"])
    out = pd.DataFrame({"value": (filled - g.transform("mean")) / g.transform("std")})
    out["value_lag2"] = g.shift(2)
    out["kind"] = df["kind"].map({"a": 2, "b": 3, "c": 4})
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    df = panel()
    df.to_parquet(root / "p.parquet", row_group_size=150, index=False)
    return str(root), df, reference(df)


def epochs(root: str, wf: Workflow, n: int = 3) -> tuple[list, list, WindowDataset]:
    """``n`` epochs of named batches (one dataset), and the source's counters after each."""
    ds = WindowDataset(root, workflow=wf.named(index=True), window=WINDOW, horizon=HORIZON, batch_size=40, seed=2,
                       buffer_bytes=80_000)  # fmt: skip
    out, counts = [], []
    for epoch in range(n):
        ds.set_epoch(epoch)
        out.append([{k: v.numpy() for k, v in b.items()} for b in ds])
        counts.append((ds.source.cache.hits, ds.source.cache.misses, ds.source.cache.held))
    return out, counts, ds


def test_kept_reads_yield_the_batches_of_fresh_reads_every_epoch(data):
    root, df, ref = data
    wf = make_workflow(0).fit(root, scheduler="sync")
    fresh, _, _ = epochs(root, wf)
    total = None
    for budget in (1 << 30, 12_000, 0):
        wf.cache_bytes = budget  # (read when a dataset is made)
        got, counts, ds = epochs(root, wf)
        for epoch, (mine, want) in enumerate(zip(got, fresh)):
            assert len(mine) == len(want)
            for b, w in zip(mine, want):
                assert b.keys() == w.keys()
                for k in b:
                    np.testing.assert_array_equal(b[k], w[k], err_msg=f"budget {budget}, epoch {epoch}, {k}")
            index = np.concatenate([b["index"] for b in mine])  # the pandas reference, window by window
            rows = index[:, None] + np.arange(WINDOW)  # (B, L)
            past = np.concatenate([b["past_cont"] for b in mine])
            np.testing.assert_allclose(past, ref[["value", "value_lag2"]].to_numpy()[rows].transpose(0, 2, 1),
                                       rtol=2e-6, atol=2e-6)  # fmt: skip
            cats = np.concatenate([b["past_cat"] for b in mine])
            np.testing.assert_array_equal(cats[:, 0], ref["kind"].to_numpy()[rows])
        hits, misses, held = counts[-1]
        assert held <= budget
        if budget == 0:
            assert hits == misses == held == 0
        elif budget == 1 << 30:
            total = held
            assert misses == counts[0][1] and hits >= 2 * misses  # the 2nd and 3rd epochs read nothing
        else:
            assert total is not None and 0 < held < total
            assert misses > counts[0][1] and hits > counts[0][0]  # some of the ranges kept, the rest read again


#: The columns ``read_rows`` reads: one input and one lag of it.
COLUMNS = ["value", "value_lag2"]


def read_rows(source) -> np.ndarray:
    """One pass's read of rows 100-250 of the first file through a workflow ``source`` (and its cache)."""
    read = source.reader([0], COLUMNS).read_rows(0, 100, 250)
    return np.stack([read[c] for c in COLUMNS])


def test_a_refit_workflow_reads_again(data, tmp_path):
    root, df, _ = data
    df.assign(value=df["value"] * 3 + 7).to_parquet(tmp_path / "other.parquet", index=False)
    wf = make_workflow(1 << 30).fit(root, scheduler="sync")
    source = WindowDataset(root, workflow=wf, window=WINDOW, batch_size=40).source

    first = read_rows(source)
    np.testing.assert_array_equal(read_rows(source), first)
    assert source.cache.hits == 1
    wf.fit(str(tmp_path), scheduler="sync")  # other statistics: other outputs
    refit = make_workflow(0).fit(str(tmp_path), scheduler="sync")
    want = WindowDataset(root, workflow=refit, window=WINDOW, batch_size=40).source.read_rows(0, COLUMNS, 100, 250)
    np.testing.assert_array_equal(read_rows(source), np.stack([want[c] for c in COLUMNS]))
    assert source.cache.hits == 1 and source.cache.misses == 2 and not np.array_equal(read_rows(source), first)


@pytest.mark.parametrize("cache_bytes", [1 << 30, 0])
@pytest.mark.parametrize("when", ["between epochs", "inside an epoch"])
def test_a_dataset_refuses_to_go_on_after_its_workflow_is_refit_in_place(data, tmp_path, cache_bytes, when):
    """Rows read ahead, resident across epochs or kept by the cache hold the old statistics: refused, and a
    dataset built after the refit yields the refit's values."""
    root, df, _ = data
    other = df.assign(value=df["value"] * 3 + 7)
    other.to_parquet(tmp_path / "other.parquet", index=False)
    wf = make_workflow(cache_bytes).fit(root, scheduler="sync")
    ds = WindowDataset(root, workflow=wf.named(index=True), window=WINDOW, horizon=HORIZON, batch_size=40, seed=2)
    it = iter(ds)
    next(it)
    if when == "between epochs":
        list(it)
        it = iter(ds)
    wf.fit(str(tmp_path), scheduler="sync")  # other statistics: other outputs
    with pytest.raises(ConfigError, match="fitted again after this WindowDataset was built.*build a new"):
        next(it)
    # a new dataset: the refit's statistics (per series: the mean and std of value * 3 + 7)
    batch = next(iter(WindowDataset(root, workflow=wf.named(index=True), window=WINDOW, horizon=HORIZON)))
    filled = other["value"].fillna(0.0)
    g = filled.groupby(other["sid"])
    want = ((df["value"].fillna(0.0) - g.transform("mean")) / g.transform("std")).to_numpy(np.float32)
    rows = batch["index"].numpy()[:, None] + np.arange(WINDOW)
    np.testing.assert_allclose(batch["past_cont"].numpy()[:, 0], want[rows], rtol=1e-5, atol=1e-5)


def test_reads_of_other_columns_are_kept_apart(data):
    root, _, ref = data
    source = WindowDataset(root, workflow=make_workflow(1 << 30).fit(root, scheduler="sync"), window=WINDOW).source
    assert set(source.read_rows(0, ["kind"], 100, 250)) == {"kind"}
    for _ in range(2):  # read, then kept
        both = source.read_rows(0, ["value", "kind"], 100, 250)
        assert set(both) == {"value", "kind"}
        np.testing.assert_allclose(both["value"], ref["value"].to_numpy()[100:250], rtol=2e-6, atol=2e-6)
    assert source.cache.hits == 1


def test_a_worker_starts_with_an_empty_cache_and_bytes_stay_in_budget():
    cache = TransformCache(1_000)
    for key in range(4):
        assert cache.find(key) is None
        cache.keep(key, {"x": np.zeros(100, np.float32)})  # 400 bytes: two fit, the others are not kept
    assert cache.held == 800 and cache.find(1) is not None and cache.find(2) is None
    x = np.zeros(100, np.float32)
    assert held_bytes({"a": x[10:], "b": x}) == 400  # a view counts as the array it views, once
    with pytest.raises(ValueError):
        cache.find(0)["x"][0] = 1.0  # kept arrays are read-only: a caller's change cannot reach the next read
    worker = pickle.loads(pickle.dumps(cache))
    assert (worker.budget, worker.held, worker.hits) == (1_000, 0, 0) and worker.find(0) is None
    worker.check("fitted", workers=2)  # one of a rank's 2 DataLoader workers: half the budget
    for key in range(2):
        worker.keep(key, {"x": np.zeros(100, np.float32)})
    assert worker.held == 400 <= worker.limit == 500


def test_persistent_workers_yield_the_batches_of_fresh_reads(data):
    root, _, _ = data
    fresh, _, _ = epochs(root, make_workflow(0).fit(root, scheduler="sync"), n=2)
    wf = make_workflow(1 << 30).fit(root, scheduler="sync")
    ds = WindowDataset(root, workflow=wf.named(index=True), window=WINDOW, horizon=HORIZON, batch_size=40, seed=2,
                       buffer_bytes=80_000)  # fmt: skip
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    for epoch, want in enumerate(fresh):
        ds.set_epoch(epoch)
        got = [{k: v.numpy() for k, v in b.items()} for b in loader]
        for k in want[0]:  # the same windows (the workers interleave their batches): in start-row order
            mine, theirs = (np.concatenate([b[k] for b in part]) for part in (got, want))
            order = [np.argsort(np.concatenate([b["index"] for b in part]), kind="stable") for part in (got, want)]
            np.testing.assert_array_equal(mine[order[0]], theirs[order[1]], err_msg=f"epoch {epoch}, {k}")


def test_cache_bytes_must_be_a_byte_count():
    with pytest.raises(ConfigError, match="cache_bytes=-1"):
        make_workflow(-1)
    wf = make_workflow(0)
    with pytest.raises(ConfigError, match="cache_bytes='1GB'"):
        wf.cache_bytes = "1GB"  # type: ignore[assignment]
    assert Workflow([Normalize(["v"])], continuous=["v"]).cache_bytes == 512 << 20


@pytest.mark.parametrize("disk", [False, True], ids=["memory", "memory and disk"])
def test_a_worker_forked_while_a_thread_holds_the_cache_lock_does_not_hang(tmp_path, disk):
    """A reader thread inside the cache at the moment a DataLoader worker forks: the worker's copy of the
    lock would stay held forever (only the forking thread lives on in the child)."""
    from helpers import exit_code_forked_while_held

    cache = TransformCache(1 << 20, str(tmp_path) if disk else None)
    cache.keep(("p", 0), {"x": np.arange(4.0)})
    code = exit_code_forked_while_held(cache._lock, _find_in_child, (cache,))  # as find/keep hold it
    assert code is not None, "the forked child waited on a lock held by a thread of its parent"
    assert code == 0


def _find_in_child(cache):
    found = cache.find(("p", 0))
    raise SystemExit(0 if found is not None and found["x"].tolist() == [0.0, 1.0, 2.0, 3.0] else 3)
