"""Issue 23's data cases: no part rewritten, cache entry exchanged, in-memory dtype or short series slips through.

Each test builds the hostile state on small data and checks the error (naming the file, column or
setting and the remedy) or the counted warning, against what the data holds.
"""

from __future__ import annotations

import json
import os

import dask
import numpy as np
import pandas as pd
import pytest

import dask_windows as dw
from dask_windows.cli.convert import convert
from dask_windows.sources.manifest import MANIFEST_NAME


@pytest.fixture
def _sync_scheduler():
    with dask.config.set(scheduler="sync"):
        yield


# -- item 2: a converted part rewritten with the same row count ---------------------------------------


def _converted(tmp_path) -> tuple[str, list]:
    n = 3000
    frame = pd.DataFrame({"sid": np.repeat([0, 1, 2], n), "ts": np.tile(np.arange(n), 3)})
    frame["v"] = (frame["sid"] * 10_000 + frame["ts"]).astype(np.float64)
    src = tmp_path / "in"
    src.mkdir()
    frame.sample(frac=1.0, random_state=0).to_parquet(src / "p.parquet", index=False)
    out = str(tmp_path / "out")
    convert([str(src)], out, series="sid", time="ts", partition_size="20KB", window=8)
    parts = sorted(p for p in os.listdir(out) if p.endswith(".parquet"))
    return out, parts


@pytest.mark.usefixtures("_sync_scheduler")
def test_a_spread_part_rewritten_with_the_same_rows_raises(tmp_path):
    out, parts = _converted(tmp_path)
    assert len(parts) >= 3
    dw.WindowDataset(out, ["v"], series="sid", window=8)  # opens as converted
    path = os.path.join(out, parts[1])
    part = pd.read_parquet(path)
    part.iloc[::-1].to_parquet(path, index=False)  # same rows, same row count, other order
    assert len(pd.read_parquet(path)) == len(part)
    with pytest.raises(dw.DataError, match=rf"{parts[1]} does not match the manifest.*bytes.*rerun `dask-windows convert`"):
        dw.WindowDataset(out, ["v"], series="sid", window=8)
    # the same size as recorded (the manifest's byte count set to today's): the footer still tells
    manifest_path = os.path.join(out, MANIFEST_NAME)
    manifest = json.load(open(manifest_path))
    entry = next(f for f in manifest["files"] if f["path"] == parts[1])
    entry["bytes"] = os.path.getsize(path)
    json.dump(manifest, open(manifest_path, "w"))
    with pytest.raises(dw.DataError, match=rf"{parts[1]} .*its Parquet footer differs.*rerun `dask-windows convert`"):
        dw.WindowDataset(out, ["v"], series="sid", window=8)
    # a manifest written before footers were recorded keeps the size check only (and opens)
    del entry["footer"]
    json.dump(manifest, open(manifest_path, "w"))
    dw.WindowDataset(out, ["v"], series="sid", window=8)
