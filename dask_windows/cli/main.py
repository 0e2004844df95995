"""The ``dask-windows`` command line: convert, inspect, stats, bench.

Heavy lifting (convert, stats) runs on Dask: a ``LocalCluster`` of worker
processes by default, or any running cluster given by ``--scheduler``.
``inspect`` reads metadata only and ``bench`` drives a ``WindowDataset``
through a ``torch.utils.data.DataLoader`` in this process, so neither starts a
cluster. Results go to stdout (``--json`` for a machine-readable form);
progress bars, logs and errors go to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time as clock
from collections.abc import Sequence
from typing import Any

from dask_windows.cli.bench import bench  # imports torch only when called
from dask_windows.cli.options import (
    _cli_message,
    _cluster_options,
    _Formatter,
    _global_options,
    _loader_options,
    _paragraphs,
    _parsed,
    _size_arg,
    _window_options,
)

__all__ = ["bench", "build_parser", "main"]

logger = logging.getLogger(__name__)


def _size(num_bytes: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(num_bytes) < 1000 or unit == "TB":
            return f"{num_bytes:,.0f} {unit}" if unit == "B" else f"{num_bytes:,.1f} {unit}"
        num_bytes /= 1000
    return ""  # unreachable


def _figure(value: float) -> str:
    """A measured figure with 3 significant digits: small values are never shown as 0."""
    if value == 0 or abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _table(rows: Sequence[tuple[str, Any]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


# ---------------------------------------------------------------- cluster


def _memory_limit_bytes(memory_limit: str) -> int | None:
    from dask.utils import parse_bytes

    return None if memory_limit == "auto" else parse_bytes(memory_limit)


def _input_block_size(memory_limit: str) -> int:
    """Bytes of input per task: 64 MiB, less on small local workers."""
    limit = _memory_limit_bytes(memory_limit)
    return 64 * 2**20 if limit is None else int(min(64 * 2**20, max(2**20, limit / 32)))


class _Cluster:
    """Starts a LocalCluster (or connects to ``--scheduler``) on the first compute.

    Starting late means bad arguments and inputs fail in a second, before any
    worker process exists. On exit it notes workers that were restarted
    (usually killed for exceeding ``--memory-limit``), then closes everything.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.client: Any = None
        self.workers_restarted = 0
        self._pids: dict = {}
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> _Cluster:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            if self.client is not None and exc_info[0] is None:
                pids = self.client.run(os.getpid)
                self.workers_restarted = len(set(self._pids.items()) - set(pids.items()))
        finally:
            self._stack.close()

    def _start(self) -> Any:
        from distributed import Client, LocalCluster

        args = self.args
        quiet = args.verbose < 2
        if quiet:  # distributed sets its loggers' levels when imported
            for noisy in ("distributed", "tornado", "bokeh"):
                logging.getLogger(noisy).setLevel(logging.ERROR)
        if args.scheduler:
            try:
                client = Client(args.scheduler, timeout=args.connect_timeout)
            except Exception as exc:  # refused, timed out, or not a Dask scheduler at all
                raise ConnectionError(
                    f"could not reach the Dask scheduler at {args.scheduler} "
                    f"({type(exc).__name__}: {exc}); check the address and that the "
                    f"scheduler is running, or leave out --scheduler to start a local "
                    f"cluster"
                ) from exc
        else:
            cluster = self._stack.enter_context(
                LocalCluster(
                    n_workers=args.workers,
                    threads_per_worker=args.threads_per_worker,
                    memory_limit=args.memory_limit,
                    processes=True,
                    dashboard_address=":0",
                    silence_logs=logging.CRITICAL if quiet else logging.INFO,
                    local_directory=args.local_directory,
                )
            )
            client = Client(cluster)
        self.client = self._stack.enter_context(client)
        self._pids = self.client.run(os.getpid)
        logger.info("Dask cluster: %s", self.client)
        return self.client

    def compute(self, label: str, *collections: Any) -> tuple:
        """Compute ``collections`` on the cluster, with a progress bar on stderr."""
        client = self.client or self._start()
        futures = client.compute(list(collections))
        if not self.args.no_progress:
            from distributed import progress

            print(label, file=sys.stderr, flush=True)
            with contextlib.redirect_stdout(sys.stderr):
                progress(futures)
            print(file=sys.stderr, flush=True)
        try:
            return tuple(client.gather(futures))
        except Exception as exc:
            if type(exc).__name__ != "KilledWorker":
                raise
            raise MemoryError(
                f"Dask workers kept dying while {label} ({exc}); they usually exceed their "
                f"memory limit: raise --memory-limit, use fewer --threads-per-worker or a "
                f"smaller --partition-size"
            ) from exc


