"""One definition of "this file is the one we planned": its size and version, recorded at open.

Local files are compared at every read (one ``os.stat``); remote files through what the read
returns (row counts, page checksums), not a second request. The resume fingerprint (``digest``)
hashes each file's size and footer, so a copied dataset still resumes. The trade-off: a rewrite
keeping the footer and size is not caught by the fingerprint (local reads still catch it by mtime)."""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dask_windows.errors import SourceReadError

__all__ = ["FileIdentity", "FooterDigest", "check_local", "digest", "from_info", "local"]

#: Keys fsspec filesystems use for a version of an object (first present wins).
VERSION_KEYS = ("ETag", "etag", "md5Hash", "generation", "version_id", "VersionId", "LastModified", "mtime", "updated")


@dataclass(frozen=True, slots=True)  # one per file: no per-instance dict
class FileIdentity:
    """What a file was when the dataset was opened: ``size`` in bytes and ``version`` (ETag or
    generation as text, a local ``mtime`` in ns as an int), each ``None`` when unknown."""

    size: int | None
    version: str | int | None

    def describe(self) -> str:
        """``"1,234 bytes, version X"`` for messages."""
        size = "unknown size" if self.size is None else f"{self.size:,} bytes"
        return size + ("" if self.version is None else f", version {self.version}")


def from_info(info: dict | None) -> FileIdentity:
    """The identity in an fsspec ``info()`` / ``find(detail=True)`` entry."""
    if not info:
        return FileIdentity(None, None)
    size = info.get("size")
    version = next((info[k] for k in VERSION_KEYS if info.get(k) is not None), None)
    return FileIdentity(int(size) if isinstance(size, int) else None, None if version is None else str(version))


def local(path: str) -> FileIdentity:
    """Size and ``mtime`` (ns) of a local file."""
    stat = os.stat(path)
    return FileIdentity(stat.st_size, stat.st_mtime_ns)


def changed(path: str, expected: FileIdentity | None) -> FileIdentity | None:
    """The identity local ``path`` has now where it is not ``expected``; ``None`` where nothing is
    expected, the file is unchanged, or it is gone (the read itself reports a missing file)."""
    if expected is None:
        return None
    try:
        now = local(path)
    except FileNotFoundError:
        return None
    return None if now == expected else now


def check_local(path: str, expected: FileIdentity | None) -> None:
    """Raise ``SourceReadError`` (``kind`` ``"corrupt"``) naming the file, the change and the remedy
    when local ``path`` is no longer the file planned at open."""
    now = changed(path, expected)
    if now is None:
        return
    assert expected is not None
    error = SourceReadError(
        f"{path} changed after the dataset was opened (then {expected.describe()}, now {now.describe()}); "
        "the epoch plan was made from the old file, so its rows would be wrong; open the dataset again "
        "(and do not rewrite files while a dataset reads them), or pass on_error='skip' to leave it out"
    )
    error.kind = "corrupt"  # type: ignore[attr-defined]
    raise error


class FooterDigest(bytes):
    """The SHA-256 of a serialised footer, for ``digest`` (a dataset index keeps it, not the footer)."""


def digest(files: Iterable[tuple[int | None, Any]]) -> str:
    """A short hash of each file's ``(size, footer)``, in order, for the resume fingerprint; a footer is
    its bytes, their SHA-256 as a ``FooterDigest``, a ``FileMetaData`` (pickled) or ``None``."""
    out = hashlib.sha256()
    for size, footer in files:
        out.update(str(size).encode() + b"|")
        if isinstance(footer, FooterDigest):
            out.update(footer)
        elif footer is not None:
            raw = footer if isinstance(footer, bytes) else pickle.dumps(footer)
            out.update(hashlib.sha256(raw).digest())
    return out.hexdigest()[:24]
