"""The subcommand runners of ``dask-windows``: each ``_cmd_*`` takes the parsed arguments and returns
the JSON report (``--json``) or ``{"text": ...}``, the table ``main`` prints."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time as clock
import warnings
from collections.abc import Sequence
from typing import Any

from dask_windows.cli.bench import bench  # imports torch only when called
from dask_windows.cli.cluster import _Cluster, _input_block_size
from dask_windows.cli.keywords import dataset_keywords


def _size(num_bytes: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(num_bytes) < 1000:
            return f"{num_bytes:,.0f} {unit}" if unit == "B" else f"{num_bytes:,.1f} {unit}"
        num_bytes /= 1000
    return f"{num_bytes:,.1f} TB"


def _figure(value: float) -> str:
    """A measured figure with 3 significant digits: small values are never shown as 0."""
    return f"{value:,.0f}" if value == 0 or abs(value) >= 1000 else f"{value:.3g}"


def _table(rows: Sequence[tuple[str, Any]], indent: str = "") -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{indent}{k:<{width}}  {v}" for k, v in rows)


def _cmd_convert(args: argparse.Namespace) -> dict:
    from dask.utils import parse_bytes

    from dask_windows.cli.convert import convert, series_spread
    from dask_windows.cli.summary import manifest_windows

    started = clock.perf_counter()
    with _Cluster(args) as cluster:
        report = convert(
            args.src,
            args.dst,
            fmt=args.format,
            partition_size=int(parse_bytes(args.partition_size)),
            input_block_size=_input_block_size(args.memory_limit),
            npy_columns=args.npy_columns.split(",") if args.npy_columns else None,
            compute=cluster.compute,
            **{k: getattr(args, k) for k in ("series", "time", "overwrite", "parse_time", "compression")},
            **{k: getattr(args, k) for k in ("layout", "window", "horizon", "chunk_rows")},  # the spread layout
        )
    seconds = clock.perf_counter() - started
    out = {k: v for k, v in report.__dict__.items() if k != "manifest"}
    out.update(seconds=round(seconds, 3), workers_restarted=cluster.workers_restarted)
    out["leftovers_removed"] = list(out["leftovers_removed"])
    if args.window is not None:
        kept, lost = manifest_windows(report.manifest, args.window, args.stride, args.horizon)
        out.update(window=args.window, stride=args.stride, horizon=args.horizon, windows=kept, windows_lost=lost)
        if kept == 0:
            if report.manifest.get("version", 1) >= 2:  # spread: whole series, not their chunks
                what, longest, remedy = "series", series_spread(report.manifest["files"])[1], ""
            else:
                what, longest = (
                    "series run",
                    max((r[1] for f in report.manifest["files"] for r in f["runs"]), default=0),
                )
                remedy = " (or a larger --partition-size if series were cut into files)"
            raise ValueError(
                f"--window {args.window}"
                + (f" + --horizon {args.horizon}" if args.horizon else "")
                + f" leaves 0 windows: every {what} in {args.dst} is shorter than {args.window + args.horizon} "
                f"rows (longest: {longest:,} rows); the dataset was written, but use a smaller window{remedy}"
            )
    if args.json:
        return out
    rows_out = f"{out['rows_out']:,}"
    if out["overlap_rows"]:
        overlap = f"{out['overlap_rows']:,} overlap rows repeated at chunk cuts"
        rows_out = f"{out['rows_stored']:,} ({rows_out} input rows + {overlap})"
    mean = _size(out["bytes_out"] / max(out["files"], 1))
    rows = [
        ("output", args.dst),
        ("rows in", f"{out['rows_in']:,}"),
        ("rows out", rows_out),
        ("files", f"{out['files']:,} ({_size(out['bytes_out'])}, {mean} mean)"),
        ("series", f"{out['series']:,} ({out['split_series']:,} split across files)"),
    ]
    if "windows" in out:
        lost = out["windows_lost"] / max(out["windows"] + out["windows_lost"], 1)
        settings = f"window={args.window}, stride={args.stride}, horizon={args.horizon}"
        windows = f"{out['windows']:,} kept, {out['windows_lost']:,} lost at file edges ({lost:.3%})"
        rows.append((f"windows ({settings})", windows))
    rows.append(("time", f"{seconds:.1f} s ({out['rows_in'] / seconds:,.0f} rows/s)"))
    rows += [("removed", f"{path} (left by an interrupted convert)") for path in out["leftovers_removed"]]
    if out["workers_restarted"]:
        restarted = f"{out['workers_restarted']} Dask workers were restarted (out of memory?); the output is complete"
        rows.append(("warning", restarted))
    return {"text": _table(rows)}


def _cmd_inspect(args: argparse.Namespace) -> dict:
    from dask_windows.cli.summary import inspect_dataset

    if args.corpus:
        return _inspect_corpus(args)
    if len(args.path) > 1:
        raise ValueError(f"inspect takes one PATH ({len(args.path)} given); several are data sets of --corpus")
    args.path = args.path[0]
    out = inspect_dataset(args.path, num_workers=args.num_workers, **dataset_keywords(args))
    if args.mixing:
        from dask_windows.planning.mixing import inspect_mixing

        names = ("batch_size", "buffer_partitions", "pieces_per_partition", "buffer_bytes")
        out["mixing"] = inspect_mixing(args.path, out, **{k: getattr(args, k) for k in names})
    if args.json:
        return out
    series = "no series column: each partition is one run (pass --series)"
    if out["series"] is not None:
        runs = f"{out['runs']:,} runs, from the {out['runs_from']}"
        series = f"{out['series']:,} in column {out['series_column']!r} ({runs})"
    rows = [
        ("path", out["path"]),
        ("files", f"{out['files']:,}"),
        ("partitions", f"{out['partitions']:,} (largest {out['largest_partition_rows']:,} rows)"),
        ("rows", f"{out['rows']:,}"),
        *([("bytes", _size(out["bytes"]))] if out["bytes"] is not None else []),
        ("series", series),
        ("schema", ", ".join(f"{k}: {v}" for k, v in out["schema"].items())),
    ]
    if out["skipped"]:
        shown = ", ".join(out["skipped"][:3]) + (", ..." if len(out["skipped"]) > 3 else "")
        rows.append(("skipped", f"{len(out['skipped']):,} unreadable partitions (--on-error skip): {shown}"))
    if "windows" in out:
        mem, left_out, cuts = out["memory"], out["left_out"], out.get("chunk_cuts")
        nan = ", nan=drop" if out["nan"] == "drop" else ""
        settings = f"window={out['window']}, stride={out['stride']}, horizon={out['horizon']}{nan}"
        rows.append((f"windows ({settings})", f"{out['windows']:,}"))
        if left_out["runs"]:
            short = f"{left_out['runs']:,} series (or a file's stretch of one) shorter than window + horizon"
            rows.append(("left out", f"{short}: {left_out['rows']:,} rows in no window"))
        if cuts:
            flags = f"--window {out['window']}" + (f" --horizon {out['horizon']}" if out["horizon"] else "")
            share = f"{cuts['lost']:,} of {cuts['total']:,} windows ({cuts['lost'] / cuts['total']:.1%})"
            converted = f"converted for window + horizon <= {cuts['converted_span']}"
            remedy = f"re-run `dask-windows convert` with {flags} (or larger), or use a smaller window"
            rows.append(("left out at chunk cuts", f"{share}: {converted}; {remedy}"))
        loader = f"buffer={args.buffer_partitions}, prefetch={args.prefetch_partitions}, batch={args.batch_size}"
        parts = (f"{key.replace('_', ' ')} {_size(mem[key])}" for key in ("partitions", "window_index", "batches"))
        total = f"{_size(mem['per_process'])} per process x {mem['processes']} = {_size(mem['total'])}"
        rows.append((f"loader memory ({loader}, C={len(out['features'])})", f"{total} ({', '.join(parts)})"))
    rows.append(("time", f"{out['seconds']:.3f} s"))
    if args.mixing:
        from dask_windows.planning.mixing import format_report

        return {"text": _table(rows) + "\n\nmixing\n" + format_report(out["mixing"])}
    return {"text": _table(rows)}


def _inspect_corpus(args: argparse.Namespace) -> dict:
    """``inspect --corpus``: each PATH (or NAME=PATH) a data set of a ``CorpusDataset``, mixed, its report."""
    from dask_windows.corpus import CorpusDataset, LeftOutSeriesWarning, mix_corpora

    names = ("patch_size", "max_length", "min_length", "sequence_tokens", "channels", "batch_size")
    settings = {k: getattr(args, k) for k in names if k != "batch_size" or args.batch_size is not None}
    members = {}
    for given in args.path:
        name, sep, path = given.partition("=")
        if not sep or "://" in name or "/" in name:
            name = path = given
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LeftOutSeriesWarning)  # the report counts them
            members[name] = CorpusDataset(path, target=args.target, freq=args.freq, name=name, **settings)
    ds = members[next(iter(members))] if len(members) == 1 else mix_corpora(members)
    report = ds.report(values=args.values, epoch=args.epoch, world_size=args.world_size)
    if args.json:
        return report
    lines = []
    for name, d in report["datasets"].items():
        left = d["left_out"]
        why = f"{left['empty_rows']:,} empty rows, {left['short_series']:,} shorter than min_length, "
        why += f"{left['wide_series']:,} with more channels than a sequence holds"
        lines.append(f"{name}  ({d['path']}, {d['files']:,} files, {d['partitions']:,} partitions)")
        rows = [
            ("series", f"{d['series']:,} ({d['observations']:,} observations, up to {d['channels_max']} channels)"),
            ("lengths", f"{d['length_min']:,} to {d['length_max']:,} steps (median {d['length_median']:,.0f})"),
            ("left out", f"{left['series']:,} series, {left['observations']:,} observations: {why}"),
            ("items", f"{d['items']:,} ({d['items_per_epoch']:,} per epoch)"),
        ]
        if "missing" in d:
            m = d["missing"]
            values = f"{m['missing_observations']:,} values in {m['series_with_missing']:,} series"
            inf = f"{m.get('infinite_observations', 0):,} of them inf or beyond float32, served masked"
            empty = f"{m['series_all_missing']:,} series and {m['channels_all_missing']:,} channels"
            rows.append(("missing", f"{values} ({inf}); {empty} with no observed value (served fully masked)"))
        if "epoch_not_served" in d:
            e = d["epoch_not_served"]
            unserved = f"{e['items']:,} items ({e['observations']:,} observations) in sequences no rank serves"
            cut = f"{e['observations_cut_by_context']:,} steps cut by context_length"
            drawn = f"{e['items_not_drawn']:,} items not drawn, {e['items_repeated']:,} repeated"
            rows.append(("epoch", f"{unserved}, {cut}, {drawn}"))
        lines.append(_table(rows, indent="  "))
    if "epoch" in report:
        e = report["epoch"]
        lines.append(
            f"epoch {e['epoch']} over {e['world_size']} ranks: {e['sequences']:,} sequences, "
            f"{e['sequences_not_served']:,} not served, {e['packing_efficiency']:.1%} of tokens hold an item"
        )
    return {"text": "\n".join(lines)}


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
        num_workers=args.num_workers,
        max_batches=args.max_batches,
        seconds=args.seconds,
        step_ms=args.step_ms,
        progress=None if args.no_progress else sys.stderr,
        **dataset_keywords(args),
    )
    if args.json:
        return out
    rss = _size(out["peak_rss_bytes"])
    if out["peak_worker_rss_bytes"] is not None:
        rss += f" (largest worker {_size(out['peak_worker_rss_bytes'])})"
    rows = [
        ("path", out["path"]),
        ("settings", ", ".join(f"{k}={v}" for k, v in out["settings"].items())),
        (
            "dataset",
            f"{out['partitions']:,} partitions, {out['num_windows']:,} windows, {out['batches_per_epoch']:,} "
            f"batches/epoch (opened in {out['open_seconds']:.2f} s)",
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
    return {"text": _table(rows) + "\n\nwhere the time went\n" + _bench_flags(out["breakdown"])}


def _bench_flags(text: str) -> str:
    """The breakdown's advice in ``bench``'s flags (``num_workers=N`` is ``--num-workers N``)."""
    from dask_windows.cli.options import _FLAGS

    text = text.replace(
        "iterating with num_workers=0 (or `dask-windows bench`)", "running `dask-windows bench` with --num-workers 0"
    )
    text = text.replace("DataLoader num_workers=N", "--num-workers N").replace("more num_workers", "more --num-workers")

    def flag(match: re.Match) -> str:
        keyword, value = match.group(1), match.group(2)
        return f"{_FLAGS[keyword]} {value.rstrip('+')}" if keyword in _FLAGS else match.group(0)

    return re.sub(r"\b([a-z_]+)=([0-9N]+\+?)", flag, text)


def _cmd_index(args: argparse.Namespace) -> dict:
    """``index``: write the dataset index (or ``--verify`` it), report where and its size."""
    from dask_windows.sources.parquet.index_writer import verify_index, write_index

    started = clock.perf_counter()
    if args.verify:
        out = verify_index(args.path, args.out)
        out["seconds"] = round(clock.perf_counter() - started, 3)
        if args.json:
            return out
        return {"text": f"{out['index']} matches the {out['files']:,} files there ({out['seconds']:.2f} s)"}
    client = None
    with _Cluster(args) as cluster:  # connected as convert and stats connect
        if args.scheduler:
            try:
                client = cluster._start()
            except ConnectionError as exc:
                raise ConnectionError(
                    f"{str(exc).split('; check')[0]}; check the address and that the scheduler is running, "
                    f"or leave out --scheduler to read the footers on threads of this process (--threads)"
                ) from exc
        out = write_index(args.path, args.out, series=args.series, threads=args.threads, client=client)
        if client is not None:
            out["workers"] = len(client.scheduler_info().get("workers", {}))
    out["seconds"] = round(clock.perf_counter() - started, 3)
    if args.json:
        return out
    series = "no series runs (pass --series)" if out["series"] is None else f"runs of {out['series']!r}"
    return {
        "text": f"wrote {out['index']}: {out['files']:,} files, {out['bytes']:,} bytes "
        f"({out['bytes_per_file']:,.0f} per file), {series}, in {out['seconds']:.2f} s"
        + (f" on {out['workers']} Dask workers" if args.scheduler else "")
    }