# ---------------------------------------------------------------- commands


def _bytes(text: str | None) -> int | None:
    from dask.utils import parse_bytes

    return None if text is None else int(parse_bytes(text))


def _cmd_convert(args: argparse.Namespace) -> dict:
    from dask.utils import parse_bytes

    from dask_windows.cli.convert import convert
    from dask_windows.cli.summary import manifest_windows

    started = clock.perf_counter()
    with _Cluster(args) as cluster:
        report = convert(
            args.src,
            args.dst,
            series=args.series,
            time=args.time,
            fmt=args.format,
            partition_size=int(parse_bytes(args.partition_size)),
            overwrite=args.overwrite,
            parse_time=args.parse_time,
            compression=args.compression,
            input_block_size=_input_block_size(args.memory_limit),
            npy_columns=args.npy_columns.split(",") if args.npy_columns else None,
            compute=cluster.compute,
            layout=args.layout,
            window=args.window,
            horizon=args.horizon,
            chunk_rows=args.chunk_rows,
        )
    seconds = clock.perf_counter() - started
    out = {k: v for k, v in report.__dict__.items() if k != "manifest"}
    out.update(seconds=round(seconds, 3), workers_restarted=cluster.workers_restarted)
    out["leftovers_removed"] = list(out.get("leftovers_removed", ()))
    if args.window is not None:
        kept, lost = manifest_windows(report.manifest, args.window, args.stride, args.horizon)
        out.update(window=args.window, stride=args.stride, horizon=args.horizon, windows=kept, windows_lost=lost)
        if kept == 0:
            longest = max((n for f in report.manifest["files"] for n in (run[1] for run in f["runs"])), default=0)
            span = args.window + args.horizon
            raise ValueError(
                f"--window {args.window}"
                + (f" + --horizon {args.horizon}" if args.horizon else "")
                + f" leaves 0 windows: every series run in {args.dst} is shorter than {span} "
                f"rows (longest: {longest:,} rows); the dataset was written, but use a smaller "
                f"window (or a larger --partition-size if series were cut into files)"
            )
    if args.json:
        return out
    rows = [
        ("output", args.dst),
        ("rows in", f"{out['rows_in']:,}"),
        ("rows out", f"{out['rows_out']:,}"),
        (
            "files",
            f"{out['files']:,} ({_size(out['bytes_out'])}, {_size(out['bytes_out'] / max(out['files'], 1))} mean)",
        ),
        ("series", f"{out['series']:,} ({out['split_series']:,} split across files)"),
    ]
    if "windows" in out:
        lost = out["windows_lost"] / max(out["windows"] + out["windows_lost"], 1)
        rows.append(
            (
                f"windows (window={args.window}, stride={args.stride}, horizon={args.horizon})",
                f"{out['windows']:,} kept, {out['windows_lost']:,} lost at file edges ({lost:.3%})",
            )
        )
    rows.append(("time", f"{seconds:.1f} s ({out['rows_in'] / seconds:,.0f} rows/s)"))
    for path in out["leftovers_removed"]:
        rows.append(("removed", f"{path} (left by an interrupted convert)"))
    if out["workers_restarted"]:
        rows.append(
            (
                "warning",
                f"{out['workers_restarted']} Dask workers were restarted (out of memory?); the output is complete",
            )
        )
    return {"text": _table(rows)}


