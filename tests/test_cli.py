"""The ``dask-windows`` console entry point, run as a subprocess on real files."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import dask_windows as dw
from dask_windows.sources.manifest import MANIFEST_NAME
from dask_windows.normalize import load_stats

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = ["--workers", "1", "--no-progress"]


def cli(*args: str, expect: int = 0) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run([sys.executable, "-m", "dask_windows.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == expect, done.stderr
    return done


def frame(seed: int = 0, num_series: int = 6) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(20, 200, num_series)
    out = pd.DataFrame({"sid": np.repeat(np.arange(num_series) * 3 + 1, lengths),
                        "ts": np.concatenate([rng.permutation(n) for n in lengths]),
                        "a": rng.standard_normal(lengths.sum()),
                        "b": rng.integers(0, 9, lengths.sum())})
    return out.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def read_dataset(path: str) -> pd.DataFrame:
    """The rows in canonical order (the spread layout's overlap rows counted once)."""
    from dask_windows.cli.layout import read_converted

    return read_converted(path)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A CSV input converted through the CLI (text output), with its source frame."""
    root = tmp_path_factory.mktemp("cli")
    rows = frame()
    for i, part in enumerate(np.array_split(np.arange(len(rows)), 3)):
        rows.iloc[part].to_csv(root / f"in-{i}.csv", index=False)
    done = cli("convert", str(root / "in-*.csv"), str(root / "out"), "--series", "sid",
               "--time", "ts", "--partition-size", "8KB", "--window", "16", "--workers", "1")
    return root, rows, done


def test_convert_csv_round_trips_every_row(converted):
    root, rows, done = converted
    want = rows.sort_values(["sid", "ts"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(read_dataset(str(root / "out")), want, check_dtype=False)
    for line in ("rows in", "rows out", "files", "series", "lost at file edges", "rows/s"):
        assert line in done.stdout
    assert f"{len(rows):,}" in done.stdout
    assert "counting rows per series" in done.stderr and "100% Completed" in done.stderr


def test_convert_avro_and_npy_round_trip(tmp_path):
    fastavro = pytest.importorskip("fastavro")
    rows = frame(seed=1)
    schema = {"type": "record", "name": "r", "fields": [
        {"name": "sid", "type": "long"}, {"name": "ts", "type": "long"},
        {"name": "a", "type": "double"}, {"name": "b", "type": "long"}]}
    records = rows.to_dict("records")
    for k in range(3):
        with open(tmp_path / f"in-{k}.avro", "wb") as out:
            fastavro.writer(out, fastavro.parse_schema(schema), records[k::3])
    done = cli("convert", str(tmp_path), str(tmp_path / "avro_out"), "--series", "sid",
               "--time", "ts", "--json", "--window", "8", "--stride", "2", *CLUSTER)
    report = json.loads(done.stdout)
    want = pd.DataFrame.from_records(records[0::3] + records[1::3] + records[2::3])
    want = want.sort_values(["sid", "ts"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(read_dataset(str(tmp_path / "avro_out")), want,
                                  check_dtype=False)
    assert report["rows_in"] == report["rows_out"] == len(rows)
    assert report["series"] == 6 and report["windows_lost"] == 0
    assert report["workers_restarted"] == 0

    npy = tmp_path / "npy"
    npy.mkdir()
    for sid, group in rows.groupby("sid"):
        np.save(npy / f"sensor-{sid}.npy", group.sort_values("ts")[["a", "b"]].to_numpy())
    done = cli("convert", str(npy), str(tmp_path / "npy_out"), "--series", "sensor",
               "--time", "step", "--npy-columns", "a,b", "--json", *CLUSTER)
    out = read_dataset(str(tmp_path / "npy_out"))
    want = rows.assign(sensor="sensor-" + rows["sid"].astype(str))  # sorted as text
    want = want.sort_values(["sensor", "ts"]).reset_index(drop=True)
    np.testing.assert_array_equal(out[["a", "b"]].to_numpy(), want[["a", "b"]].to_numpy())
    assert out["sensor"].tolist() == want["sensor"].tolist()
    assert json.loads(done.stdout)["rows_out"] == len(rows)


@pytest.mark.parametrize("window,stride,horizon", [(16, 1, 0), (10, 3, 5)])
def test_inspect_counts_equal_window_dataset(converted, window, stride, horizon):
    root, _, _ = converted
    path = str(root / "out")
    done = cli("inspect", path, "--window", str(window), "--stride", str(stride),
               "--horizon", str(horizon), "--json")
    report = json.loads(done.stdout)
    ds = dw.WindowDataset(path, features=["a"], series="sid", window=window, stride=stride,
                          horizon=horizon, targets=["b"] if horizon else None)
    assert report["windows"] == ds.num_windows
    assert report["partitions"] == len(ds.partitions) and report["runs_from"] == "manifest"
    text = cli("inspect", path, "--window", str(window), "--stride", str(stride),
               "--horizon", str(horizon), "--features", "a").stdout
    assert f"{ds.num_windows:,}" in text and "loader memory" in text and "schema" in text


def test_stats_match_numpy(converted, tmp_path):
    root, rows, _ = converted
    done = cli("stats", str(root / "out"), "--features", "a", "b", "--out",
               str(tmp_path / "stats.json"), *CLUSTER)
    doc = json.load(open(tmp_path / "stats.json"))
    for name in ("a", "b"):
        values = rows[name].to_numpy(np.float64)
        got = doc["features"][name]
        assert got["count"] == len(values) and got["nan_count"] == 0
        assert got["mean"] == pytest.approx(values.mean(), rel=1e-12)
        assert got["std"] == pytest.approx(values.std(), rel=1e-10)
        assert (got["min"], got["max"]) == (values.min(), values.max())
        assert name in done.stdout
    mean, std = load_stats(str(tmp_path / "stats.json"), ["b", "a"])
    assert mean.dtype == np.float32 and mean[0] == np.float32(rows["b"].mean())


def test_bench_prints_its_figures(converted):
    root, _, _ = converted
    path = str(root / "out")
    text = cli("bench", path, "--features", "a", "b", "--series", "sid", "--window", "16",
               "--batch-size", "32").stdout
    for figure in ("windows/s", "GB/s", "first batch", "waiting for batches",
                   "reading partitions", "peak RSS", "(full epoch)"):
        assert figure in text, text
    report = json.loads(cli("bench", path, "--features", "a", "--targets", "b", "--series",
                            "sid", "--window", "16", "--horizon", "2", "--num-workers", "1",
                            "--max-batches", "3", "--batch-size", "8", "--json").stdout)
    assert report["batches"] == 3 and report["windows"] == 24
    assert report["windows_per_second"] > 0 and report["gb_per_second"] > 0
    assert 0 <= report["wait_share"] <= 1 and 0 <= report["read_share"] <= 1
    assert report["peak_rss_bytes"] > 0 and report["peak_worker_rss_bytes"] > 0


def test_errors_are_clear(converted, tmp_path):
    root, _, _ = converted
    src, out = str(root / "in-0.csv"), str(tmp_path / "new")
    done = cli("convert", src, out, "--series", "sid", "--time", "ts", "--format", "xls",
               expect=2)
    assert "invalid choice: 'xls'" in done.stderr
    done = cli("convert", src, out, "--series", "sid", "--time", "ts", "--scheduler",
               "tcp://127.0.0.1:9", "--connect-timeout", "1s", expect=1)
    assert done.stderr.startswith("dask-windows convert: error: could not reach the Dask "
                                  "scheduler at tcp://127.0.0.1:9")
    assert "leave out --scheduler" in done.stderr and "Traceback" not in done.stderr
    assert not os.path.exists(out)


def test_more_errors_in_process(converted, tmp_path, capsys):
    from dask_windows.cli import main

    root, _, _ = converted
    src, out = str(root / "in-0.csv"), str(tmp_path / "new")
    pd.DataFrame({"sid": [1, 1], "ts": ["x", "y"]}).to_csv(tmp_path / "text.csv", index=False)
    (tmp_path / "data.xyz").write_text("1")
    checks = [
        ([src, out, "--series", "nope", "--time", "ts"],
         "column 'nope' (--series) is not in"),
        ([src, out, "--series", "sid", "--time", "when"], "column 'when' (--time) is not in"),
        ([src, str(root / "out"), "--series", "sid", "--time", "ts"],
         "already exists; pass --overwrite"),
        ([str(tmp_path / "text.csv"), out, "--series", "sid", "--time", "ts"],
         "does not sort as time"),
        ([str(tmp_path / "data.xyz"), out, "--series", "s", "--time", "t"],
         "cannot tell the format"),
        ([str(tmp_path / "missing.csv"), out, "--series", "s", "--time", "t"], "does not exist"),
    ]
    for argv, message in checks:
        assert main(["convert", *argv, "--no-progress"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("dask-windows convert: error: ") and message in err, err
    (tmp_path / "empty").mkdir()
    assert main(["inspect", str(tmp_path / "empty")]) == 1
    assert "no Parquet files" in capsys.readouterr().err
    assert main(["stats", str(root / "out"), "--features", "zz", "--no-progress"]) == 1
    assert "features ['zz'] are not in" in capsys.readouterr().err
    assert not os.path.exists(out)
