"""Which cache entries make room for new ones: least recently used, but never on a scan.

Under plain LRU a budget smaller than the data is useless for epochs (each entry is evicted by
the scan before the next epoch comes back to it). Here an entry used within ``keep_seconds`` is
kept and new bytes that would need its room are not stored; older entries are evicted least
recently used first; a fetch's entries are stored all or none. The price: after switching to
other data, old entries block new ones for ``keep_seconds`` unless the folder is cleared.
Pure: the caller lists the folder and unlinks.
"""

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
    """The entries to evict so that ``needed`` more bytes fit, or ``None`` when they may not.

    Args:
        entries: ``(last use in ns, name, bytes)`` of every entry, oldest first.
        total: Bytes the folder holds now.
        max_bytes: The budget; ``None``: no limit.
        needed: Bytes to store.
        now_ns: The time now, in ns (``time.time_ns()``).
        keep_seconds: Entries used within this long are never evicted.

    Returns:
        Indices into ``entries`` (oldest first) to evict, or ``None``: do not store.
    """
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