def _cmd_inspect(args: argparse.Namespace) -> dict:
    from dask_windows.cli.summary import inspect_dataset

    out = inspect_dataset(
        args.path,
        series=args.series,
        window=args.window,
        stride=args.stride,
        horizon=args.horizon,
        features=args.features,
        targets=args.targets,
        batch_size=args.batch_size,
        buffer_partitions=args.buffer_partitions,
        prefetch_partitions=args.prefetch_partitions,
        num_workers=args.num_workers,
        nan=args.nan,
        on_error=args.on_error,
        partition_bytes=_bytes(args.partition_bytes),
        retries=args.retries,
    )
    if args.mixing:
        from dask_windows.mixing import inspect_mixing

        out["mixing"] = inspect_mixing(
            args.path,
            out,
            batch_size=args.batch_size,
            buffer_partitions=args.buffer_partitions,
            pieces_per_partition=args.pieces_per_partition,
        )
    if args.json:
        return out
    rows = [
        ("path", out["path"]),
        ("files", f"{out['files']:,}"),
        ("partitions", f"{out['partitions']:,} (largest {out['largest_partition_rows']:,} rows)"),
        ("rows", f"{out['rows']:,}"),
    ]
    if out["bytes"] is not None:
        rows.append(("bytes", _size(out["bytes"])))
    if out["series"] is not None:
        rows.append(
            (
                "series",
                f"{out['series']:,} in column {out['series_column']!r} "
                f"({out['runs']:,} runs, from the {out['runs_from']})",
            )
        )
    else:
        rows.append(("series", "no series column: each partition is one run (pass --series)"))
    schema = ", ".join(f"{k}: {v}" for k, v in out["schema"].items())
    rows.append(("schema", schema))
    if out["skipped"]:
        rows.append(
            (
                "skipped",
                f"{len(out['skipped']):,} unreadable partitions "
                f"(--on-error skip): {', '.join(out['skipped'][:3])}" + (", ..." if len(out["skipped"]) > 3 else ""),
            )
        )
    if "windows" in out:
        mem = out["memory"]
        nan = ", nan=drop" if out["nan"] == "drop" else ""
        rows.append(
            (
                f"windows (window={out['window']}, stride={out['stride']}, horizon={out['horizon']}{nan})",
                f"{out['windows']:,}",
            )
        )
        rows.append(
            (
                f"loader memory (buffer={args.buffer_partitions}, "
                f"prefetch={args.prefetch_partitions}, batch={args.batch_size}, "
                f"C={len(out['features'])})",
                f"{_size(mem['per_process'])} per process x {mem['processes']} = "
                f"{_size(mem['total'])} (partitions {_size(mem['partitions'])}, "
                f"window index {_size(mem['window_index'])}, "
                f"batches {_size(mem['batches'])})",
            )
        )
    rows.append(("time", f"{out['seconds']:.3f} s"))
    if args.mixing:
        from dask_windows.mixing import format_report

        return {"text": _table(rows) + "\n\nmixing\n" + format_report(out["mixing"])}
    return {"text": _table(rows)}


def _cmd_stats(args: argparse.Namespace) -> dict:
    from dask_windows.cli.summary import compute_stats

    with _Cluster(args) as cluster:
        doc = compute_stats(
            args.path, args.features, fmt=args.format, series=args.series, time=args.time, compute=cluster.compute
        )
    if args.out:
        import fsspec

        with fsspec.open(args.out, "w") as out:
            json.dump(doc, out, indent=1)
    if args.json:
        return doc
    width = max([len("feature"), *map(len, doc["features"])])
    lines = [f"{'feature':<{width}} {'count':>11} {'mean':>13} {'std':>13} {'min':>13} {'max':>13} {'nan':>9}"]
    for name, s in doc["features"].items():
        nums = " ".join(f"{s[k]:>13.6g}" if s[k] is not None else f"{'-':>13}" for k in ("mean", "std", "min", "max"))
        lines.append(f"{name:<{width}} {s['count']:>11,} {nums} {s['nan_count']:>9,}")
    text = "\n".join(lines) + f"\nrows: {doc['rows']:,}"
    return {"text": text + (f"\nwritten to {args.out}" if args.out else "")}


