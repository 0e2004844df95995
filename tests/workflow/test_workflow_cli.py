"""``dask-windows fit``: a JSON spec fitted on a cluster (by its address) equals the same workflow fitted in Python."""

from __future__ import annotations

import json

import numpy as np
import pytest
import statsmodels.datasets as smd

from dask_windows.cli import main
from dask_windows.cli.fit import load_spec
from dask_windows.workflow import Categorify, Normalize, Workflow

SPEC = {
    "series": "firm",
    "roles": {"continuous": ["invest", "value"], "categorical": ["company"], "target": ["invest"]},
    "ops": [
        {"kind": "normalize", "config": {"columns": ["invest"], "per_series": True}},
        {"kind": "log1p", "config": {"columns": ["value"]}},
        {"kind": "categorify", "config": {"columns": ["company"], "min_frequency": 1}},
    ],
}


def test_fit_command_writes_what_python_fits(tmp_path, capsys):
    df = smd.grunfeld.load_pandas().data
    df["firm"] = df["firm"].astype(str)
    df["company"] = df["firm"]
    for i, at in enumerate(range(0, len(df), 80)):
        df.iloc[at : at + 80].to_parquet(tmp_path / f"part{i}.parquet", index=False)
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    out = tmp_path / "wf.json"
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0") as cluster:
        code = main(["fit", str(tmp_path / "spec.json"), str(tmp_path), "--out", str(out), "--scheduler",
                     cluster.scheduler_address, "--no-progress", "--json"])  # fmt: skip
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"] == len(df) and report["partitions"] >= 1 and report["peak_rss_bytes"] > 0
    fitted = Workflow.load(str(out))
    ref = Workflow([Normalize(["invest"], per_series=True), Categorify(["company"])], series="firm",
                   continuous=["invest"], categorical=["company"]).fit(df, scheduler="sync")  # fmt: skip
    assert fitted.series_keys == ref.series_keys
    assert fitted.ops[2].state == ref.ops[1].state
    np.testing.assert_allclose(fitted.ops[0].state["invest"]["series"], ref.ops[0].state["invest"]["series"])
    g = df.groupby("firm")["invest"]
    np.testing.assert_allclose(np.array(fitted.ops[0].state["invest"]["series"])[:, 0], g.mean().sort_index())


def test_spec_files_and_their_errors(tmp_path):
    (tmp_path / "spec.py").write_text(
        "from dask_windows.workflow import Workflow, Log1p\nworkflow = Workflow([Log1p(['v'])], continuous=['v'])\n"
    )
    assert load_spec(str(tmp_path / "spec.py")).ops[0].columns == ("v",)
    (tmp_path / "empty.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="no Workflow named 'workflow'"):
        load_spec(str(tmp_path / "empty.py"))
    (tmp_path / "bad.json").write_text(
        json.dumps({"ops": [{"kind": "nope", "config": {}}], "roles": {"target": ["v"]}})
    )
    with pytest.raises(ValueError, match="unknown workflow operation 'nope'"):
        load_spec(str(tmp_path / "bad.json"))
