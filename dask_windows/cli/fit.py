"""``dask-windows fit``: fit a workflow on a dataset with Dask and write its JSON artifact. The workflow
is a ``.py`` file or ``module:attribute`` defining a ``Workflow``, or a JSON spec: an artifact's layout
without fitted state (``{"series": ..., "roles": {...}, "ops": [{"kind": ..., "config": {...}}]}``)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
from typing import Any

__all__ = ["load_spec"]


def load_spec(spec: str) -> Any:
    """The (unfitted) workflow ``spec`` describes: a ``.json`` spec, a ``.py`` file or ``module:attr``."""
    from dask_windows.errors import ConfigError
    from dask_windows.workflow import Workflow
    from dask_windows.workflow.artifact import FORMAT, VERSION, from_json

    if spec.endswith(".json"):
        import fsspec

        with fsspec.open(spec, "r") as f:
            doc = json.load(f)
        doc = {"format": FORMAT, "version": VERSION, "series_keys": None, "schema": None, "roles": {}, **doc}
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
    with _Cluster(args) as cluster:
        wf.fit(args.path if len(args.path) > 1 else args.path[0], client=cluster.client or cluster._start())
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
