"""The background reader: order, bound, exceptions relayed, thread gone on close."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from dask_windows.runtime.prefetch import Ahead, PrefetchClosed, Prefetcher


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


def test_several_threads_yield_in_key_order_and_read_in_parallel():
    both = threading.Barrier(2, timeout=30)

    def read(key):
        if key < 2:
            both.wait()  # keys 0 and 1 are read at the same time, or this times out
        time.sleep(0.002 * ((key * 7) % 5))  # later keys finish out of order
        return key

    assert list(Prefetcher(read, range(30), depth=4, threads=3)) == list(range(30))
    assert not [t for t in threading.enumerate() if t.name.startswith("dask-windows-prefetch")]


def test_threads_never_hold_more_than_depth_items():
    lock = threading.Lock()
    held = [0, 0]  # items read or being read and not yet counted off by the consumer; the most seen

    def read(key):
        with lock:
            held[0] += 1
            held[1] = max(held[1], held[0])
        time.sleep(0.001)
        return key

    p = Prefetcher(read, range(40), depth=3, threads=4)
    for _ in p:
        time.sleep(0.002)
        with lock:
            held[0] -= 1
    assert held[1] <= 3 + 1  # the item just taken is still counted until the consumer's decrement


def test_error_in_one_of_several_threads_surfaces_in_order():
    def read(key):
        if key == 5:
            raise ValueError("bad key 5")
        return key

    p = Prefetcher(read, range(20), depth=4, threads=3)
    got = []
    with pytest.raises(ValueError, match="bad key 5"):
        for item in p:
            got.append(item)
    assert got == [0, 1, 2, 3, 4]
    assert not p.alive


def test_close_from_another_thread_wakes_a_waiting_consumer():
    release = threading.Event()

    def read(key):
        if key == 1:
            release.wait(60)  # key 1 is still being read when the prefetcher is closed
        return key

    p = Prefetcher(read, range(5), depth=2, threads=1)
    assert next(p) == 0
    closer = threading.Timer(0.05, p.close)
    closer.start()
    with pytest.raises(PrefetchClosed):
        next(p)
    release.set()
    closer.join()
    assert not p.alive
    with pytest.raises(PrefetchClosed):  # closed: nothing is read in the consumer either
        next(p)


def test_ahead_resumes_the_iterator_after_each_item_is_taken():
    events = []

    def items():
        for k in range(3):
            events.append(("made", k))
            yield k
            events.append(("after", k))

    a = Ahead(items(), depth=1)
    assert next(a) == 0
    assert list(a) == [1, 2]
    assert events.index(("after", 0)) < events.index(("made", 1))
    assert not a.alive


def test_ahead_relays_errors_and_close_joins():
    def items():
        yield 1
        raise KeyError("builder broke")

    a = Ahead(items(), depth=1)
    assert next(a) == 1
    with pytest.raises(KeyError, match="builder broke"):
        next(a)
    assert not a.alive
    b = Ahead(itertools.count(), depth=2)
    assert next(b) == 0
    b.close(interrupt=lambda: None)
    assert not b.alive
    assert not [t for t in threading.enumerate() if t.name == "dask-windows-build"]


def test_a_burst_reads_the_first_keys_without_the_consumer_then_depth_ahead():
    read = []
    gate = threading.Event()

    def reaches(count: int) -> None:  # (the machine may be busy: wait for the reads, up to 30 s)
        deadline = time.monotonic() + 30
        while len(read) < count and time.monotonic() < deadline:
            gate.wait(0.01)
        gate.wait(0.1)  # and give the thread every chance to read too far

    p = Prefetcher(lambda key: read.append(key) or key, range(20), depth=1, burst=4)
    reaches(5)
    assert read == [0, 1, 2, 3, 4]  # the burst and one more, nothing taken yet
    it = iter(p)
    assert [next(it) for _ in range(4)] == [0, 1, 2, 3]  # the burst's items give back no slot
    gate.wait(0.1)
    assert read == [0, 1, 2, 3, 4]
    assert next(it) == 4
    reaches(6)
    assert read == [0, 1, 2, 3, 4, 5]  # then one ahead of the consumer, as depth=1 reads
    assert list(it) == list(range(5, 20))
    p.close()
