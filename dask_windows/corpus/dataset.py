"""``CorpusDataset``: a foundation-model corpus as packed batches (wiring only).

At open ``ListSource`` gives each data set's series lengths and channels and ``items.build_units``
turns them into items; each epoch ``items.epoch_items`` orders them (exact per-data-set quotas),
``packing.pack`` packs them into sequences, ``planning.division`` shares them out and
``batches.batches`` reads and fills them. Epochs, resume (elastic too) and worker shares follow the
pass protocol (``passes``).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from dask_windows.corpus.batches import Layout, batches
from dask_windows.corpus.freqs import check_freq, freq_key
from dask_windows.corpus.items import LeftOut, Units, build_units, epoch_items
from dask_windows.corpus.packing import pack, unpacked
from dask_windows.corpus.source import ListSource
from dask_windows.corpus.work import EpochPlan, reader_work, split_to_context
from dask_windows.errors import ConfigError
from dask_windows.passes import PassProtocol
from dask_windows.planning.division import batches_per_rank, reader_share, worker_batch_range
from dask_windows.planning.elastic import batches_of_rest
from dask_windows.planning.resume import check_int
from dask_windows.planning.schedule import member_counts
from dask_windows.planning.world import World

__all__ = ["CorpusDataset", "CorpusSettings", "LeftOutSeriesWarning", "mix_corpora"]

log = logging.getLogger(__name__)


class LeftOutSeriesWarning(UserWarning):
    """Series of a corpus left out at open (shorter than ``min_length``, or too many channels)."""


@dataclass(frozen=True)
class CorpusSettings:
    """The settings every data set of one corpus shares (they decide a batch's shape)."""

    patch_size: int = 16
    patch_sizes: tuple[tuple[str, int], ...] | None = None
    max_length: int = 512
    min_length: int = 1
    sequence_tokens: int | None = None
    channels: str = "independent"
    max_channels: int | None = None
    pack: bool = True
    pack_window: int = 4096
    context_length: tuple[int, int] | None = None
    prediction_length: int = 0
    nan: str = "mask"
    batch_size: int = 8
    buffer_partitions: int = 8
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    return_index: bool = False
    read_ahead: int = 4

    @property
    def tokens(self) -> int:
        """Tokens per sequence."""
        return self.sequence_tokens or self.max_length // self.patch_size

    def check(self) -> None:
        p = check_int("patch_size", self.patch_size, 1)
        if check_int("max_length", self.max_length, 1) % p:
            raise ConfigError(f"max_length={self.max_length} must be a multiple of patch_size={p}")
        check_int("min_length", self.min_length, 1)
        if self.tokens * p < self.max_length and self.channels != "multivariate":
            raise ConfigError(
                f"sequence_tokens={self.tokens} x patch_size={p} holds fewer steps than max_length={self.max_length}; "
                "raise sequence_tokens or lower max_length"
            )
        if self.channels not in ("independent", "multivariate", "padded"):
            raise ConfigError(f"channels={self.channels!r} must be 'independent', 'multivariate' or 'padded'")
        if (self.channels == "padded") != (self.max_channels is not None):
            raise ConfigError(
                f"channels={self.channels!r} with max_channels={self.max_channels!r}: the padded view "
                "(channels='padded') needs max_channels=, the channels of every item's planes; the others take none"
            )
        if self.max_channels is not None:
            check_int("max_channels", self.max_channels, 1)
        keys: dict[str, str] = {}
        for freq, size in self.patch_sizes or ():
            same = keys.setdefault(freq_key(check_freq(freq, "a key of patch_sizes")), freq)
            if same != freq:
                raise ConfigError(f"patch_sizes keys {same!r} and {freq!r} name one frequency; give it once")
            if check_int(f"patch_sizes[{freq!r}]", size, 1) > p:
                raise ConfigError(
                    f"patch_sizes[{freq!r}]={size} is larger than patch_size={p}, the batch's patch width; "
                    "raise patch_size to the largest patch size"
                )
        if self.patch_sizes and self.context_length is not None:
            raise ConfigError("context_length=(lo, hi) with per-frequency patch_sizes is not supported; pass one")
        if self.nan not in ("mask", "keep"):
            raise ConfigError(f"nan={self.nan!r} must be 'mask' (filled with 0, observed_mask 0) or 'keep'")
        for name in ("batch_size", "pack_window", "buffer_partitions"):
            check_int(name, getattr(self, name), 1)
        check_int("prediction_length", self.prediction_length, 0)
        check_int("read_ahead", self.read_ahead, 0)
        if self.context_length is not None:
            lo, hi = self.context_length
            if self.channels == "multivariate":
                raise ConfigError(
                    "context_length=(lo, hi) needs items whose channels share their tokens; pass "
                    "channels='independent' or channels='padded' with it"
                )
            if not (0 < lo <= hi <= self.max_length) or lo % p or hi % p:
                raise ConfigError(
                    f"context_length={self.context_length} must be multiples of patch_size={p} with "
                    f"0 < lo <= hi <= max_length={self.max_length}"
                )


@dataclass(frozen=True)
class Member:
    """One data set of a corpus."""

    name: str
    source: ListSource
    units: Units
    left_out: LeftOut
    covariates: tuple[int, ...] = ()  # channels that are covariates (padded view)


def _series_patch(source: ListSource, settings: CorpusSettings) -> int | np.ndarray:
    """Steps per token of each series: its frequency's in ``patch_sizes``, else ``patch_size``."""
    if not settings.patch_sizes:
        return settings.patch_size
    sizes = {freq_key(f): p for f, p in settings.patch_sizes}  # "H" and "h" are one frequency
    per_freq = np.array([sizes.get(freq_key(f), settings.patch_size) for f in source.freqs], np.int64)
    return per_freq[source.freq_codes] if len(per_freq) else settings.patch_size


def _column_planes(source: ListSource, columns: list[str], settings: CorpusSettings) -> list[int]:
    """The planes of covariates read from list columns: after the target's channels, the same in every series."""
    real = source.lengths > 0
    own = np.unique(source.target_channels[real])
    extra = np.unique((source.channels - source.target_channels)[real])
    if len(own) > 1 or len(extra) > 1:
        raise ConfigError(
            f"{source.name}: covariates={columns} need the same number of target and covariate channels in every "
            f"series (targets: {own.tolist()}, covariates: {extra.tolist()}); split the data set by channel count"
        )
    if not len(own):
        return []
    return list(range(int(own[0]), int(own[0] + extra[0])))


def _check_covariates(covariates: Sequence[Any] | None, settings: CorpusSettings) -> tuple[int, ...]:
    """The covariate channels of a data set, checked against the padded view's planes."""
    if not covariates:
        return ()
    if settings.max_channels is None:
        raise ConfigError(
            f"covariates={list(covariates)} mark channels of an item's planes; pass channels='padded' with them"
        )
    out = tuple(sorted({check_int("covariates[...]", c) for c in covariates}))
    if out[-1] >= settings.max_channels:
        raise ConfigError(
            f"covariates={list(covariates)}: channel {out[-1]} is not below max_channels={settings.max_channels}"
        )
    return out


def _open_member(name: str, source: ListSource, settings: CorpusSettings) -> Member:
    units, left = build_units(
        source.lengths,
        source.channels,
        source.partition_series,
        independent=settings.channels == "independent",
        patch=_series_patch(source, settings),
        max_length=settings.max_length,
        min_length=settings.min_length,
        budget=settings.tokens,
        max_channels=settings.max_channels,
    )
    if left.series:
        padded = settings.max_channels is not None
        holds = f"max_channels={settings.max_channels}" if padded else f"sequence_tokens={settings.tokens} holds"
        knob = "max_channels" if padded else "sequence_tokens"
        warnings.warn(
            f"{source.name}: {left.short:,} of {len(source.lengths):,} series are shorter than min_length="
            f"{settings.min_length} steps ({left.short_steps:,} observations) and {left.wide:,} have more channels "
            f"than {holds} ({left.wide_steps:,} observations): left out; "
            f"lower min_length (shorter series are served left-padded) or raise {knob}",
            LeftOutSeriesWarning,
            stacklevel=3,
        )
    return Member(name, source, units, left)


class CorpusDataset(PassProtocol, IterableDataset):
    """Packed batches of a corpus of series stored one per row in list columns.

    Args:
        data: A ``ListSource`` or what it opens (Parquet/Arrow files, a folder, a ``datasets`` folder).
        target: The list column (``list<float>`` or ``list<list<float>>``, channels x time).
        freq: The data set's frequency where no ``freq`` column gives it.
        storage_options: Passed to fsspec.
        name: The data set's name (default: where it lives).
        freqs: A fixed frequency vocabulary (``freq_id`` = position); default: order of first appearance.
        patch_size: Steps per token, and the width of a batch's patches.
        patch_sizes: ``{freq: steps per token}`` for the frequencies with a smaller patch (Moirai's); the
            batch gains ``patch_size`` ``(B, S)`` (docs/corpora.md).
        max_length: Most steps of one item: a longer series is cut, from its end, into items of this many.
        min_length: Series shorter than this are left out (counted in ``left_out``, warned about at
            open); shorter than ``max_length`` they are served left-padded.
        sequence_tokens: Tokens per sequence (default ``max_length // patch_size``).
        channels: ``"independent"``: each channel its own univariate item; ``"multivariate"``: one item of
            all channels one after another; ``"padded"``: one item of all channels side by side, each a
            plane of the batch (docs/corpora.md).
        max_channels: Planes of the padded view; series of more channels are left out (counted).
        covariates: Channels that are covariates (padded view; the batch gains ``covariate_mask``):
            channel numbers, or names of list columns read as further channels after the target's.
        pack: Pack items into sequences (``sample_id`` tells them apart); else one item per sequence.
        pack_window: Items packed together.
        context_length: ``(lo, hi)`` steps (multiples of ``patch_size``), a length drawn per batch
            (unpacked: longer items keep their last steps) or per block of ``pack_window`` items
            (packed: longer items served as several samples).
        prediction_length: Steps at the end of each item flagged in ``prediction_mask`` (whole patches,
            at least one patch of context kept).
        nan: ``"mask"``: NaN values become 0 with ``observed_mask`` 0; ``"keep"``: left NaN (mask 0).
        batch_size: Sequences per batch.
        buffer_partitions: Partitions (row groups, record batches) whose items are shuffled together.
        shuffle: Shuffle partitions and items each epoch.
        seed: Seed of every order.
        drop_last: Leave out this rank's final partial batch.
        return_index: Add ``series_id`` and ``step`` (each token's first step) to the batch.
        read_ahead: Partitions read ahead on a thread (0: read in the consumer's thread).
        rank: This process's rank; default from ``torch.distributed``, else 0.
        world_size: Number of ranks; default from ``torch.distributed``, else 1.

    Attributes:
        names: Data set names; ``dataset_id`` in a batch indexes them.
        freqs: Frequencies; ``freq_id`` in a batch indexes them.
        counts: ``(M,)`` items of each data set per epoch.
        left_out: ``{name: LeftOut}``: series left out at open.
    """

    def __init__(
        self,
        data: Any,
        *,
        target: str = "target",
        freq: str | None = None,
        storage_options: dict | None = None,
        name: str | None = None,
        freqs: Sequence[str] | None = None,
        covariates: Sequence[int] | Sequence[str] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        patch_size: int = 16,
        patch_sizes: Mapping[str, int] | tuple[tuple[str, int], ...] | None = None,
        max_length: int = 512,
        min_length: int = 1,
        sequence_tokens: int | None = None,
        channels: str = "independent",
        max_channels: int | None = None,
        pack: bool = True,
        pack_window: int = 4096,
        context_length: tuple[int, int] | None = None,
        prediction_length: int = 0,
        nan: str = "mask",
        batch_size: int = 8,
        buffer_partitions: int = 8,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        return_index: bool = False,
        read_ahead: int = 4,
    ) -> None:
        super().__init__()
        if isinstance(patch_sizes, Mapping):  # kept as sorted pairs: the settings compare and hash
            patch_sizes = tuple(sorted((str(f), p) for f, p in patch_sizes.items()))
        # (each keyword by name: the defaults are CorpusSettings', test_corpus_keywords_are_the_settings checks)
        self.settings = CorpusSettings(
            patch_size=patch_size,
            patch_sizes=patch_sizes,
            max_length=max_length,
            min_length=min_length,
            sequence_tokens=sequence_tokens,
            channels=channels,
            max_channels=max_channels,
            pack=pack,
            pack_window=pack_window,
            context_length=context_length,
            prediction_length=prediction_length,
            nan=nan,
            batch_size=batch_size,
            buffer_partitions=buffer_partitions,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            return_index=return_index,
            read_ahead=read_ahead,
        )
        self.settings.check()
        columns = [c for c in covariates or () if isinstance(c, str)]  # covariates in their own list columns
        if columns and len(columns) != len(covariates or ()):
            raise ConfigError(f"covariates={list(covariates or ())}: give channel numbers or column names, not both")
        source = (
            data
            if isinstance(data, ListSource)
            else ListSource(data, target=target, covariates=columns, freq=freq, storage_options=storage_options)
        )
        planes = _column_planes(source, columns, self.settings) if columns else covariates
        member = replace(
            _open_member(name or source.name, source, self.settings),
            covariates=_check_covariates(planes, self.settings),
        )
        self._setup([member], None, None, (rank, world_size), freqs)

    def _setup(
        self,
        members: list[Member],
        weights: np.ndarray | None,
        items_per_epoch: int | None,
        world: tuple[int | None, int | None],
        freqs: Sequence[str] | None = None,
    ) -> None:
        self.members = members
        self.names = [m.name for m in members]
        sizes = np.array([m.units.num_items for m in members], np.int64)
        if sizes.sum() == 0 and len(members) > 1:
            raise ConfigError(
                f"{', '.join(self.names)}: no series of at least min_length={self.settings.min_length} steps; "
                "lower min_length"
            )
        w = sizes.astype(np.float64) if weights is None else weights
        total = int(sizes.sum()) if items_per_epoch is None else items_per_epoch
        self.counts = member_counts(w, total) if sizes.sum() else sizes  # no item at all: len() says why
        for m, count in zip(members, self.counts):
            if count and m.units.num_items == 0:
                raise ConfigError(f"data set {m.name!r} has no item but weight > 0; give it weight 0")
        self.freqs: list[str] = [check_freq(f, "freqs[...]") for f in freqs] if freqs is not None else []
        for m in members:
            for f in m.source.freqs:
                if f not in self.freqs and freqs is not None:
                    raise ConfigError(
                        f"{m.source.name} holds frequency {f!r}, which freqs={list(freqs)} does not list; "
                        "add it to freqs (its position is its freq_id)"
                    )
                if f not in self.freqs:
                    self.freqs.append(f)
        self._freq_ids = [np.array([self.freqs.index(f) for f in m.source.freqs], np.int64) for m in members]
        self.left_out = {m.name: m.left_out for m in members}
        self._init_passes(*world)  # epochs, ranks, resume state (see passes)

    # -- the pass protocol (see passes); the plan is rebuilt in each process -----------------------

    _process_local = ("_plan_cache",)
    _plan_cache: EpochPlan | None = None  # the latest epoch's plan (a pickled copy starts without)

    def _shape(self) -> tuple[int, int, bool]:
        return self.num_sequences(), self.settings.batch_size, self.settings.drop_last

    def _max_batches(self) -> None:
        return None  # an epoch's sequences depend on its packing: the state's epoch is checked as it is read

    @property
    def num_items(self) -> int:
        """Items per epoch (all data sets)."""
        return int(self.counts.sum())

    # -- the epoch plan -----------------------------------------------------------------------

    def plan(self, epoch: int) -> EpochPlan:
        """Epoch ``epoch``'s items in order and their sequences (a pure function of the settings)."""
        cached = self._plan_cache
        if cached is not None and cached.epoch == epoch:
            return cached
        s = self.settings
        if self.num_items == 0:
            raise ConfigError(
                f"{', '.join(self.names)}: no series of at least min_length={s.min_length} steps; lower min_length"
            )
        self._check_patch_sizes()
        member, item = epoch_items(
            [m.units for m in self.members], self.counts, s.seed, epoch, s.shuffle, s.buffer_partitions
        )
        tokens, unit, start, stop = (np.zeros(len(item), np.int64) for _ in range(4))
        for m, mem in enumerate(self.members):
            at = member == m if len(self.members) > 1 else slice(None)
            unit[at], start[at], stop[at] = mem.units.locate(item[at])
            per_token = 1 if s.channels == "padded" else mem.units.width[unit[at]]  # padded: channels in planes
            tokens[at] = per_token * -(-(stop[at] - start[at]) // mem.units.patch[unit[at]])
        blocks = np.arange(0, len(item) + s.pack_window, s.pack_window).clip(max=len(item))
        if s.pack and s.context_length is not None:  # each block's samples at most its drawn length
            member, item, unit, start, stop, blocks = split_to_context(
                member, item, unit, start, stop, s.context_length, s.patch_size, s.pack_window, s.seed, epoch
            )
            tokens = -(-(stop - start) // s.patch_size)
        if s.pack:
            ptr, entries = pack(tokens, s.tokens, blocks, s.seed, epoch)
        else:
            ptr, entries = unpacked(len(item))
        plan = EpochPlan(epoch, member, item, tokens, unit, start, stop, ptr, entries)
        self._plan_cache = plan
        return plan

    def _check_patch_sizes(self) -> None:
        """Refuse ``patch_sizes`` keys that name no frequency of the data (checked when the corpus is used,
        since a member of a mixture is opened with every member's keys)."""
        have = {freq_key(f) for m in self.members for f in m.source.freqs}
        unmatched = [f for f, _ in self.settings.patch_sizes or () if freq_key(f) not in have]
        if unmatched:
            raise ConfigError(
                f"patch_sizes keys {unmatched} match no frequency of {', '.join(self.names)} (frequencies: "
                f"{self.freqs}); key patch_sizes by the data's frequencies, or pass freq= where no freq column says it"
            )

    def num_sequences(self, epoch: int | None = None) -> int:
        return len(self.plan(self.epoch if epoch is None else epoch).sequence_ptr) - 1

    def packing_efficiency(self, epoch: int | None = None) -> float:
        """Share of an epoch's tokens that hold an item (packed: padding inside the sequences' budget)."""
        plan = self.plan(self.epoch if epoch is None else epoch)
        return float(plan.tokens.sum()) / float(max(self.num_sequences(plan.epoch), 1) * self.settings.tokens)

    # -- iterating ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        epoch, world = self._begin_pass()  # every DataLoader worker of this pass claims the same epoch
        num_sequences = self.num_sequences(epoch)
        s = self.settings
        elastic = self._resumer.elastic_share(epoch, world, self._shape())
        if elastic is not None:  # a state of another topology: this reader's part of the rest (planning.elastic)
            return self._elastic_batches(epoch, world, num_sequences, *elastic)
        num_batches = batches_per_rank(num_sequences, world.world_size, s.batch_size, s.drop_last)
        reader, skip = self._resumer.begin(epoch, world, num_batches)
        share = reader_share(num_sequences, reader, s.batch_size, s.drop_last)
        lo, hi = share.start_after(skip), share.hi
        first_batch = (lo - share.rank_start) // s.batch_size  # the rank's batch number
        return self._batches(epoch, lo, hi, first_batch)

    def _elastic_batches(
        self, epoch: int, world: World, num_sequences: int, pieces: tuple, origin: tuple[int, int], sizes: tuple
    ) -> Iterator[dict[str, torch.Tensor]]:
        """The sequences of old readers' streams (``pieces``) this reader yields, in batches of ``sizes``."""
        s = self.settings
        runs = []
        for r, w, a, b in pieces:  # (old rank, old worker, first, stop) of that old reader's sequences
            start = reader_share(num_sequences, World(r, origin[0], w, origin[1]), s.batch_size, s.drop_last).lo
            runs.append(np.arange(start + a, start + b, dtype=np.int64))
        sequences = np.concatenate(runs) if runs else np.zeros(0, np.int64)
        rest = self._resumer.elastic_pass["rest"]["pieces"] if self._resumer.elastic_pass else []
        first_batch = worker_batch_range(
            batches_of_rest(rest, world.world_size, s.batch_size), world.worker, world.num_workers
        )[0]
        return self._batches(epoch, 0, 0, first_batch, sequences, np.asarray(sizes, np.int64), elastic=True)

    def _batches(
        self,
        epoch: int,
        lo: int,
        hi: int,
        first_batch: int,
        sequences: np.ndarray | None = None,
        batch_rows: np.ndarray | None = None,
        elastic: bool = False,
    ) -> Iterator[dict[str, torch.Tensor]]:
        s = self.settings
        work = reader_work(self.plan(epoch), self.members, s, epoch, lo, hi, first_batch, sequences, batch_rows)
        layout = Layout(
            s.patch_size,
            s.prediction_length,
            s.nan,
            self._freq_ids_per_series(),
            [m.source.lengths for m in self.members],
            s.return_index,
            s.max_channels or 0,
            bool(s.patch_sizes),
            self._covariate_planes(),
        )
        arrays = batches(work, self._read, layout, s.read_ahead)
        try:
            for batch in arrays:
                self._resumer.step()
                yield {k: torch.from_numpy(v) for k, v in batch.items()}
        finally:
            arrays.close()  # the read-ahead thread is joined on an early break too
            if elastic:
                self._resumer.end_elastic(epoch)  # len() is the full epoch's again

    def _covariate_planes(self) -> list[np.ndarray] | None:
        """Per data set, ``(max_channels,)`` whether each plane is a covariate; ``None`` without covariates."""
        if not any(m.covariates for m in self.members):
            return None
        out = []
        for m in self.members:
            planes = np.zeros(self.settings.max_channels or 0, bool)
            planes[list(m.covariates)] = True
            out.append(planes)
        return out

    def _freq_ids_per_series(self) -> list[np.ndarray]:
        return [ids[m.source.freq_codes] for ids, m in zip(self._freq_ids, self.members)]

    def _read(self, key: tuple[int, int]) -> Any:
        member, partition = key
        return self.members[member].source.read(partition)

    # -- resume -------------------------------------------------------------------------------

    def _fingerprint(self) -> dict:
        s = self.settings
        return {
            "corpus": list(self.names),
            "files": [m.source.files for m in self.members],
            "series": [len(m.source.lengths) for m in self.members],
            "counts": [int(c) for c in self.counts],
            **({"covariates": [list(m.covariates) for m in self.members]} if self._covariate_planes() else {}),
            "settings": repr(replace(s, read_ahead=0))  # states saved before these two settings still load
            .replace(", max_channels=None", "")
            .replace(", patch_sizes=None", ""),
        }

    def summary(self) -> dict:
        """Per data set: series, items per epoch, and what was left out at open."""
        return {
            m.name: {
                "series": len(m.source.lengths),
                "items": m.units.num_items,
                "items_per_epoch": int(c),
                "left_out_short": m.left_out.short,
                "left_out_wide": m.left_out.wide,
                "left_out_observations": m.left_out.short_steps + m.left_out.wide_steps,
            }
            for m, c in zip(self.members, self.counts)
        }

    def report(self, *, values: bool = False, epoch: int | None = None, world_size: int | None = None) -> dict:
        """Per data set: what it holds, leaves out at open and an epoch does not serve (``corpus.report``;
        ``dask-windows inspect --corpus`` prints it); ``values=True`` reads the data to count missing values."""
        from dask_windows.corpus.report import corpus_report

        return corpus_report(self, values=values, epoch=epoch, world_size=world_size)

    def __repr__(self) -> str:
        shares = ", ".join(f"{n}={int(c):,}" for n, c in zip(self.names, self.counts))
        return f"CorpusDataset({shares}; batch_size={self.settings.batch_size})"


def mix_corpora(
    members: Mapping[str, CorpusDataset],
    weights: Mapping[str, float] | None = None,
    *,
    items_per_epoch: int | None = None,
    freqs: Sequence[str] | None = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> CorpusDataset:
    """One corpus of several data sets, each with an exact share of every epoch (``dw.mix`` of corpora).

    Args:
        members: ``{name: CorpusDataset}`` opened with the same settings (patch, lengths, packing...).
        weights: ``{name: weight >= 0}`` (a LOTSA-style weight map); default: in proportion to items.
        items_per_epoch: Items per epoch; default: the members' items together.
        freqs: A fixed frequency vocabulary (``freq_id`` = position), the same across runs and corpora;
            default: frequencies in order of first appearance.
    """
    from dask_windows.mixture import _weights

    if not isinstance(members, Mapping) or not members:
        raise ConfigError("mix() needs a non-empty {name: CorpusDataset} dict of members")
    names = list(members)
    first = members[names[0]].settings
    parts: list[Member] = []
    for name in names:
        ds = members[name]
        if not isinstance(ds, CorpusDataset):
            raise TypeError(f"member {name!r} is a {type(ds).__name__}; a corpus mixes CorpusDataset objects")
        if ds.settings != first:
            differ = [k for k in first.__dataclass_fields__ if getattr(ds.settings, k) != getattr(first, k)]
            raise ConfigError(
                f"member {name!r} differs from {names[0]!r} in {differ}; open every data set with the same settings"
            )
        parts.extend(replace(m, name=name if len(ds.members) == 1 else f"{name}/{m.name}") for m in ds.members)
    w = None if weights is None else _weights(weights, names)
    if w is not None and len(parts) != len(names):
        raise ConfigError("weights need members of one data set each; mix data sets, not mixtures")
    out = CorpusDataset.__new__(CorpusDataset)
    IterableDataset.__init__(out)
    out.settings = first
    total = None if items_per_epoch is None else check_int("items_per_epoch", items_per_epoch, 1)
    out._setup(parts, w, total, (rank, world_size), freqs)
    return out
