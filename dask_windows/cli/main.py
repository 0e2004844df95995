"""The ``dask-windows`` command line: its parser and entry point (the runners are in ``commands``)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from collections.abc import Callable, Sequence

from dask_windows.cli import commands
from dask_windows.cli.bench import bench  # imports torch only when called
from dask_windows.cli.fit import _cmd_fit
from dask_windows.cli.options import (
    _SIZE,
    _TIMEOUT,
    _cli_message,
    _cluster_options,
    _count,
    _Formatter,
    _keyword_options,
    _paragraphs,
    _verbose_option,
)

__all__ = ["bench", "build_parser", "main"]

_INPUT = "input format (default: from file extensions)"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``dask-windows``."""
    from dask_windows import __version__
    from dask_windows.cli.readers import FORMATS

    parser = argparse.ArgumentParser(
        prog="dask-windows",
        formatter_class=_Formatter,
        description=_paragraphs(
            "Convert, inspect, summarise and benchmark time-series datasets for dask_windows.\n\nconvert and stats run "
            "on Dask (a LocalCluster, or --scheduler); inspect and bench open a WindowDataset in this process. Results "
            "go to stdout (--json for JSON); progress and errors to stderr."
        ),
        epilog="Run 'dask-windows COMMAND --help' for a command's options. Exit status: 0 ok, 1 failed, 2 bad usage.",
    )
    parser.add_argument(
        "--version", action="version", version=f"dask-windows {__version__}", help="print the version and exit"
    )
    _verbose_option(parser, "verbose")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run: Callable[..., dict], summary: str, description: str) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=summary,
            description=_paragraphs(f"{summary[0].upper()}{summary[1:]}.\n\n{description}"),
            formatter_class=_Formatter,
        )
        _verbose_option(p, "verbose_sub")
        p.set_defaults(run=run)
        return p

    def json_flag(p: argparse.ArgumentParser, what: str = "report") -> None:
        p.add_argument("--json", action="store_true", help=f"print the {what} as JSON")

    p = command(
        "convert",
        commands._cmd_convert,
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
    p.add_argument("--format", choices=FORMATS, help=_INPUT)
    p.add_argument(
        "--partition-size", default="256MB", metavar="BYTES", type=_SIZE, help="target size of each output file"
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
    _keyword_options(p, "convert", ("window", "stride", "horizon"))
    p.add_argument(
        "--layout",
        choices=("spread", "contiguous"),
        default="spread",
        help="spread: each series in chunks over all files, overlapping by window + horizon - 1 rows (128 without "
        "--window), so a few files mix like the whole dataset; contiguous: files in (series, time) order",
    )
    p.add_argument("--chunk-rows", type=int, metavar="N", help="rows per chunk (default: about 512 chunks per file)")
    json_flag(p)
    _cluster_options(p)

    p = command(
        "inspect",
        commands._cmd_inspect,
        "files, rows, series, schema, windows and loader memory of a Parquet dataset",
        "Opens the WindowDataset these options describe, so the checks, errors and "
        "window counts are the loader's own. No Dask cluster is started.",
    )
    p.add_argument("path", metavar="PATH", nargs="+", help="dataset folder, Parquet file or glob (several: --corpus)")
    _keyword_options(p, "inspect")
    p.add_argument("--num-workers", type=_count, default=0, metavar="N", help="DataLoader worker processes")
    g = p.add_argument_group("corpora (--corpus: each PATH, or NAME=PATH, one data set of list-column series)")
    g.add_argument("--corpus", action="store_true", help="inspect PATHs as data sets of a corpus (CorpusDataset)")
    g.add_argument("--target", default="target", metavar="COL", help="the list column (default: target)")
    g.add_argument("--freq", metavar="F", help="frequency where no freq column gives it")
    g.add_argument("--patch-size", type=int, default=16, metavar="P", help="steps per token (default: 16)")
    g.add_argument("--max-length", type=int, default=512, metavar="L", help="most steps of an item (default: 512)")
    g.add_argument("--min-length", type=int, default=1, metavar="M", help="fewest steps of a series (default: 1)")
    g.add_argument("--sequence-tokens", type=int, metavar="S", help="tokens per sequence (default: L / P)")
    g.add_argument("--channels", choices=("independent", "multivariate"), default="independent", help="the view")
    g.add_argument("--world-size", type=int, default=1, metavar="N", help="ranks dividing the epoch (default: 1)")
    g.add_argument("--epoch", type=int, default=0, metavar="E", help="the epoch counted (default: 0)")
    g.add_argument("--values", action="store_true", help="read every value: missing values, series all missing")
    p.add_argument(
        "--mixing",
        action="store_true",
        help="how well batches mix, beside a global shuffle (needs --window; reads no data)",
    )
    json_flag(p)

    p = command(
        "stats",
        commands._cmd_stats,
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
    p.add_argument("--format", choices=FORMATS, help=_INPUT)
    p.add_argument("--out", metavar="FILE", help="write the stats JSON here (default: only print)")
    json_flag(p, "stats")
    _cluster_options(p)

    p = command(
        "bench",
        commands._cmd_bench,
        "windows/s, GB/s, first batch, I/O wait and peak RSS of a WindowDataset on your data",
        "Runs the real loader through a torch DataLoader in this process until the "
        "epoch ends, --max-batches or --seconds; progress goes to stderr.",
    )
    p.add_argument("path", metavar="PATH", help="dataset folder, Parquet file or glob")
    _keyword_options(p, "bench")
    p.add_argument("--num-workers", type=_count, default=0, metavar="N", help="DataLoader worker processes")
    p.add_argument("--max-batches", type=int, metavar="N", help="stop after this many batches (default: no limit)")
    p.add_argument(
        "--seconds", type=float, default=30.0, metavar="S", help="stop after this long (the epoch may end first)"
    )
    p.add_argument(
        "--step-ms", type=float, default=0.0, metavar="MS", help="simulated training step per batch, in milliseconds"
    )
    json_flag(p, "figures")
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr (default: show it)")

    p = command(
        "index",
        commands._cmd_index,
        "write the dataset index of a Parquet folder or prefix: one read at open instead of one per file",
        "Reads every footer once and writes _dask_windows_index.dwi beside the files (or "
        "--out): per file its size and version, row groups, series runs and compact footer. "
        "WindowDataset finds it beside the data (or takes index=PATH). On local disk it is checked "
        "against the folder at open; on an object store the index is the source of truth (no listing): "
        "a changed object raises at its read, naming it, and --verify lists the store and compares.",
    )
    p.add_argument("path", metavar="PATH", help="dataset folder, prefix (s3://bucket/data/) or glob")
    p.add_argument("--out", metavar="PATH", help="write the index here (needed for a glob or a read-only folder)")
    p.add_argument(
        "--series", metavar="COL", help="the series column whose runs the index keeps (default: the manifest's)"
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="write nothing: list the files and compare them with the index there (or --out), naming any "
        "file added, deleted or changed since it was written (opening an object store from its index does not list it)",
    )
    p.add_argument(
        "--threads", type=int, default=16, help="concurrent reads of footers and series columns (default: 16)"
    )
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="read the footers and series columns on the workers of this running Dask scheduler, e.g. "
        "tcp://10.0.0.5:8786, for a store too large for one node (default: threads of this process); the "
        "index is the same, and the workers must reach PATH as this process does",
    )
    p.add_argument("--connect-timeout", **_TIMEOUT)
    json_flag(p)

    p = command(
        "fit",
        _cmd_fit,
        "fit a workflow (normalisation, categories, time features, lags...) in one Dask pass and save it as JSON",
        "SPEC is a .py file defining `workflow = Workflow([...])`, a module:attribute, or a JSON spec "
        "(ops, roles, series). The output file is what WindowDataset(workflow=FILE) reads.",
    )
    p.add_argument("spec", metavar="SPEC", help="the workflow: file.py, module:attr or spec.json")
    p.add_argument("path", nargs="+", metavar="PATH", help="Parquet dataset folder, files, globs or URLs")
    p.add_argument("--out", required=True, metavar="FILE", help="where to write the fitted workflow (path or URL)")
    json_flag(p)
    _cluster_options(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dask-windows``; returns the exit status (0 ok, 1 failed, 2 usage)."""
    args = build_parser().parse_args(argv)
    args.verbose += getattr(args, "verbose_sub", 0)
    level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    warnings.filterwarnings("default", category=DeprecationWarning, module=r"dask_windows\.")  # e.g. a retired flag
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


def run_and_exit() -> None:
    """The process entry point: ``main()``, then ``os._exit``, which skips the interpreter's finalisation,
    where pyarrow's thread pools can abort a finished process (apache/arrow#34314)."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run_and_exit()
