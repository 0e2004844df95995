"""Reused shared slots for batches handed from DataLoader workers to the main process.

Torch pickles each tensor a worker returns into a new shared-memory segment: with cheap batches this
costs more than making the batch. Inside a DataLoader worker, each batch goes into a slot of a
per-worker *ring* (one anonymous ``os.memfd_create`` mapping, freed by the kernel with its last holder,
so nothing outlives a crash): features gathered straight in (:class:`SlotPool`), targets and rows after
them. A slot tensor pickles as its place in the ring; the main process rebuilds it over its own mapping
and counts the slot released when its last view dies. A slot is reused once every copy sent is
released; with none free the batch takes torch's path. Linux only; ``DASK_WINDOWS_SLOTS=0``: off.
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import secrets
import threading
import weakref
from collections.abc import Iterator
from multiprocessing import reduction
from typing import Any

import numpy as np
import torch

from dask_windows.runtime.detect import in_worker
from dask_windows.runtime.prefetch import fork_safe_lock
from dask_windows.settings.tuning import DIRECT_BYTES, MAX_RINGS, switches
from dask_windows.settings.tuning import SLOT_HEADROOM as HEADROOM
from dask_windows.settings.tuning import SLOTS_PER_RING as SLOTS

__all__ = ["SLOTS", "SlotAllocator", "SlotPool", "enabled", "in_slots", "output_pool", "shared"]

log = logging.getLogger(__name__)

ALIGN = 64  # bytes between the tensors of one batch in a slot
HEADER = 4096  # the ring's first page: SLOTS released counters (uint64) and the mapped flag
_MAPPED = 512  # byte offset of the flag the main process sets once it has mapped the ring


def enabled() -> bool:
    """Whether batches yielded in this process travel through slots (a DataLoader worker on Linux)."""
    if not switches().slots or not hasattr(os, "memfd_create"):
        return False
    return in_worker()


def shared(batches: Iterator[Any]) -> Iterator[Any]:
    """``batches`` with each batch copied into a free slot (in a DataLoader worker; else unchanged)."""
    if not enabled():
        return batches
    return (_to_slot(batch) for batch in batches)


def output_pool() -> SlotPool | None:
    """A pool whose arrays lie in slots, for a stream to gather into (in a DataLoader worker; else ``None``)."""
    return SlotPool() if enabled() else None


class SlotAllocator:
    """The allocator seam (``runtime.seams``) of shared slots: a pass's batch arrays in slots inside a
    DataLoader worker (``output_pool``), plain ``OutputPool`` arrays elsewhere. Wired by the dataset."""

    def __call__(self) -> Any:
        from dask_windows.runtime.batch import OutputPool

        return output_pool() or OutputPool()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SlotAllocator)

    def __hash__(self) -> int:
        return hash(SlotAllocator)


# -- worker side ---------------------------------------------------------------------------------


class SlotPool:
    """:class:`~dask_windows.runtime.batch.OutputPool`'s interface over slots: a batch is gathered straight into one.

    Each array starts a slot of room for it plus ``HEADROOM`` (targets and start rows, which
    :func:`shared` then copies in after it), so the batch's features are never copied again.
    When no slot is free (the loop keeps batches) the array comes from an ordinary pool.
    """

    # Features of at least this many bytes are gathered into ``take``'s array (one copy of the runs);
    # below it numpy's gather and a copy into the slot cost less than the calls around the gather.
    direct_bytes = DIRECT_BYTES

    def __init__(self) -> None:
        from dask_windows.runtime.batch import OutputPool

        self._fallback = OutputPool()

    def take(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An array of ``shape`` and ``dtype`` at the start of a free slot (else from the fallback pool)."""
        dtype = np.dtype(dtype)
        nbytes = _aligned(math.prod(shape) * dtype.itemsize)
        got = _ring_for(nbytes + max(HEADROOM, nbytes // 4), min_bytes=nbytes)
        if got is None:
            return self._fallback.take(shape, dtype)
        _register()
        raw = got[2]
        out = raw[: math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)
        _lent[out.ctypes.data] = out  # its slot's room after it is free for the batch's other tensors
        return out


class _Ring:
    """``SLOTS`` slots of ``slot_bytes`` in one memfd mapping, with this worker's bookkeeping."""

    def __init__(self, slot_bytes: int) -> None:
        self.slot_bytes = slot_bytes
        self.size = HEADER + SLOTS * slot_bytes
        self.fd = os.memfd_create("dask_windows-slots")
        os.ftruncate(self.fd, self.size)
        self.map = mmap.mmap(self.fd, self.size)
        whole = np.frombuffer(self.map, np.uint8)
        self.base = int(whole.ctypes.data)
        self.released = np.frombuffer(self.map, np.uint64, SLOTS, 0)  # written by the main process
        self.mapped = whole[_MAPPED : _MAPPED + 1]
        del whole
        self.sent = [0] * SLOTS  # copies pickled so far, per slot (this worker's count)
        self.held = [False] * SLOTS  # this worker still references the slot
        self.touched = [False] * SLOTS  # pages allocated (fallocate turns no-memory into an error)
        self.token = secrets.token_hex(8)
        self.pid = os.getpid()

    def take(self, nbytes: int) -> tuple[int, np.ndarray] | None:
        """A free slot and a uint8 view of its first ``nbytes`` (at most the slot); ``None`` when every slot is live."""
        nbytes = min(nbytes, self.slot_bytes)
        for slot in range(SLOTS):
            if self.held[slot] or int(self.released[slot]) != self.sent[slot]:
                continue
            start = HEADER + slot * self.slot_bytes
            if not self.touched[slot]:
                try:
                    os.posix_fallocate(self.fd, start, self.slot_bytes)
                except OSError as exc:  # no memory for it: torch's path from now on
                    log.debug("slot memory unavailable (%s); batches take torch's path", exc)
                    return None
                self.touched[slot] = True
            view = np.frombuffer(self.map, np.uint8, nbytes, start)
            self.held[slot] = True
            weakref.finalize(view, self._drop, slot)
            return slot, view
        return None

    def _drop(self, slot: int) -> None:
        self.held[slot] = False

    def locate(self, address: int) -> int | None:
        """The slot holding byte ``address``, or ``None`` outside this ring's slots."""
        offset = address - self.base - HEADER
        if 0 <= offset < SLOTS * self.slot_bytes:
            return offset // self.slot_bytes
        return None


_rings: list[_Ring] = []
_registered = False
_lent: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()  # SlotPool arrays, by address


def _register() -> None:
    """Pickle tensors with ``_reduce`` from now on (once per process)."""
    global _registered
    if not _registered:
        reduction.ForkingPickler.register(torch.Tensor, _reduce)
        _registered = True


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _ring_for(nbytes: int, min_bytes: int | None = None) -> tuple[_Ring, int, np.ndarray] | None:
    """A free slot of ``nbytes`` (or of at least ``min_bytes`` in an existing ring)."""
    least = nbytes if min_bytes is None else min_bytes
    for ring in sorted(_rings, key=lambda r: r.slot_bytes):
        if ring.slot_bytes < least:
            continue
        got = ring.take(nbytes)
        if got is not None:
            return ring, *got
    if len(_rings) >= MAX_RINGS or any(r.slot_bytes >= least for r in _rings):
        return None  # rings large enough exist and are busy: the loop holds batches
    try:
        ring = _Ring(-(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE)
    except OSError as exc:
        log.debug("no slot ring (%s); batches take torch's path", exc)
        return None
    _rings.append(ring)
    got = ring.take(nbytes)
    return None if got is None else (ring, *got)


def _to_slot(batch: Any) -> Any:
    """``batch`` (a tensor, or a tuple or list of them) copied into one slot; unchanged when it cannot be."""
    parts = list(batch) if isinstance(batch, (tuple, list)) else [batch]
    if not parts or not all(_fits(p) for p in parts):
        return batch
    sizes = [_aligned(p.numel() * p.element_size()) for p in parts]
    lent = _lent.pop(parts[0].data_ptr(), None)  # the features were gathered into a slot
    # In place only when the batch's features are that whole array (not a slice another batch shares):
    whole = lent is not None and parts[0].is_contiguous() and parts[0].numel() * parts[0].element_size() == lent.nbytes
    raw = lent.base if whole and lent is not None else None
    if raw is not None and sum(sizes) <= len(raw):  # the rest goes in after the features
        out, copied = [parts[0]], 1
    else:
        got = _ring_for(max(sum(sizes), ALIGN))
        if got is None:
            return batch
        _register()
        raw, out, copied = got[2], [], 0
    offsets = [sum(sizes[:i]) for i in range(copied, len(parts))]
    parts = parts[copied:]
    for p, at in zip(parts, offsets):
        src = p.numpy()
        dst = raw[at : at + src.nbytes].view(src.dtype).reshape(src.shape)
        np.copyto(dst, src)
        out.append(torch.from_numpy(dst))
    if isinstance(batch, tuple):
        return tuple(out)
    return out if isinstance(batch, list) else out[0]


def _fits(t: Any) -> bool:
    return (
        type(t) is torch.Tensor
        and t.device.type == "cpu"
        and t.layout == torch.strided
        and not t.requires_grad
        and t.dtype in _NUMPY
    )


_NUMPY = {
    torch.float16: np.float16,
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.int8: np.int8,
    torch.int16: np.int16,
    torch.int32: np.int32,
    torch.int64: np.int64,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
}


def _reduce(t: torch.Tensor) -> Any:
    """Pickle a slot tensor as its place in the ring; any other tensor as torch does."""
    from torch.multiprocessing.reductions import reduce_tensor

    if type(t) is torch.Tensor and t.device.type == "cpu" and not t.requires_grad and t.dtype in _NUMPY:
        storage = t.untyped_storage()
        address = storage.data_ptr()
        for ring in _rings:
            slot = ring.locate(address)
            if slot is None:
                continue
            fd = None if ring.mapped[0] else reduction.DupFd(ring.fd)
            ring.sent[slot] += 1
            where = (ring.token, fd, ring.pid, ring.fd, ring.size, slot, address - ring.base, storage.nbytes())
            layout = (str(t.dtype).removeprefix("torch."), tuple(t.shape), t.stride(), t.storage_offset())
            return _rebuild, (where, layout)
    return reduce_tensor(t)


# -- main side -----------------------------------------------------------------------------------


class _Mapped:
    """The main process's mapping of one worker's ring."""

    def __init__(self, fd: int, size: int, pid: int) -> None:
        self.map = mmap.mmap(fd, size)
        self.released = np.frombuffer(self.map, np.uint64, SLOTS, 0)
        self.lock = threading.Lock()
        self.pid = pid
        self.alive: int | None = None
        try:
            self.alive = os.pidfd_open(pid)
        except (OSError, AttributeError):
            pass
        np.frombuffer(self.map, np.uint8, 1, _MAPPED)[0] = 1  # later batches need not carry the fd

    def release(self, slot: int) -> None:
        with self.lock:
            self.released[slot] += np.uint64(1)

    def exited(self) -> bool:
        """Whether the worker owning the ring has exited (then only live tensors keep the mapping)."""
        if self.alive is None:
            return False
        import select

        poll = select.poll()  # (not select.select: it refuses descriptors past 1023, which a long run reaches)
        poll.register(self.alive, select.POLLIN)
        ready = poll.poll(0)
        return bool(ready)

    def close(self) -> None:
        if self.alive is not None:
            os.close(self.alive)
            self.alive = None


_mapped: dict[str, _Mapped] = {}
_mapped_lock = fork_safe_lock()


def _open(token: str, fd_handle: Any, pid: int, fd_number: int, size: int) -> _Mapped:
    received = fd_handle.detach() if fd_handle is not None else None
    try:
        with _mapped_lock:
            ring = _mapped.get(token)
            if ring is not None:
                return ring
            for old in [k for k, v in _mapped.items() if v.exited()]:
                _mapped.pop(old).close()  # its tensors still alive keep their own mapping
            fd = received
            if fd is None:  # a process other than the first receiver: borrow the worker's descriptor
                fd = os.open(f"/proc/{pid}/fd/{fd_number}", os.O_RDWR)
                received = fd
            ring = _mapped[token] = _Mapped(fd, size, pid)
            return ring
    finally:
        if received is not None:
            os.close(received)


def _rebuild(where: tuple, layout: tuple) -> torch.Tensor:
    """The tensor a worker pickled with ``_reduce``, over this process's mapping of its ring."""
    token, fd_handle, pid, fd_number, size, slot, offset, nbytes = where
    dtype, shape, stride, storage_offset = layout
    ring = _open(token, fd_handle, pid, fd_number, size)
    np_dtype = np.dtype(_NUMPY[getattr(torch, dtype)])
    storage = np.frombuffer(ring.map, np_dtype, nbytes // np_dtype.itemsize, offset)
    weakref.finalize(storage, ring.release, slot)  # the tensor and all its views keep `storage` alive
    return torch.from_numpy(storage).as_strided(shape, stride, storage_offset)


def in_slots(t: torch.Tensor) -> bool:
    """Whether ``t`` lies in a ring this process mapped (main side) or owns (worker side)."""
    address = t.untyped_storage().data_ptr()
    if any(r.locate(address) is not None for r in _rings):
        return True
    for ring in list(_mapped.values()):
        base = int(np.frombuffer(ring.map, np.uint8, 1).ctypes.data)
        if base + HEADER <= address < base + len(ring.map):
            return True
    return False


def _after_fork() -> None:
    """A forked child owns none of its parent's rings and mappings: drop them (the child's copies only)."""
    global _registered
    for mapped in _mapped.values():
        mapped.close()
    for ring in _rings:
        os.close(ring.fd)  # the child's copy: the ring lives on in its worker
    _mapped.clear()
    _rings.clear()
    if _registered:
        from torch.multiprocessing.reductions import reduce_tensor

        reduction.ForkingPickler.register(torch.Tensor, reduce_tensor)
        _registered = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
