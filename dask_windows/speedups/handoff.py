"""Arrays across processes: allocated shared, sent as file descriptors inside the message.

``shared_empty`` allocates an array in shared memory (torch's ``file_descriptor``
segments, unlinked when created: nothing ever has a name in ``/dev/shm``), so a
worker can decode straight into it. ``pack`` turns a result (dataclasses,
tuples, lists, dicts, arrays) into a picklable description whose large arrays
are descriptor numbers, each object once: a unit's ``Part``, listed once per
segment, travels once, and views of a shared array travel as views. ``send``
writes the pickled description with the descriptors attached (``SCM_RIGHTS``
over a Unix socket): the kernel holds them in the message, so a result stays
valid if its sender dies after sending. ``recv`` and ``unpack`` rebuild it.

The trade-off: ``unpack`` copies each shared array out once into an ordinary
numpy array (a memcpy, on the receiving builder thread), because numpy's large
arrays get transparent huge pages and shared memory does not, and the random
gather of windows is 5-7% slower on 4 KiB pages; the segment is unmapped as
soon as the copy is made. Sender and receiver must keep one ``pack`` call's
arrays alive until ``send`` returns (``release`` then drops them).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import socket
import struct
from typing import Any

import numpy as np
import torch

from dask_windows.tuning import MIN_SHARED_BYTES as _MIN_SHARED_BYTES

__all__ = ["pack", "recv", "release", "send", "shared_empty", "unlink_leftovers", "unpack"]


# -- packing: arrays as shared tensors, each object once -------------------------------------------


@dataclasses.dataclass
class _Shared:
    """A numpy array travelling as shared memory: the ``fd``-th descriptor of its message."""

    fd: int
    nbytes: int
    dtype: np.dtype
    shape: tuple


@dataclasses.dataclass
class _View:
    """A view of a shared array of the same result: ``(base, byte offset, shape, strides)``."""

    base: _Shared
    offset: int
    shape: tuple
    strides: tuple


@dataclasses.dataclass
class _Packed:
    """A dataclass instance whose fields travel separately (so arrays inside are shared)."""

    cls: type
    fields: dict


_ALLOCATED: dict[int, tuple[np.ndarray, torch.Tensor]] = {}  # worker: id(array) -> (array, its bytes)


def unlink_leftovers(pid: int, folder: str = "/dev/shm") -> list[str]:
    """Unlink the shared-memory names a killed process ``pid`` left: the names it unlinked.

    torch makes a segment under a name (``torch_<pid>_<random>_<n>``) and unlinks it at once; a
    worker killed between the two (SIGKILL, the out-of-memory killer) leaves the name, and its
    memory, until the machine restarts. Only for a child known dead: the pid is in the name, so
    no live process's segment is touched.
    """
    prefix = f"torch_{int(pid)}_"
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix)]
    except OSError:  # no such folder (not Linux)
        return []
    gone = []
    for name in names:
        try:
            os.unlink(os.path.join(folder, name))
            gone.append(name)
        except OSError:  # unlinked meanwhile
            pass
    return gone


def shared_empty(shape: tuple, dtype: Any) -> np.ndarray:
    """``np.empty`` in shared memory (worker side); ``pack`` sends it without a copy.

    Torch's ``file_descriptor`` segments are unlinked when created: only descriptors exist.
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    storage = torch.UntypedStorage._new_shared(max(nbytes, 1))
    raw = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (max(nbytes, 1),), (1,))
    array = raw.numpy()[:nbytes].view(dtype).reshape(shape)
    _ALLOCATED[id(array)] = (array, raw)
    return array


def pack(value: Any, memo: dict[int, Any], fds: list[int]) -> Any:
    """``value`` (dataclasses, tuples, lists, dicts, arrays), large arrays as descriptors in ``fds``."""
    key = id(value)
    if key in memo:
        return memo[key]
    out: Any = value
    if isinstance(value, np.ndarray):
        out = _pack_array(value, memo, fds)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        out = _Packed(type(value), {f.name: pack(getattr(value, f.name), memo, fds) for f in fields})
    elif isinstance(value, (tuple, list)):
        out = type(value)(pack(v, memo, fds) for v in value)
    elif isinstance(value, dict):
        out = {k: pack(v, memo, fds) for k, v in value.items()}
    memo[key] = out
    return out


