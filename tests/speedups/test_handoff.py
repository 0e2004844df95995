"""handoff: results packed with each object once, descriptors inside the message, values unchanged."""

from __future__ import annotations

import os
import socket
import threading

import numpy as np

from dask_windows.runtime.buffer import Part
from dask_windows.speedups.handoff import pack, recv, release, send, shared_empty, unpack


def roundtrip(value):
    a, b = socket.socketpair()
    try:
        fds: list[int] = []
        message = pack(value, {}, fds)
        sender = threading.Thread(target=send, args=(a, message, fds))  # a large message fills the socket
        sender.start()
        payload, got = recv(b)
        sender.join()
        release()
        try:
            return unpack(payload, {}, got)
        finally:
            for fd in got:
                os.close(fd)
    finally:
        a.close()
        b.close()


def test_views_of_a_shared_array_and_repeated_objects_arrive_as_such():
    base = shared_empty((3, 40_000), np.float32)
    base[...] = np.arange(base.size, dtype=np.float32).reshape(base.shape)
    expect = base.copy()
    part = Part(0, "p", base[:, 10:], None, np.zeros(0, np.int64), np.zeros(0, np.int64), arena=(base, None, 10))
    got = roundtrip([part, part, {"k": (base[1], 5)}])
    assert got[0] is got[1]
    np.testing.assert_array_equal(got[0].arena[0], expect)
    assert np.shares_memory(got[0].x, got[0].arena[0]) and np.shares_memory(got[2]["k"][0], got[0].arena[0])
    np.testing.assert_array_equal(got[0].x, expect[:, 10:])
    np.testing.assert_array_equal(got[2]["k"][0], expect[1])
    assert got[2]["k"][1] == 5


def test_more_large_arrays_than_descriptors_fit_in_one_message():
    arrays = [np.full(20_000, i, np.float32) for i in range(300)]  # 80 kB each: shared, then inline
    got = roundtrip(arrays)
    assert len(got) == 300 and all((g == i).all() and g.dtype == np.float32 for i, g in enumerate(got))
