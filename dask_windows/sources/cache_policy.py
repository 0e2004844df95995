"""Which cache entries make room for new ones: least recently used, but never on a scan.

Under plain LRU a budget smaller than the data is useless for epochs (each entry is evicted by
the scan before the next epoch comes back to it). Here an entry used within ``keep_seconds`` is
kept and new bytes that would need its room are not stored; older entries are evicted least
recently used first; a fetch's entries are stored all or none. The price: after switching to
other data, old entries block new ones for ``keep_seconds`` unless the folder is cleared.
Pure: the caller lists the folder and unlinks."""

from __future__ import annotations

from collections.abc import Sequence

from dask_windows.settings.tuning import CACHE_KEEP_SECONDS as KEEP_SECONDS

__all__ = ["KEEP_SECONDS", "evictions"]


def evictions(
    entries: Sequence[tuple[int, str, int]],
    total: int,
    max_bytes: int | None,
    needed: int,
    now_ns: int,
    keep_seconds: float = KEEP_SECONDS,
) -> list[int] | None:
    """Indices into ``entries`` (``(last use in ns, name, bytes)``, oldest first) to evict so that
    ``needed`` more bytes fit beside ``total`` under ``max_bytes`` (``None``: no limit), or ``None``
    when they may not (entries used within ``keep_seconds`` of ``now_ns`` are never evicted)."""
    if max_bytes is None:
        return []
    if needed > max_bytes:
        return None
    stale_before = now_ns - int(keep_seconds * 1e9)
    out: list[int] = []
    for i, (used, _, size) in enumerate(entries):
        if total + needed <= max_bytes or used >= stale_before:
            break
        out.append(i)
        total -= size
    return out if total + needed <= max_bytes else None
