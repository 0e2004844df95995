"""``dask-windows index``: write the dataset index of a Parquet folder or prefix (``sources.footer_index``).

The index holds every file's compact footer, identity, row groups and series
runs, so that opening the dataset reads one object instead of one footer per
file. The command reads each footer once (the open it saves every later job)
and writes ``_dask_windows_index.dwi`` beside the files, or to ``--out``; it
never writes over a file that is not an index of this library.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from dask_windows.cli.options import _duration_arg, _parsed

__all__ = ["add_index_command", "run_index"]


def add_index_command(command: Callable[[str, str, str], argparse.ArgumentParser]) -> None:
    """Add ``index`` through ``build_parser``'s ``command`` helper."""
    p = command(
        "index",
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
    p.add_argument(
        "--connect-timeout",
        default="10s",
        metavar="TIME",
        type=_parsed("duration", _duration_arg),
        help="how long to try reaching --scheduler",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=run_index)


def run_index(args: argparse.Namespace) -> dict:
    """The ``index`` subcommand: write the index, report where and its size."""
    import time

    from dask_windows.sources.parquet.index_writer import verify_index, write_index

    started = time.perf_counter()
    if args.verify:
        out = verify_index(args.path, args.out)
        out["seconds"] = round(time.perf_counter() - started, 3)
        if args.json:
            return out
        return {"text": f"{out['index']} matches the {out['files']:,} files there ({out['seconds']:.2f} s)"}
    if args.scheduler:
        from dask_windows.cli.cluster import _Cluster

        with _Cluster(args) as cluster:  # connected as convert and stats connect
            try:
                client = cluster._start()
            except ConnectionError as exc:
                raise ConnectionError(
                    f"{str(exc).split('; check')[0]}; check the address and that the scheduler is running, "
                    f"or leave out --scheduler to read the footers on threads of this process (--threads)"
                ) from exc
            out = write_index(args.path, args.out, series=args.series, threads=args.threads, client=client)
            out["workers"] = len(client.scheduler_info().get("workers", {}))
    else:
        out = write_index(args.path, args.out, series=args.series, threads=args.threads)
    out["seconds"] = round(time.perf_counter() - started, 3)
    if args.json:
        return out
    series = "no series runs (pass --series)" if out["series"] is None else f"runs of {out['series']!r}"
    return {
        "text": f"wrote {out['index']}: {out['files']:,} files, {out['bytes']:,} bytes "
        f"({out['bytes_per_file']:,.0f} per file), {series}, in {out['seconds']:.2f} s"
        + (f" on {out['workers']} Dask workers" if args.scheduler else "")
    }
