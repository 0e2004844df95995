"""Weighted mixtures of window datasets: ``mix({"a": ds_a, "b": ds_b}, weights={...})``.

A mixture epoch is ``N = sum(counts)`` windows: member ``m`` gives exactly ``counts[m]``, its
weight's share rounded by largest remainders, interleaved by ``planning.schedule`` (every batch
holds each member within about two windows of its share). Each member is read as one endless
stream of its own epochs (``world_size=1``) laid end to end; mixture epoch ``E`` takes positions
``[E * counts[m], (E + 1) * counts[m])`` of it, so a small member repeats its epochs and a large
one spans several mixture epochs (docs/pretraining.md).

The trade-off: ranks and workers divide the mixture's sequence as ``planning.division`` divides a
dataset's, so counts, shares and resume are exact for any topology, but each reader reads the
partial units at both ends of its member ranges whole. Epochs, ``len()``, resume and pickling
follow the pass protocol (``passes``); members' epochs follow the mixture's (``member_epochs``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from dask_windows.dataset import WindowDataset
from dask_windows.errors import ConfigError
from dask_windows.passes import PassProtocol
from dask_windows.planning.division import batches_per_rank, reader_share
from dask_windows.planning.resume import check_int
from dask_windows.planning.schedule import labels, member_counts, prefix_counts
from dask_windows.planning.world import World
from dask_windows.runtime.streams import Chunks, reader_windows
from dask_windows.runtime.telemetry import rank_stats, watch_loader, watched
from dask_windows.speedups.slots import shared

__all__ = ["Mixture", "mix"]

# Settings every member must share: they decide the shape of a batch.
SHAPE_SETTINGS = ("window", "horizon", "layout", "return_index")


def mix(members: Mapping[str, WindowDataset], weights: Mapping[str, float] | None = None, **options: Any) -> Mixture:
    """A ``Mixture`` of ``members`` with ``weights`` (see ``Mixture`` for the options).

    Members that are ``CorpusDataset``s give one ``CorpusDataset`` (``corpus.mix_corpora``).
    """
    if isinstance(members, Mapping) and any(type(m).__name__ == "CorpusDataset" for m in members.values()):
        from dask_windows.corpus import mix_corpora

        return mix_corpora(members, weights, **options)  # type: ignore[arg-type, return-value]
    return Mixture(members, weights, **options)


def member_windows(member: WindowDataset, epoch: int, lo: int, hi: int, names: list | None = None) -> Iterator[tuple]:
    """Windows ``[lo, hi)`` of ``member``'s epoch ``epoch`` read as one reader (no ``drop_last``), in chunks.

    ``names``: filled with the keys of named batches (whose values are yielded); ``None``: they raise."""
    return reader_windows(member._stream_values().without_drop_last(), epoch, World(), lo, hi, names)


def _stream(member: WindowDataset, start: int, stop: int, names: list | None = None) -> Iterator[tuple]:
    """Positions ``[start, stop)`` of a member's endless stream of epochs laid end to end."""
    per_epoch = member.num_windows
    while start < stop:
        epoch, offset = divmod(start, per_epoch)
        end = min(stop, (epoch + 1) * per_epoch)
        yield from member_windows(member, epoch, offset, end - epoch * per_epoch, names)
        start = end


