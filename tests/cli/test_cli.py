"""The ``dask-windows`` commands on real files: in this process through ``main``, and the console
entry point as a subprocess where the process itself is under test (exit status, output, limits)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from helpers import cli

import dask_windows as dw
from dask_windows.runtime.normalize import load_stats
from dask_windows.sources.manifest import MANIFEST_NAME

REPO = os.path.dirname(os.path.dirname(os.path.abspath(os.path.dirname(__file__))))
CLUSTER = ["--workers", "1", "--no-progress"]


def frame(seed: int = 0, num_series: int = 6) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(20, 200, num_series)
    out = pd.DataFrame(
        {
            "sid": np.repeat(np.arange(num_series) * 3 + 1, lengths),
            "ts": np.concatenate([rng.permutation(n) for n in lengths]),
            "a": rng.standard_normal(lengths.sum()),
            "b": rng.integers(0, 9, lengths.sum()),
        }
    )
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
    done = cli(
        "convert",
        str(root / "in-*.csv"),
        str(root / "out"),
        "--series",
        "sid",
        "--time",
        "ts",
        "--partition-size",
        "8KB",
        "--window",
        "16",
        "--workers",
        "1",
        process=True,
    )
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
    schema = {
        "type": "record",
        "name": "r",
        "fields": [
            {"name": "sid", "type": "long"},
            {"name": "ts", "type": "long"},
            {"name": "a", "type": "double"},
            {"name": "b", "type": "long"},
        ],
    }
    records = rows.to_dict("records")
    (tmp_path / "avro").mkdir()
    for k in range(3):
        with open(tmp_path / "avro" / f"in-{k}.avro", "wb") as out:
            fastavro.writer(out, fastavro.parse_schema(schema), records[k::3])
    done = cli(
        "convert",
        str(tmp_path / "avro"),
        str(tmp_path / "avro_out"),
        "--series",
        "sid",
        "--time",
        "ts",
        "--json",
        "--window",
        "8",
        "--stride",
        "2",
        *CLUSTER,
    )
    report = json.loads(done.stdout)
    want = pd.DataFrame.from_records(records[0::3] + records[1::3] + records[2::3])
    want = want.sort_values(["sid", "ts"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(read_dataset(str(tmp_path / "avro_out")), want, check_dtype=False)
    assert report["rows_in"] == report["rows_out"] == len(rows)
    assert report["series"] == 6 and report["windows_lost"] == 0
    assert report["workers_restarted"] == 0

    npy = tmp_path / "npy"
    npy.mkdir()
    for sid, group in rows.groupby("sid"):
        np.save(npy / f"sensor-{sid}.npy", group.sort_values("ts")[["a", "b"]].to_numpy())
    done = cli(
        "convert",
        str(npy),
        str(tmp_path / "npy_out"),
        "--series",
        "sensor",
        "--time",
        "step",
        "--npy-columns",
        "a,b",
        "--json",
        *CLUSTER,
    )
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
    targets = ["--targets", "b"] if horizon else []
    done = cli(
        "inspect", path, "--window", str(window), "--stride", str(stride), "--horizon", str(horizon), *targets, "--json"
    )
    report = json.loads(done.stdout)
    ds = dw.WindowDataset(
        path,
        features=["a"],
        series="sid",
        window=window,
        stride=stride,
        horizon=horizon,
        targets=["b"] if horizon else None,
    )
    assert report["windows"] == ds.num_windows
    assert report["partitions"] == len(ds.partitions) and report["runs_from"] == "manifest"
    text = cli(
        "inspect",
        path,
        "--window",
        str(window),
        "--stride",
        str(stride),
        "--horizon",
        str(horizon),
        "--features",
        "a",
        *targets,
    ).stdout
    assert f"{ds.num_windows:,}" in text and "loader memory" in text and "schema" in text


def test_stats_match_numpy(converted, tmp_path):
    root, rows, _ = converted
    done = cli("stats", str(root / "out"), "--features", "a", "b", "--out", str(tmp_path / "stats.json"), *CLUSTER)
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
    text = cli("bench", path, "--features", "a", "b", "--series", "sid", "--window", "16", "--batch-size", "32").stdout
    for figure in (
        "windows/s",
        "GB/s",
        "first batch",
        "waiting for batches",
        "reading partitions",
        "peak RSS",
        "(full epoch)",
        "where the time went",  # the dataset's telemetry (dask_windows.telemetry)
        "verdict",
        "gather",
    ):
        assert figure in text, text
    from dask_windows.sources.parquet.footer_index import INDEX_NAME

    assert (root / "out" / INDEX_NAME).exists()  # convert wrote the dataset index
    report = json.loads(
        cli(
            "bench",
            path,
            "--features",
            "a",
            "--targets",
            "b",
            "--series",
            "sid",
            "--window",
            "16",
            "--horizon",
            "2",
            "--num-workers",
            "1",
            "--max-batches",
            "3",
            "--batch-size",
            "8",
            "--json",
        ).stdout
    )
    assert report["batches"] == 3 and report["windows"] == 24
    assert report["windows_per_second"] > 0 and report["gb_per_second"] > 0
    assert 0 <= report["wait_share"] <= 1 and 0 <= report["read_share"] <= 1
    assert report["peak_rss_bytes"] > 0 and report["peak_worker_rss_bytes"] > 0
    # with a DataLoader worker the stages run there: the loop's wait is measured, the stages are not
    assert report["stats"]["batches"] == 3 and not report["stats"]["stages_seen"]


def test_bench_says_each_phase_on_stderr_and_its_advice_in_its_own_flags(converted):
    import io

    from dask_windows.cli.bench import bench
    from dask_windows.cli.commands import _bench_flags
    from dask_windows.runtime import telemetry

    root, _, _ = converted
    progress = io.StringIO()
    bench(str(root / "out"), features=["a"], series="sid", window=16, batch_size=32, max_batches=3, progress=progress)
    said = progress.getvalue()
    for phase in ("bench: opening", "bench: opened in", "waiting for the first batch", "first batch after", "done"):
        assert phase in said, said
    advice = list(telemetry._ADVICE.values())
    for text in map(_bench_flags, advice):
        assert "num_workers=" not in text and "buffer_partitions=" not in text and "prefetch_partitions=" not in text
        assert "(or `dask-windows bench`)" not in text  # bench never sends its user to itself
    assert "--num-workers 0" in _bench_flags(telemetry._ADVICE["workers"])


def test_errors_are_clear(converted, tmp_path):
    root, _, _ = converted
    src, out = str(root / "in-0.csv"), str(tmp_path / "new")
    done = cli("convert", src, out, "--series", "sid", "--time", "ts", "--format", "xls", expect=2)
    assert "invalid choice: 'xls'" in done.stderr
    done = cli(
        "convert",
        src,
        out,
        "--series",
        "sid",
        "--time",
        "ts",
        "--scheduler",
        "tcp://127.0.0.1:9",
        "--connect-timeout",
        "1s",
        expect=1,
    )
    assert done.stderr.startswith(
        "dask-windows convert: error: could not reach the Dask scheduler at tcp://127.0.0.1:9"
    )
    assert "leave out --scheduler" in done.stderr and "Traceback" not in done.stderr
    assert not os.path.exists(out)


def test_more_errors_in_process(converted, tmp_path, capsys):
    from dask_windows.cli import main

    root, _, _ = converted
    src, out = str(root / "in-0.csv"), str(tmp_path / "new")
    pd.DataFrame({"sid": [1, 1], "ts": ["x", "y"]}).to_csv(tmp_path / "text.csv", index=False)
    (tmp_path / "data.xyz").write_text("1")
    checks = [
        ([src, out, "--series", "nope", "--time", "ts"], "column 'nope' (--series) is not in"),
        ([src, out, "--series", "sid", "--time", "when"], "column 'when' (--time) is not in"),
        ([src, str(root / "out"), "--series", "sid", "--time", "ts"], "already exists; pass --overwrite"),
        ([str(tmp_path / "text.csv"), out, "--series", "sid", "--time", "ts"], "does not sort as time"),
        ([str(tmp_path / "data.xyz"), out, "--series", "s", "--time", "t"], "cannot tell the format"),
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
    assert "feature 'zz' is missing from" in capsys.readouterr().err
    assert not os.path.exists(out)


# ---------------------------------------------------------------- never destroys a user's files


def snapshot(root) -> dict:
    """Every file under ``root`` with its bytes."""
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as src:
                out[os.path.relpath(path, root)] = src.read()
    return out


def test_convert_refuses_to_replace_what_it_did_not_write(converted, tmp_path, capsys):
    root, rows, _ = converted
    proj = tmp_path / "proj"
    (proj / "raw").mkdir(parents=True)
    for i, part in enumerate(np.array_split(np.arange(len(rows)), 2)):
        rows.iloc[part].to_csv(proj / "raw" / f"in-{i}.csv", index=False)
    (proj / "notes.md").write_text("my notes")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "thesis.tex").write_text("years of work")
    import shutil

    shutil.copytree(root / "out", tmp_path / "old_out")  # a convert output ...
    (tmp_path / "old_out" / "notes.md").write_text("...holding a user's file")
    raw = str(proj / "raw")
    cases = [
        ([raw, str(proj)], "the output .*proj contains the input .*raw"),
        ([raw + "/in-0.csv", raw + "/in-1.csv"], "in-1.csv is a file, not a dataset folder"),
        ([raw, raw], "the output .*raw is the input"),
        ([raw + "/in-0.csv", raw + "/in-0.csv"], "is the input"),
        ([raw, raw + "/out"], "lies inside the input"),
        ([str(tmp_path / "other" / "*.csv"), str(tmp_path)], "contains the input"),
        ([raw, str(tmp_path / "other")], "is not a `dask-windows convert` output"),
        ([raw, str(tmp_path / "old_out")], "holds files convert did not write \\(notes.md\\)"),
    ]
    (tmp_path / "other" / "x.csv").write_text("sid,ts\n1,1\n")
    before = snapshot(tmp_path)
    for i, (argv, message) in enumerate(cases):
        args = ("convert", *argv, "--series", "sid", "--time", "ts", "--overwrite", *CLUSTER)
        err = cli(*args, expect=1, process=i == 0).stderr  # the first through the console entry point
        assert re.search(message, err), (argv, err)
        assert "whatever the flags" in err and "Traceback" not in err
    assert snapshot(tmp_path) == before  # nothing changed, nothing added


def test_mixed_schemas_are_refused_with_one_listing(tmp_path):
    base = pd.DataFrame({"sid": [1, 1, 2], "ts": [1, 2, 1], "a": [0.5, 1.5, 2.5]})
    base.to_csv(tmp_path / "in-0.csv", index=False)
    base.assign(extra=[7, 8, 9]).to_csv(tmp_path / "in-1.csv", index=False)
    base.drop(columns="a").to_csv(tmp_path / "in-2.csv", index=False)
    base.assign(sid=["x", "y", "z"]).to_csv(tmp_path / "in-3.csv", index=False)
    base.to_csv(tmp_path / "in-4.csv", index=False)
    done = cli(
        "convert",
        str(tmp_path / "in-*.csv"),
        str(tmp_path / "out"),
        "--series",
        "sid",
        "--time",
        "ts",
        *CLUSTER,
        expect=1,
    )
    err = done.stderr
    assert "do not share one schema" in err and "nothing was converted" in err
    assert "in-0.csv (and 1 more like it): sid: int64, a: double, extra: -" in err
    assert "in-1.csv: sid: int64, a: double, extra: int64" in err
    assert "in-2.csv: sid: int64, a: -, extra: -" in err
    assert "in-3.csv: sid: string, a: double, extra: -" in err
    pq_dir = tmp_path / "pq"
    pq_dir.mkdir()
    base.assign(ts=pd.to_datetime(base["ts"], unit="D")).to_parquet(pq_dir / "a.parquet")
    base.to_parquet(pq_dir / "b.parquet")
    err = cli(
        "convert", str(pq_dir), str(tmp_path / "out"), "--series", "sid", "--time", "ts", *CLUSTER, expect=1
    ).stderr
    assert re.search(r"a.parquet: ts: timestamp\[\w+\]", err) and "b.parquet: ts: int64" in err
    assert sorted(os.listdir(tmp_path)) == [f"in-{i}.csv" for i in range(5)] + ["pq"]


def test_iso_csv_times_parsed_and_leftovers_of_a_killed_run_removed(tmp_path):
    """One real run: ISO-8601 text times without --parse-time, a killed run's leftovers removed,
    a live run's folder kept, and --window longer than every series an error."""
    rows = frame(seed=3)
    rows["ts"] = pd.Timestamp("2024-03-01") + pd.to_timedelta(rows["ts"], unit="min")
    rows.to_csv(tmp_path / "in.csv", index=False)  # pandas writes "2024-03-01 00:07:00"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    killed = tmp_path / "out.tmp-0123456789ab"
    (killed / "_scratch").mkdir(parents=True)
    (killed / "part-00000.parquet").write_bytes(b"half written")
    (killed / "_dask_windows_convert_running.json").write_text(
        json.dumps({"pid": int(dead), "host": socket.gethostname()})
    )
    old_style = tmp_path / "out.tmp-00000000000f"  # left by 0.1, no marker
    old_style.mkdir()
    alive = tmp_path / "out.tmp-aaaaaaaaaaaa"
    alive.mkdir()
    (alive / "_dask_windows_convert_running.json").write_text(
        json.dumps({"pid": os.getpid(), "host": socket.gethostname()})
    )
    done = cli(
        "convert",
        str(tmp_path / "in.csv"),
        str(tmp_path / "out"),
        "--series",
        "sid",
        "--time",
        "ts",
        "--window",
        "5000",
        *CLUSTER,
        expect=1,
        process=True,  # the leftovers are reported through logging, set up once per process
    )
    assert "removed leftovers of an interrupted convert" in done.stderr
    assert str(killed) in done.stderr and str(old_style) in done.stderr
    assert "--window 5000 leaves 0 windows" in done.stderr and "longest: " in done.stderr
    assert sorted(os.listdir(tmp_path)) == ["in.csv", "out", "out.tmp-aaaaaaaaaaaa"]
    out = read_dataset(str(tmp_path / "out"))
    assert str(out["ts"].dtype).startswith("datetime64")
    want = rows.sort_values(["sid", "ts"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(out, want, check_dtype=False)
    assert out["sid"].dtype == np.int64  # the id keeps its type when times are parsed


def test_disk_full_names_the_path(tmp_path):
    import resource

    rng = np.random.default_rng(0)
    n = 40_000
    pd.DataFrame({"sid": np.repeat(np.arange(4), n // 4), "ts": np.arange(n), "a": rng.standard_normal(n)}).to_parquet(
        tmp_path / "in.parquet"
    )

    def small_files() -> None:  # writes past 200 kB fail with EFBIG, as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    env = dict(os.environ, PYTHONPATH=REPO)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dask_windows.cli",
            "convert",
            str(tmp_path / "in.parquet"),
            str(tmp_path / "out"),
            "--series",
            "sid",
            "--time",
            "ts",
            *CLUSTER,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        preexec_fn=small_files,
    )
    assert done.returncode == 1, done.stderr
    assert re.search(
        r"error: \[Errno 27\] File too large while writing (scratch|output) file "
        + re.escape(str(tmp_path / "out.tmp-")),
        done.stderr,
    ), done.stderr
    assert "free space there" in done.stderr and "Traceback" not in done.stderr
    assert sorted(os.listdir(tmp_path)) == ["in.parquet"]


# ---------------------------------------------------------------- says the same as the loader


@pytest.mark.parametrize(
    "options",
    [
        ["--window", "16"],
        ["--window", "10", "--stride", "3", "--horizon", "5", "--targets", "b"],
        ["--window", "12", "--nan", "drop"],
        ["--window", "4", "--partition-bytes", "1kB", "--on-error", "skip"],
    ],
)
def test_inspect_counts_equal_the_loaders(tmp_path, options):
    rows = frame(seed=4)
    rows.loc[rows.index[::37], "a"] = np.nan
    rows = rows.sort_values(["sid", "ts"])
    import pyarrow as pa
    import pyarrow.parquet as pq

    for i, part in enumerate(np.array_split(np.arange(len(rows)), 3)):
        pq.write_table(
            pa.Table.from_pandas(rows.iloc[part], preserve_index=False), tmp_path / f"p{i}.parquet", row_group_size=40
        )
    (tmp_path / "p9.parquet").write_bytes(b"corrupt")
    skip = "--on-error" in options
    if not skip:
        os.remove(tmp_path / "p9.parquet")
    flags = dict(zip(options[::2], options[1::2]))
    if flags.get("--nan", "raise") == "raise":
        # the data holds NaN in 'a': the loader rejects it when it reaches those windows, so inspect does too
        done = cli("inspect", str(tmp_path), "--series", "sid", "--features", "a", *options, "--json", expect=1)
        assert "NaN in column 'a'" in done.stderr and "--nan drop" in done.stderr, done.stderr
        options = [*options, "--nan", "drop"]
        flags["--nan"] = "drop"
    report = json.loads(cli("inspect", str(tmp_path), "--series", "sid", "--features", "a", *options, "--json").stdout)
    kwargs = {
        "window": int(flags["--window"]),
        "stride": int(flags.get("--stride", 1)),
        "horizon": int(flags.get("--horizon", 0)),
        "targets": flags.get("--targets"),
        "nan": flags.get("--nan", "raise"),
        "on_error": flags.get("--on-error", "raise"),
    }
    if "--partition-bytes" in flags:
        kwargs["partition_bytes"] = 1000
    ds = dw.WindowDataset(str(tmp_path), features=["a"], series="sid", **kwargs)
    assert report["windows"] == ds.num_windows
    if kwargs["nan"] == "drop":  # what the loader really yields
        assert ds.num_windows == sum(len(b[0] if isinstance(b, (tuple, list)) else b) for b in torch_batches(ds))
    assert len(report["skipped"]) == int(skip)


def torch_batches(ds) -> list:
    import torch

    return list(torch.utils.data.DataLoader(ds, batch_size=None))


def test_inspect_validates_like_the_loader_and_exits_1(converted, capsys):
    root, _, _ = converted
    path = str(root / "out")
    cases = [
        (["--features", "a", "e"], "feature 'e' is missing from"),
        (["--features", "a", "sid"], "--features: series='sid' is also a feature"),
        (["--batch-size", "0"], "--batch-size: batch_size=0 must be >= 1"),
        (["--horizon", "2"], "--horizon: horizon=2 needs --targets"),
        (["--window", "5000"], "no windows: window=5000 is longer than every series run"),
    ]
    for i, (extra, message) in enumerate(cases):
        args = ("inspect", path, "--window", "8", *extra)
        err = cli(*args, expect=1, process=i == 0).stderr  # the first through the console entry point
        assert message in err and err.startswith("dask-windows inspect: error:")
    with open(os.path.join(path, MANIFEST_NAME)) as src:
        longest = max(n for f in json.load(src)["files"] for n in (run[1] for run in f["runs"]))
    assert f"longest: {longest:,} rows" in err
    err = cli("bench", path, "--features", "a", "--series", "sid", "--window", "5000", expect=1).stderr
    assert "no windows: window=5000" in err
    pd.DataFrame({"sid": [1, 2], "ts": [1, 2], "x": [0.5, 1.5]}).to_parquet(root / "raw.parquet")
    err = cli("stats", str(root / "raw.parquet"), *CLUSTER, expect=1).stderr
    assert "an integer series id would be summarised" in err and "--series" in err


def test_version_global_flags_help_and_parse_errors(tmp_path, capsys):
    assert cli("--version", process=True).stdout.strip() == f"dask-windows {dw.__version__}"
    assert dw.__version__ == "0.2.0.dev0"
    from dask_windows.cli.main import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    assert "``" not in cli("convert", "--help").stdout
    for name, sub in commands.items():
        text = sub.format_help()
        assert "``" not in text and ":func:" not in text
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, (name, action.option_strings)
                if action.default not in (None, False) and action.nargs != 0:
                    assert "default" in action.help or action.default is not None
        assert "(default: 1)" in text or name in ("stats", "index", "fit")
    pd.DataFrame({"sid": [1, 1], "ts": [1, 2], "x": [0.5, 1.5]}).to_parquet(tmp_path / "d.parquet")
    from dask_windows.cli import main

    assert main(["inspect", str(tmp_path / "d.parquet"), "--series", "sid", "-v"]) == 0
    assert "rows" in capsys.readouterr().out  # -v after the command parses
    bad = [
        (
            ["convert", "a", "b", "--series", "s", "--time", "t", "--partition-size", "16XB"],
            "argument --partition-size: '16XB' is not a size",
        ),
        (
            ["convert", "a", "b", "--series", "s", "--time", "t", "--memory-limit", "lots"],
            "argument --memory-limit: 'lots' is not a memory",
        ),
        (["stats", "a", "--connect-timeout", "soon"], "argument --connect-timeout: 'soon'"),
        (["inspect", "a", "--num-workers", "-1"], "argument --num-workers: '-1' must be"),
        (["inspect", "a", "--window", "x"], "argument --window: invalid int value: 'x'"),
        (["inspect", "a", "--partition-bytes", "0"], "argument --partition-bytes: '0'"),
        (["inspect", "a", "--nan", "keep"], "argument --nan: invalid choice: 'keep'"),
        (
            ["bench", "a", "--features", "x", "--series", "s", "--window", "4", "--on-error", "ignore"],
            "argument --on-error: invalid choice",
        ),
    ]
    assert bad[0][1] in cli(*bad[0][0], expect=2).stderr
    for argv, message in bad:
        assert message in cli(*argv, expect=2).stderr
    # the loader's Python keyword becomes the CLI flag that sets it
    from dask_windows.cli.options import _cli_message

    assert "pass --on-error skip" in _cli_message("... or pass on_error='skip' to leave it out")
    assert "pass a larger --retries (" in _cli_message("pass a larger retries= (a file ...)")


def test_a_run_killed_while_swapping_outputs_is_repaired(converted, tmp_path):
    """``DST.old-*`` (killed between moving the old output away and the new one in) goes back
    to ``DST`` when it is the only copy, and is removed when ``DST`` is in place."""
    import shutil

    import fsspec

    from dask_windows.cli.safety import remove_leftovers

    root, _, _ = converted
    fs = fsspec.filesystem("file")
    dst = str(tmp_path / "out")
    shutil.copytree(root / "out", dst + ".old-00000000abcd")
    assert remove_leftovers(fs, dst) == [] and os.path.exists(os.path.join(dst, MANIFEST_NAME))
    assert not os.path.exists(dst + ".old-00000000abcd")
    shutil.copytree(root / "out", dst + ".old-00000000abce")
    (tmp_path / "out.old-notours").mkdir()  # not a name convert makes: left alone
    assert remove_leftovers(fs, dst) == [dst + ".old-00000000abce"]
    assert sorted(os.listdir(tmp_path)) == ["out", "out.old-notours"]


# -- issue 34, loud failures: remedies that fit converted data ------------------------------------------


def test_a_short_series_on_converted_data_is_not_told_to_join_files(converted, tmp_path):
    """Converted series are whole: the ShortSeriesWarning's remedy is a smaller window, or (past the span
    convert was run for, where a short run is a series' first chunk) converting again; never joining files."""
    import warnings

    rows = pd.concat(
        [
            pd.DataFrame({"sid": sid, "ts": np.arange(n), "a": np.arange(n, dtype=np.float64)})
            for sid, n in [(1, 5), (2, 60)]
        ]
    )
    rows.to_parquet(tmp_path / "in.parquet", index=False)
    cli("convert", str(tmp_path / "in.parquet"), str(tmp_path / "out"), "--series", "sid", "--time", "ts",
        "--window", "16", *CLUSTER)  # fmt: skip

    def short_warnings(root, window):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            ds = dw.WindowDataset(str(root), ["a"], window=window)
        return ds, [str(w.message) for w in got if type(w.message).__name__ == "ShortSeriesWarning"]

    ds, short = short_warnings(tmp_path / "out", 10)  # within convert's span: series 1 (5 rows) is short
    assert len(short) == 1 and ds.left_out.runs == 1 and ds.left_out.rows == 5, short
    assert "join a series" not in short[0] and "use a smaller window (these series are whole" in short[0]
    root, _, _ = converted
    ds, short = short_warnings(root / "out", 40)  # past it: first chunks of long series fall short
    assert short and "join a series" not in short[0], short
    assert "converted for window + horizon <= 16: re-run `dask-windows convert` with a --window" in short[0]


def test_inspect_past_the_converted_span_suggests_convert_window(converted):
    """Windows longer than convert's --window lose those across its chunk cuts: inspect says so and how to fix it."""
    root, _, _ = converted
    done = cli("inspect", str(root / "out"), "--window", "40")
    assert "left out at chunk cuts" in done.stdout, done.stdout
    line = next(line for line in done.stdout.splitlines() if line.startswith("left out at chunk cuts"))
    assert "converted for window + horizon <= 16" in line and "`dask-windows convert` with --window 40" in line
    import fsspec

    from dask_windows.sources.manifest import read_manifest, span_shortfall

    lost, total = span_shortfall(read_manifest(str(root / "out"), fsspec.filesystem("file")), 40, 1)
    assert f"{lost:,} of {total:,} windows" in line and lost > 0


def test_fit_on_a_folder_of_csv_files_names_convert(tmp_path):
    from dask_windows.errors import ConfigError
    from dask_windows.workflow.artifact import list_files

    raw = tmp_path / "raw"
    raw.mkdir()
    for i in range(2):
        frame(i).to_csv(raw / f"part-{i}.csv", index=False)
    with pytest.raises(ConfigError, match=r"no Parquet file found.*2 CSV files.*`dask-windows convert .*raw.* OUT"):
        list_files(str(raw))
    with pytest.raises(ConfigError, match="check the path"):  # nothing of a known format: the plain message
        list_files(str(tmp_path / "empty*"))
