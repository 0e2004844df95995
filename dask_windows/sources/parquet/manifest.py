"""What ``ParquetSource`` records at open: the ``convert`` manifest (used when it names exactly the files
opened; else warned about and the series column scanned, or raising for version 2), file identities,
cache versions."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from dask_windows.errors import DataError
from dask_windows.sources.parquet.footers import Footer, folder_of, map_in_blocks
from dask_windows.sources.retry import RetryPolicy

__all__ = ["ParquetManifest"]


class ParquetManifest:
    """``ParquetSource``'s manifest, identities and cache (a mixin)."""

    fs: Any
    local: bool
    retry: RetryPolicy
    files: list[str]
    manifest_series: str | None
    _footers: dict[str, Footer]

    if TYPE_CHECKING:

        def _url(self, path: str) -> str: ...

    def _load_manifest(self, data: Any, listed_sizes: Iterable[tuple[str, int | None]]) -> dict | None:
        """``{"series", "runs", "manifest", "root"}`` of a ``convert`` manifest matching the files, else ``None``."""
        from dask_windows.sources.manifest import manifest_run_arrays, read_manifest

        root = folder_of(self.fs, data)
        if root is None:
            return None
        footers = getattr(self, "_footers", None)
        if getattr(getattr(footers, "_files", None), "unlisted", False):  # opened from an index, no listing
            if not footers._files.manifest:  # type: ignore[union-attr]
                return None  # none when it was written: no request to look
        elif not self.fs.isdir(root):
            return None
        manifest = read_manifest(root, self.fs)
        if manifest is None:
            return None
        from dask_windows.opening.checks import compare_manifest, runs_disagree_with_footer, warn_manifest

        self.manifest_series = manifest["series"]
        entries = {posixpath.join(root, f["path"]): f for f in manifest["files"]}
        ids = getattr(self, "_identities", {})
        listed = {p: (ids[p].size if p in ids and ids[p].size is not None else size) for p, size in listed_sizes}
        # a version-2 (spread) manifest cannot fall back to scanning: its own checks below raise
        changes = (
            compare_manifest(self._url(root), entries, listed, remote=not self.local) if manifest["version"] < 2 else []
        )
        if changes:
            warn_manifest(self._url(root), changes)
            return None
        runs = {}
        for path in self.files:
            entry = entries.get(path)
            if entry is not None:
                footer = self._footers[path]  # an index's compact footer: its identity was checked against the
                raw = None if hasattr(footer, "key_values") else footer.raw  # listing at open (footer_index)
                rewritten = _rewritten(entry, listed.get(path), raw)
                if rewritten and manifest["version"] >= 2:
                    raise DataError(
                        f"{self._url(path)} does not match the manifest of {self._url(root)} ({rewritten}): it "
                        "was rewritten or replaced after `dask-windows convert` wrote it; this dataset was converted in chunks spread over "
                        "its files, which only the manifest describes, so its windows would cross series; restore "
                        f"the file or rerun `dask-windows convert` into {self._url(root)}"
                    )
                if rewritten:
                    warn_manifest(self._url(root), [f"{path}: {rewritten}"])
                    return None
            if entry is None or entry["rows"] != self._footers[path].num_rows:
                if manifest["version"] >= 2:  # chunks of many stretches: the series column cannot recover them
                    raise DataError(
                        f"the manifest of {root} does not match {self._url(path)} (a file missing, added or "
                        "rewritten); this dataset was converted in chunks spread over its files, which only the "
                        "manifest describes; rerun `dask-windows convert` to write it again"
                    )
                rows = self._footers[path].num_rows
                warn_manifest(
                    self._url(root), [f"{path} has {rows:,} rows, the manifest says {entry and entry['rows']}"]
                )
                return None
            if manifest["version"] < 2:
                differ = runs_disagree_with_footer(self._footers[path].metadata, manifest["series"], entry["runs"])
                if differ is not None:
                    warn_manifest(self._url(root), [f"{path}: {differ}"])
                    return None
            runs[path] = manifest_run_arrays(entry["runs"])
        if manifest["version"] >= 2 and len(runs) != len(entries):
            missing = sorted(set(entries) - set(runs))
            raise DataError(
                f"the manifest of {root} lists {len(missing)} files that are not there (first: {self._url(missing[0])}); "
                "this dataset was converted in chunks spread over its files, so every file holds part of every "
                "series; restore the files or rerun `dask-windows convert`"
            )
        return {"series": manifest["series"], "runs": runs, "manifest": manifest, "root": root}

    def _record_identities(self, listed: dict, opened: dict | None = None) -> dict:
        """Each file's ``FileIdentity`` at open: the ``fstat`` of its open or ``os.stat`` locally, the listing remotely."""
        from dask_windows.sources import identity

        if self.local:
            known = {path: o.identity for path, o in (opened or {}).items() if o.identity is not None}
            return {path: known.get(path) or identity.local(path) for path in self.files}
        return {path: identity.from_info(listed.get(path)) for path in self.files}

    def _open_cache(self, cache_dir: Any, cache_bytes: int | None) -> tuple[Any, dict[str, str]]:
        """The ``RangeCache`` of a remote source and each file's ``object_version`` in its keys, taken once, at open."""
        if cache_dir is None or self.local:
            return None, {}
        from dask_windows.sources.cache import RangeCache, object_version

        cache = RangeCache(cache_dir, cache_bytes)
        infos = map_in_blocks(lambda path: self.retry.call(lambda: self.fs.info(path), path), self.files, 16)
        return cache, {path: object_version(info) for path, info in zip(self.files, infos)}


def _rewritten(entry: dict, size: int | None, raw: bytes | None) -> str:
    """How a file differs from its manifest entry (``""``: it does not), by its ``size`` now or its footer
    ``raw`` (``None`` when opened from the index, whose identity check stands for it)."""
    from dask_windows.sources.manifest import footer_digest

    if size is not None and entry["bytes"] != size:
        return f"{size:,} bytes, the manifest says {entry['bytes']:,}"
    if raw is not None and "footer" in entry and entry["footer"] != footer_digest(raw):
        return "its Parquet footer differs from the one the manifest recorded"
    return ""
