"""The ``dask-windows`` command line: convert, inspect, stats, bench, index.

Heavy lifting (convert, stats) runs on Dask: a ``LocalCluster`` of worker
processes by default, or any running cluster given by ``--scheduler``.
``inspect`` reads metadata only and ``bench`` drives a ``WindowDataset``
through a ``torch.utils.data.DataLoader`` in this process, so neither starts a
cluster. Results go to stdout (``--json`` for a machine-readable form);
progress bars, logs and errors go to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from collections.abc import Sequence

from dask_windows.cli.bench import bench  # imports torch only when called
from dask_windows.cli.commands import _cmd_bench, _cmd_convert, _cmd_inspect, _cmd_stats
from dask_windows.cli.corpus_inspect import add_corpus_options
from dask_windows.cli.fit import add_fit_command
from dask_windows.cli.indexing import add_index_command
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
    p.add_argument("path", metavar="PATH", nargs="+", help="dataset folder, Parquet file or glob (several: --corpus)")
    _loader_options(p, "inspect")  # WindowDataset's keywords (cli.keywords)
    add_corpus_options(p)  # inspect --corpus (cli.corpus_inspect)
    p.add_argument(
        "--mixing",
        action="store_true",
        help="how well batches mix, beside a global shuffle (needs --window; reads no data)",
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
    _loader_options(p, "bench")  # WindowDataset's keywords (cli.keywords)
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
    add_index_command(command)
    add_fit_command(command, _cluster_options)
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
    """The process entry point (``dask-windows``, ``python -m dask_windows.cli``): ``main()``, then exit.

    The exit skips the interpreter's finalisation: pyarrow's native thread pools can abort a
    process that has finished its work while the interpreter shuts down ("terminate called
    without an active exception", apache/arrow#34314; 1 run in a few hundred of the test suite's
    commands here), which turned exit status 1 into -6. When ``main`` returns, the cluster is
    closed and every file written and closed; only the standard streams are left to flush.
    """
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run_and_exit()
