"""What ``convert`` may replace (only an earlier output of its own, never anything overlapping its inputs,
whatever the flags), and the leftovers of an interrupted run (``DST.tmp-<hex>``, ``DST.old-<hex>``)."""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
import socket
from collections.abc import Sequence
from typing import Any

import fsspec

from dask_windows.sources.manifest import MANIFEST_NAME, read_manifest

__all__ = ["MARKER", "check_output", "remove_leftovers"]

logger = logging.getLogger("dask_windows.cli.convert")

MARKER = "_dask_windows_convert_running.json"
_LEFTOVER = re.compile(r"\.(tmp|old)-[0-9a-f]{12}")


def _protocols(fs: Any) -> set:
    return set(fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def _real(fs: Any, path: str) -> str:
    from fsspec.implementations.local import LocalFileSystem

    if isinstance(fs, LocalFileSystem):
        return os.path.realpath(path)
    return fs._strip_protocol(path).rstrip("/")


def _within(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def check_output(
    fs: Any,
    root: str,
    dst: str,
    srcs: Sequence[str],
    files: Sequence[str],
    overwrite: bool,
    storage_options: dict | None = None,
) -> None:
    """Refuse any output that is not new, an empty folder or (with ``overwrite``) an earlier convert
    output, or that overlaps an input.

    Raises:
        FileExistsError: naming ``dst``, what is in the way and the remedy.
    """
    out = _real(fs, root)
    inputs = []
    for src in [*srcs, *files]:
        in_fs, path = fsspec.core.url_to_fs(src, **(storage_options or {}))
        if _protocols(fs) & _protocols(in_fs) and not any(c in path for c in "*?["):
            inputs.append((src, _real(in_fs, path)))
    for src, path in inputs:
        if out == path:
            why = "is the input"
        elif _within(out, path):
            why = "lies inside the input"
        elif _within(path, out):
            why = "contains the input"
        else:
            continue
        raise FileExistsError(
            f"the output {dst} {why} {src}; convert never writes over, into or around its inputs, whatever the flags: "
            f"choose an output folder outside them (did you forget DST after the inputs?)"
        )
    if not fs.exists(root):
        return
    if not fs.isdir(root):
        raise FileExistsError(
            f"{dst} is a file, not a dataset folder; convert never replaces it, whatever the "
            f"flags: choose a new output folder (did you forget DST after the inputs?)"
        )
    found = [posixpath.relpath(p, root) for p in fs.find(root)]
    if not found:
        return  # an empty folder: nothing to lose
    manifest = read_manifest(root, fs) if MANIFEST_NAME in found else None
    if manifest is None:
        raise FileExistsError(
            f"{dst} exists and is not a `dask-windows convert` output (no valid {MANIFEST_NAME} "
            f"at its root); convert only ever replaces its own outputs, whatever the flags: "
            f"choose a new output folder, or move {dst} away yourself"
        )
    listed = {f["path"] for f in manifest["files"]}
    extra = [p for p in found if p not in listed and not p.split("/")[0].startswith("_")]
    if extra:
        raise FileExistsError(
            f"{dst} is a convert output but also holds files convert did not write "
            f"({', '.join(sorted(extra)[:3])}{', ...' if len(extra) > 3 else ''}); convert will not delete them, "
            f"whatever the flags: move them out first or choose a new output folder"
        )
    if not overwrite:
        raise FileExistsError(f"{dst} already exists; pass --overwrite to replace it or choose another output folder")


def _alive_here(marker: dict) -> bool:
    if marker.get("host") != socket.gethostname():
        return True  # another machine's run: cannot tell, so leave it
    try:
        os.kill(int(marker["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError, ValueError, KeyError):
        return True
    return True


def remove_leftovers(fs: Any, root: str) -> list[str]:
    """Remove what an interrupted convert to ``root`` left beside it (a live run's, by its marker, stays;
    ``root.old-<hex>`` moves back when ``root`` is gone); returns the paths removed."""
    removed = []
    for path in sorted(fs.glob(f"{root}.tmp-*") + fs.glob(f"{root}.old-*")):
        path = path.rstrip("/")
        match = _LEFTOVER.fullmatch(path[len(root) :])
        if not match or not fs.isdir(path):
            continue
        if match.group(1) == "tmp":
            try:
                with fs.open(posixpath.join(path, MARKER), "r") as src:
                    marker = json.load(src)
            except (OSError, ValueError):
                marker = None
            if marker is not None and _alive_here(marker):
                logger.warning("left %s alone: it belongs to a convert still running (%s)", path, marker)
                continue
        elif not fs.exists(root):
            fs.mv(path, root, recursive=True)
            logger.warning("moved %s back to %s: an earlier convert was killed while replacing it", path, root)
            continue
        fs.rm(path, recursive=True)
        removed.append(path)
    if removed:
        logger.warning("removed leftovers of an interrupted convert: %s", ", ".join(removed))
    return removed