class Mixture(PassProtocol, IterableDataset):
    """Batches drawn from several ``WindowDataset``s, each with an exact share of every epoch.

    Args:
        members: ``{name: dataset}``; every dataset has the same ``window``, ``horizon``, ``layout``,
            ``return_index`` and number of features (and targets, or none). Their own ``seed``,
            ``shuffle`` and ``buffer_partitions`` decide the order of their windows; their
            ``batch_size`` is only the chunk they are read in.
        weights: ``{name: weight >= 0}``; default: proportional to each member's ``num_windows``.
        windows_per_epoch: Windows of every epoch, shared by weight (largest remainders); default:
            the sum of the members' ``num_windows``.
        batch_size: Windows per batch; default: the first member's.
        drop_last: Leave out this rank's final partial batch.
        return_source: Append each window's member number (int64 ``(B,)``, index in ``names``; named
            batches get it as ``"source"``).
        rank: This process's rank; default from ``torch.distributed``, else 0.
        world_size: Number of ranks; default from ``torch.distributed``, else 1.

    Members yielding named batches (``workflow=wf.named()``) give named batches; every member must
    yield the same fields, dtypes, shapes and columns (``workflow.mixing``).

    Attributes:
        names: Member names, in the order of the source labels.
        counts: ``(M,)`` windows of each member in every epoch.
        keys: The keys of the named batches, or ``None`` (tuples).
    """

    def __init__(
        self,
        members: Mapping[str, WindowDataset],
        weights: Mapping[str, float] | None = None,
        *,
        windows_per_epoch: int | None = None,
        batch_size: int | None = None,
        drop_last: bool = False,
        return_source: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(members, Mapping) or not members:
            raise ConfigError("mix() needs a non-empty {name: WindowDataset} dict of members")
        self.names = list(members)
        self.members = [members[n] for n in self.names]
        for name, member in zip(self.names, self.members):
            if not isinstance(member, WindowDataset):
                raise TypeError(f"member {name!r} is a {type(member).__name__}; mix WindowDataset objects")
        self.keys: list[str] | None = None
        if any(getattr(m, "_workflow", None) is not None for m in self.members):
            from dask_windows.workflow.mixing import named_keys

            self.keys = named_keys(self.names, self.members)  # named batches: fields checked there
        if self.keys is None:
            _check_shapes(self.names, self.members)
        sizes = np.array([m.num_windows for m in self.members], dtype=np.int64)
        w = sizes.astype(np.float64) if weights is None else _weights(weights, self.names)
        total = int(sizes.sum()) if windows_per_epoch is None else check_int("windows_per_epoch", windows_per_epoch, 1)
        self.counts = member_counts(w, total)
        self.num_windows = int(self.counts.sum())
        if self.num_windows == 0:
            raise ConfigError(f"windows_per_epoch={total} gives every member 0 windows; pass a larger one")
        self.batch_size = check_int(
            "batch_size", self.members[0].spec.batch_size if batch_size is None else batch_size, 1
        )
        self.drop_last = bool(drop_last)
        self.return_source = bool(return_source)
        self._init_passes(rank, world_size)  # epochs, ranks, resume state (see passes)

    # -- public API ---------------------------------------------------------------------------

    def member_epochs(self, epoch: int) -> list[tuple[int, int]]:
        """Per member, the first and last of its own epochs that mixture ``epoch`` reads from."""
        out = []
        for member, count in zip(self.members, self.counts):
            start, stop = epoch * int(count), (epoch + 1) * int(count)
            out.append((start // member.num_windows, max(stop - 1, start) // member.num_windows))
        return out

    def __iter__(self) -> Iterator[Any]:
        epoch, world = self._begin_pass()  # every DataLoader worker of this pass claims the same epoch
        elastic = self._resumer.elastic_share(epoch, world, self._shape())
        if elastic is not None:  # a state of another topology: this reader's part of the rest (see elastic)
            pieces, (old_world, old_workers), sizes = elastic
            ranges = []
            for r, w, lo, hi in pieces:
                start = self.reader_range(World(r, old_world, w, old_workers))[0]
                ranges.append((start + lo, start + hi))
            return watched(self, shared(self._recut(epoch, ranges, sizes)))
        num_batches = batches_per_rank(self.num_windows, world.world_size, self.batch_size, self.drop_last)
        reader, skip = self._resumer.begin(epoch, world, num_batches)
        return watched(self, shared(self._batches(epoch, *self.reader_range(reader, skip))))  # slots in workers

    def stats(self, all_ranks: bool = False) -> Any:
        """The mixture's ``telemetry.Stats``: the loop's wait on the mixture, its members' stages summed."""
        return rank_stats(self, all_ranks)

    def watch(self, loader: Any) -> Iterator[Any]:
        """``loader``'s batches, the loop's wait measured in this process (as ``WindowDataset.watch``)."""
        return watch_loader(self, loader)

    # -- internals ----------------------------------------------------------------------------

    def reader_range(self, reader: World, skip_batches: int = 0) -> tuple[int, int]:
        """Epoch positions ``[lo, hi)`` that ``reader`` yields after ``skip_batches`` batches."""
        share = reader_share(self.num_windows, reader, self.batch_size, self.drop_last)
        return share.start_after(skip_batches), share.hi

    def _shape(self) -> tuple[int, int, bool]:
        return self.num_windows, self.batch_size, self.drop_last

    def _chunks(self, epoch: int, lo: int, hi: int) -> Iterator[tuple]:
        """Positions ``[lo, hi)`` of ``epoch`` in batches of ``batch_size``, as tuples of tensors."""
        first, last = prefix_counts(self.counts, lo), prefix_counts(self.counts, hi)
        names: list | None = None if self.keys is None else []  # (filled with the keys self.keys already holds)
        streams = [
            Chunks(_stream(member, epoch * int(n) + int(a), epoch * int(n) + int(b), names))
            for member, n, a, b in zip(self.members, self.counts, first, last)
        ]
        try:
            for start in range(lo, hi, self.batch_size):
                member, _ = labels(self.counts, start, min(start + self.batch_size, hi))
                yield self._assemble(member, streams)
        finally:
            for stream in streams:
                stream.close()

    def _batches(self, epoch: int, lo: int, hi: int) -> Iterator[Any]:
        for batch in self._chunks(epoch, lo, hi):
            self._resumer.step()  # counted before the consumer gets it, as WindowDataset does
            yield self._yielded(batch)

    def _yielded(self, batch: tuple) -> Any:
        """A batch's tensors as yielded: the named batch, the tuple, or the one tensor."""
        if self.keys is not None:
            return dict(zip([*self.keys, "source"] if self.return_source else self.keys, batch))
        return batch[0] if len(batch) == 1 else batch

    def _recut(self, epoch: int, ranges: list[tuple[int, int]], sizes: tuple[int, ...]) -> Iterator[Any]:
        stream = Chunks(batch for lo, hi in ranges for batch in self._chunks(epoch, lo, hi))
        try:
            for size in sizes:
                batch = stream.take(size)
                self._resumer.step()
                yield self._yielded(batch)
        finally:
            stream.close()
            self._resumer.end_elastic(epoch)

    def _assemble(self, member: np.ndarray, streams: list[Chunks]) -> tuple:
        columns: list[torch.Tensor] | None = None
        for m in np.unique(member):
            at = torch.from_numpy(np.flatnonzero(member == m))
            part = streams[m].take(len(at))
            if columns is None:
                # on the members' device (``WindowDataset(device=...)``), else the host
                columns = [torch.empty((len(member), *p.shape[1:]), dtype=p.dtype, device=p.device) for p in part]
            for out, p in zip(columns, part):
                if out.dtype != p.dtype:
                    raise ConfigError(
                        f"member {self.names[m]!r} yields {p.dtype} where another member yields {out.dtype}; "
                        "mix members whose targets have one dtype"
                    )
                out[at] = p
        assert columns is not None
        if self.return_source:
            columns.append(torch.from_numpy(member.astype(np.int64)).to(columns[0].device))
        return tuple(columns)

    def _fingerprint(self) -> dict:
        return {
            "mixture": list(self.names),
            "members": [m._fingerprint() for m in self.members],
            "counts": [int(c) for c in self.counts],
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
        }

    def __repr__(self) -> str:
        shares = ", ".join(f"{n}={int(c):,}" for n, c in zip(self.names, self.counts))
        return f"Mixture({shares}; num_windows={self.num_windows:,}, batch_size={self.batch_size})"


def _weights(weights: Mapping[str, float], names: list[str]) -> np.ndarray:
    unknown = sorted(set(weights) - set(names))
    missing = [n for n in names if n not in weights]
    if unknown or missing:
        raise ConfigError(f"weights name {unknown or missing} but the members are {names}; give one weight per member")
    w = np.array([weights[n] for n in names], dtype=np.float64)
    if not np.all(np.isfinite(w)) or (w < 0).any() or w.sum() <= 0:
        raise ConfigError(f"weights {dict(weights)} must be finite, >= 0 and not all 0")
    return w


def _check_shapes(names: list[str], members: list[WindowDataset]) -> None:
    first = members[0].spec
    for name, member in zip(names[1:], members[1:]):
        s = member.spec
        differ = [k for k in SHAPE_SETTINGS if _as_yielded(member, k) != _as_yielded(members[0], k)]
        if len(s.features) != len(first.features):
            differ.append("number of features")
        if bool(s.targets) != bool(first.targets) or len(s.targets) != len(first.targets):
            differ.append("number of targets")
        if s.device != first.device:
            differ.append("device")
        if differ:
            raise ConfigError(
                f"member {name!r} differs from {names[0]!r} in {differ}: a mixture's batches need one shape; "
                "open every member with the same window, horizon, layout, return_index, device and channel counts"
            )


def _as_yielded(member: WindowDataset, setting: str) -> Any:
    """A shape setting of ``member`` as its batches show it (a workflow reads ``lookback`` rows more than it yields)."""
    value = getattr(member.spec, setting)
    return value - member.spec.lookback if setting == "window" else value