def _cmd_bench(args: argparse.Namespace) -> dict:
    out = bench(
        args.path,
        features=args.features,
        series=args.series,
        window=args.window,
        stride=args.stride,
        horizon=args.horizon,
        targets=args.targets,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        buffer_partitions=args.buffer_partitions,
        prefetch_partitions=args.prefetch_partitions,
        max_batches=args.max_batches,
        seconds=args.seconds,
        step_ms=args.step_ms,
        nan=args.nan,
        on_error=args.on_error,
        partition_bytes=_bytes(args.partition_bytes),
        retries=args.retries,
        progress=None if args.no_progress else sys.stderr,
    )
    if args.json:
        return out
    settings = ", ".join(f"{k}={v}" for k, v in out["settings"].items())
    rss = _size(out["peak_rss_bytes"])
    if out["peak_worker_rss_bytes"] is not None:
        rss += f" (largest worker {_size(out['peak_worker_rss_bytes'])})"
    rows = [
        ("path", out["path"]),
        ("settings", settings),
        (
            "dataset",
            f"{out['partitions']:,} partitions, {out['num_windows']:,} windows, "
            f"{out['batches_per_epoch']:,} batches/epoch (opened in "
            f"{out['open_seconds']:.2f} s)",
        ),
        (
            "measured",
            f"{out['batches']:,} batches, {out['windows']:,} windows in "
            f"{out['seconds']:.2f} s" + (" (full epoch)" if out["epoch_done"] else ""),
        ),
        ("windows/s", _figure(out["windows_per_second"])),
        ("GB/s", f"{_figure(out['gb_per_second'])} (batch tensors)"),
        ("first batch", f"{_figure(out['first_batch_seconds'])} s"),
        ("waiting for batches", f"{out['wait_share']:.1%} of the time"),
        ("reading partitions", f"{out['read_share']:.1%} of loader time"),
        ("peak RSS", rss),
    ]
    return {"text": _table(rows)}


