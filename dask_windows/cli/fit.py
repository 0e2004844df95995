"""``dask-windows fit``: fit a workflow on a dataset with Dask and write its JSON artifact.

The workflow is described by a Python file (or ``module:attribute``) defining a ``Workflow``
named ``workflow``, or by a JSON spec: an artifact's layout without fitted state
(``{"series": ..., "roles": {...}, "ops": [{"kind": ..., "config": {...}}, ...]}``). The fit
runs on the same cluster options as ``convert`` and ``stats`` (a LocalCluster, or
``--scheduler``), prints its time, rows, partitions and peak memory, and writes the artifact
that ``WindowDataset(workflow=PATH)`` reads.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
from collections.abc import Callable
from typing import Any

__all__ = ["add_fit_command", "load_spec"]


def load_spec(spec: str) -> Any:
    """The (unfitted) workflow ``spec`` describes: a ``.json`` spec, a ``.py`` file or ``module:attr``."""
    from dask_windows.errors import ConfigError
    from dask_windows.workflow import Workflow
    from dask_windows.workflow.artifact import FORMAT, VERSION, from_json

    if spec.endswith(".json"):
        import fsspec

        with fsspec.open(spec, "r") as f:
            doc = json.load(f)
        doc = {"format": FORMAT, "version": VERSION, "series_keys": None, "schema": None, **doc}
        doc.setdefault("roles", {})
        return from_json(doc, spec, fitted=False)
    if spec.endswith(".py"):
        loader = importlib.util.spec_from_file_location("dask_windows_fit_spec", spec)
        if loader is None or loader.loader is None:
            raise ConfigError(f"cannot load {spec}; give a .py file defining `workflow = Workflow([...])`")
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
        name = "workflow"
    else:
        module_name, _, name = spec.partition(":")
        module = importlib.import_module(module_name)
        name = name or "workflow"
    wf = getattr(module, name, None)
    if not isinstance(wf, Workflow):
        raise ConfigError(f"{spec} defines no Workflow named {name!r}; define `{name} = Workflow([...])` there")
    return wf


def _cmd_fit(args: argparse.Namespace) -> dict:
    from dask_windows.cli.cluster import _Cluster

    wf = load_spec(args.spec)
    data = args.path if len(args.path) > 1 else args.path[0]
    with _Cluster(args) as cluster:
        client = cluster.client or cluster._start()
        wf.fit(data, client=client)
    wf.save(args.out)
    report = wf.fit_report
    doc = {
        "out": args.out,
        "partitions": report.partitions,
        "rows": report.rows,
        "seconds": round(report.seconds, 3),
        "peak_rss_bytes": report.peak_rss_bytes,
        "series": len(wf.series_keys or []),
        "outputs": wf.outputs,
    }
    if args.json:
        return doc
    text = (
        f"fitted {len(wf.ops)} operations on {report.rows:,} rows ({report.partitions} partitions, "
        f"{doc['series']:,} series) in {report.seconds:.1f} s; peak memory {report.peak_rss_bytes / 2**20:,.0f} MiB "
        f"(this process and the cluster's workers)\nwritten to {args.out}"
    )
    return {"text": text}


def add_fit_command(command: Callable[[str, str, str], argparse.ArgumentParser], cluster_options: Callable) -> None:
    """Add ``fit`` with ``command`` (``cli.main``'s subcommand factory) and the shared cluster options."""
    p = command(
        "fit",
        "fit a workflow (normalisation, categories, time features, lags...) in one Dask pass and save it as JSON",
        "SPEC is a .py file defining `workflow = Workflow([...])`, a module:attribute, or a JSON spec "
        "(ops, roles, series). The output file is what WindowDataset(workflow=FILE) reads.",
    )
    p.add_argument("spec", metavar="SPEC", help="the workflow: file.py, module:attr or spec.json")
    p.add_argument("path", nargs="+", metavar="PATH", help="Parquet dataset folder, files, globs or URLs")
    p.add_argument("--out", required=True, metavar="FILE", help="where to write the fitted workflow (path or URL)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    cluster_options(p)
    p.set_defaults(run=_cmd_fit)
