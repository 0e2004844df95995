"""Every ```python block of docs/frameworks.md runs (blocks after a `<!-- no-run: ... -->` line are skipped)."""

from __future__ import annotations

import os
import re

import numpy as np
import pandas as pd
import pytest

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "frameworks.md")
BLOCK = re.compile(r"(<!-- no-run: (?P<reason>[^>]*) -->\n)?```python\n(?P<code>.*?)```", re.S)


def blocks() -> list[tuple[str | None, str]]:
    with open(DOC) as f:
        return [(m["reason"], m["code"]) for m in BLOCK.finditer(f.read())]


def write_sensors(root: str) -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(150, 250, 6)
    frame = pd.DataFrame({"sensor_id": np.repeat(np.arange(6), lengths)})
    for column in ("a", "b", "y"):
        frame[column] = rng.standard_normal(len(frame)).astype(np.float32)
    os.makedirs(root)
    for k, part in enumerate(np.array_split(np.arange(len(frame)), 3)):
        frame.iloc[part].to_parquet(os.path.join(root, f"part-{k}.parquet"), index=False)


def test_no_run_blocks_say_why():
    found = blocks()
    assert len(found) >= 8
    assert all(reason is None or len(reason.strip()) > 20 for reason, _ in found)


def test_every_runnable_block_runs(tmp_path, monkeypatch):
    for name in ("lightning", "fastai.learner", "polars", "datasets", "deltalake", "torchdata"):
        pytest.importorskip(name, reason=f"the docs use {name}: pip install {name.split('.')[0]}")
    write_sensors(str(tmp_path / "sensors"))
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    ran = 0
    for reason, code in blocks():
        if reason is None:
            exec(compile(code, f"{DOC}:block{ran}", "exec"), namespace)
            ran += 1
    assert ran >= 6