# ---------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``dask-windows``."""
    from dask_windows import __version__
    from dask_windows.cli.readers import FORMATS

    parser = argparse.ArgumentParser(
        prog="dask-windows",
        formatter_class=_Formatter,
        description=_paragraphs(
            "Convert, inspect, summarise and benchmark time-series datasets for "
            "dask_windows.\n\nconvert and stats run on Dask (a LocalCluster, or "
            "--scheduler); inspect and bench open a WindowDataset in this process. "
            "Results go to stdout (--json for JSON); progress and errors to stderr."
        ),
        epilog="Run 'dask-windows COMMAND --help' for a command's options. Exit status: 0 ok, 1 failed, 2 bad usage.",
    )
    parser.add_argument(
        "--version", action="version", version=f"dask-windows {__version__}", help="print the version and exit"
    )
    _global_options(parser, sub=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=summary,
            description=_paragraphs(f"{summary[0].upper()}{summary[1:]}.\n\n{description}"),
            formatter_class=_Formatter,
        )
        _global_options(p, sub=True)
        return p

    p = command(
        "convert",
        "turn Parquet/CSV/Avro/npy files into a sorted, series-aligned Parquet dataset with a manifest",
        "DST must be new, an empty folder, or (with --overwrite) an earlier convert "
        "output; convert never replaces anything else and never writes over, into "
        "or around its inputs. Leftovers of a killed run (DST.tmp-*) are removed.",
    )
    p.add_argument("src", nargs="+", metavar="SRC", help="input files, folders or globs")
    p.add_argument("dst", metavar="DST", help="output folder")
    p.add_argument("--series", required=True, metavar="COL", help="the series column (required)")
    p.add_argument(
        "--time",
        required=True,
        metavar="COL",
        help="the time column (required): numbers, datetimes, or ISO-8601 text in CSV",
    )
    p.add_argument("--format", choices=FORMATS, help="input format (default: from file extensions)")
    p.add_argument(
        "--partition-size",
        default="256MB",
        metavar="BYTES",
        type=_parsed("size", _size_arg),
        help="target size of each output file",
    )
    p.add_argument(
        "--compression",
        default="snappy",
        metavar="CODEC",
        help="Parquet compression codec (snappy, zstd, gzip, none, ...)",
    )
    p.add_argument(
        "--parse-time",
        action="store_true",
        help="parse a text time column with pandas.to_datetime (ISO-8601 text in CSV is parsed without it)",
    )
    p.add_argument(
        "--npy-columns", metavar="A,B,..", help="names of the columns of plain .npy arrays (default: f0, f1, ...)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace DST when it is an earlier convert output")
    _window_options(p)
    p.add_argument(
        "--layout",
        choices=("spread", "contiguous"),
        default="spread",
        help="spread: each series in chunks over all files, overlapping by window + "
        "horizon - 1 rows (128 without --window), so a few files mix like the "
        "whole dataset; contiguous: files in (series, time) order",
    )
    p.add_argument("--chunk-rows", type=int, metavar="N", help="rows per chunk (default: about 512 chunks per file)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    _cluster_options(p)
    p.set_defaults(run=_cmd_convert)

    p = command(
        "inspect",
        "files, rows, series, schema, windows and loader memory of a Parquet dataset",
        "Opens the WindowDataset these options describe, so the checks, errors and "
        "window counts are the loader's own. No Dask cluster is started.",
    )
    p.add_argument("path", metavar="PATH", help="dataset folder, Parquet file or glob")
    p.add_argument("--series", metavar="COL", help="the series column (default: the manifest's; none without one)")
    _window_options(p)
    p.add_argument(
        "--features",
        nargs="+",
        metavar="COL",
        help="columns stacked as x (default: every numeric column but series, time and targets)",
    )
    _loader_options(p)
    p.add_argument(
        "--mixing",
        action="store_true",
        help="how well batches mix, beside a global shuffle (needs --window; reads no data)",
    )
    p.add_argument(
        "--pieces-per-partition",
        type=int,
        default=None,
        metavar="K",
        help="the loader's mixing knob (default: the loader's)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=_cmd_inspect)

    p = command(
        "stats",
        "per-feature count, mean, std, min, max and NaNs in one Dask pass",
        "The output file is what WindowDataset(normalize=FILE) reads.",
    )
    p.add_argument("path", nargs="+", metavar="PATH", help="dataset folder, files or globs")
    p.add_argument(
        "--features",
        nargs="+",
        metavar="COL",
        help="columns to summarise (default: every numeric column but the series and time columns)",
    )
    p.add_argument(
        "--series",
        metavar="COL",
        help="the series column, never a feature (default: the manifest's; without a manifest give it or --features)",
    )
    p.add_argument("--time", metavar="COL", help="the time column, never a feature (default: the manifest's)")
    p.add_argument("--format", choices=FORMATS, help="input format (default: from file extensions)")
    p.add_argument("--out", metavar="FILE", help="write the stats JSON here (default: only print)")
    p.add_argument("--json", action="store_true", help="print the stats as JSON")
    _cluster_options(p)
    p.set_defaults(run=_cmd_stats)

    p = command(
        "bench",
        "windows/s, GB/s, first batch, I/O wait and peak RSS of a WindowDataset on your data",
        "Runs the real loader through a torch DataLoader in this process until the "
        "epoch ends, --max-batches or --seconds; progress goes to stderr.",
    )
    p.add_argument("path", metavar="PATH", help="dataset folder, Parquet file or glob")
    p.add_argument("--features", nargs="+", required=True, metavar="COL", help="columns stacked as x (required)")
    p.add_argument("--series", required=True, metavar="COL", help="the series column (required)")
    _window_options(p, required=True)
    _loader_options(p)
    p.add_argument("--max-batches", type=int, metavar="N", help="stop after this many batches (default: no limit)")
    p.add_argument(
        "--seconds", type=float, default=30.0, metavar="S", help="stop after this long (the epoch may end first)"
    )
    p.add_argument(
        "--step-ms", type=float, default=0.0, metavar="MS", help="simulated training step per batch, in milliseconds"
    )
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr (default: show it)")
    p.set_defaults(run=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dask-windows``; returns the exit status (0 ok, 1 failed, 2 usage)."""
    args = build_parser().parse_args(argv)
    args.verbose += getattr(args, "verbose_sub", 0)
    level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        out = args.run(args)
    except (ValueError, TypeError, KeyError, OSError, ImportError, MemoryError) as exc:
        # our errors subclass these (ConfigError, DataError, SchemaError, SourceReadError)
        if args.verbose >= 2:
            raise
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"dask-windows {args.command}: error: {_cli_message(str(message))}", file=sys.stderr)
        return 1
    print(out["text"] if "text" in out and len(out) == 1 else json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