def _pack_array(array: np.ndarray, memo: dict[int, Any], fds: list[int]) -> Any:
    if id(array) in _ALLOCATED:
        fd, _ = _ALLOCATED[id(array)][1].untyped_storage()._share_fd_cpu_()
        fds.append(fd)
        return _Shared(len(fds) - 1, array.nbytes, array.dtype, array.shape)
    if array.dtype.kind not in "biuf" or not array.dtype.isnative:
        return array
    address = array.__array_interface__["data"][0]
    for base, _ in list(_ALLOCATED.values()):  # a view of an array allocated shared: its place in it
        start = base.__array_interface__["data"][0]
        if base.nbytes and start <= address < start + base.nbytes:
            return _View(pack(base, memo, fds), address - start, array.shape, array.strides)
    if array.nbytes < _MIN_SHARED_BYTES or len(fds) >= _MAX_FDS // 2:  # past that, bytes in the message
        return array
    copy = shared_empty(array.shape, array.dtype)
    copy[...] = array
    return _pack_array(copy, memo, fds)


def unpack(value: Any, memo: dict[int, Any], fds: list[int]) -> Any:
    """Undo ``pack`` with the received descriptors: each shared array copied out once, views as views."""
    key = id(value)
    if key in memo:
        return memo[key]
    out: Any = value
    if isinstance(value, _Shared):
        size = max(value.nbytes, 1)
        storage = torch.UntypedStorage._new_shared_fd_cpu(fds[value.fd], size)  # type: ignore[attr-defined]
        raw = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (size,), (1,)).numpy()[: value.nbytes]
        # Copied out (on the builder thread, a memcpy): numpy's large arrays get transparent huge pages
        # and shared memory does not, and the consumer's random gather is 5-7% slower on 4 KiB pages.
        # The segment is unmapped as soon as the copy is made.
        out = np.empty(value.shape, value.dtype)
        out.reshape(-1).view(np.uint8)[:] = raw
        del raw, storage
    elif isinstance(value, _View):
        base = unpack(value.base, memo, fds)
        out = np.ndarray(value.shape, base.dtype, buffer=base, offset=value.offset, strides=value.strides)
    elif isinstance(value, _Packed):
        out = value.cls(**{k: unpack(v, memo, fds) for k, v in value.fields.items()})
    elif isinstance(value, (tuple, list)):
        out = type(value)(unpack(v, memo, fds) for v in value)
    elif isinstance(value, dict):
        out = {k: unpack(v, memo, fds) for k, v in value.items()}
    memo[key] = out
    return out


# -- messages: a header with the descriptors attached, then the pickled payload ----------------------

_HEADER = struct.Struct("<QI")  # payload bytes, descriptors
_MAX_FDS = 253  # SCM_RIGHTS limit per message


def send(sock: socket.socket, message: Any, fds: list[int]) -> None:
    """Send ``message`` with ``fds`` attached (the kernel holds them until received: a worker may exit)."""
    if len(fds) > _MAX_FDS:
        raise ValueError(f"{len(fds)} shared arrays in one result; at most {_MAX_FDS}")
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    socket.send_fds(sock, [_HEADER.pack(len(payload), len(fds))], fds)
    sock.sendall(payload)


def recv(sock: socket.socket) -> tuple[Any, list[int]]:
    """One message of ``send`` and its descriptors (the caller closes them); ``EOFError`` at the end."""
    head, fds, _, _ = socket.recv_fds(sock, _HEADER.size, _MAX_FDS)
    try:
        while len(head) < _HEADER.size:
            more = sock.recv(_HEADER.size - len(head))
            if not more:
                raise EOFError
            head += more
        if not head:
            raise EOFError
        size, count = _HEADER.unpack(head)
        if count != len(fds):
            raise EOFError(f"{count} descriptors announced, {len(fds)} received")
        chunks, left = [], size
        while left:
            chunk = sock.recv(min(left, 1 << 20))
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            left -= len(chunk)
        return pickle.loads(b"".join(chunks)), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def release() -> None:
    """Drop this process's references to the arrays ``shared_empty`` made (after ``send``)."""
    _ALLOCATED.clear()
