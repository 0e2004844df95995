"""The background reader: order, bound, exceptions relayed, thread gone on close."""

from __future__ import annotations

import threading

import pytest

from dask_windows.prefetch import Prefetcher


def test_yields_in_order_with_and_without_thread():
    for depth in (0, 1, 3):
        assert list(Prefetcher(lambda k: k * 2, range(10), depth)) == [k * 2 for k in range(10)]


def test_reads_at_most_depth_ahead():
    read = []
    gate = threading.Event()

    def slow(key):
        read.append(key)
        return key

    p = Prefetcher(slow, range(20), depth=2)
    it = iter(p)
    assert next(it) == 0
    gate.wait(0.2)  # give the thread every chance to run ahead
    # taken: 1 item; read ahead: at most 2 more.
    assert len(read) <= 3
    p.close()
    assert not p.alive


def test_exception_surfaces_in_consumer_and_thread_stops():
    def bad(key):
        if key == 3:
            raise OSError("disk on fire")
        return key

    p = Prefetcher(bad, range(10), depth=2)
    got = []
    with pytest.raises(OSError, match="disk on fire"):
        for item in p:
            got.append(item)
    assert got == [0, 1, 2]
    assert not p.alive


def test_close_while_reader_blocked_on_bound_joins():
    p = Prefetcher(lambda k: k, range(1000), depth=1)
    next(iter(p))
    p.close()
    assert not p.alive
    assert not [t for t in threading.enumerate() if t.name == "dask-windows-prefetch"]
