"""The pass protocol ``WindowDataset``, ``Mixture`` and ``CorpusDataset`` share, written once.

Each ``iter()`` (in the training process, or in every DataLoader worker of one pass) is a *pass*:
it claims the epoch after the previous pass's unless ``set_epoch`` or ``load_state_dict`` pinned
one (``runtime.epochs``); ``len()`` is the batches every rank yields, whatever ``num_workers``
(``planning.division``); resume states go through one ``planning.resume.Resumer``; a worker's
pickled copy carries the ranks and leaves out ``_process_local`` (``workerwatch``: a forkserver
worker ends with the training process).
"""

from __future__ import annotations

from typing import ClassVar

from dask_windows.passes.workerwatch import record_pickler, watch_pickler
from dask_windows.planning.division import batches_per_rank
from dask_windows.planning.resume import Resumer, check_int
from dask_windows.planning.world import World
from dask_windows.runtime.detect import detect_worker, in_worker, resolve_ranks, worker_info
from dask_windows.runtime.epochs import EpochCounter, worker_token

__all__ = ["PassProtocol"]


class PassProtocol:
    """Epochs, ``len()``, resume state, ranks and pickling of a dataset iterated in passes; subclasses
    call ``_init_passes(rank, world_size)`` in ``__init__`` and define ``_fingerprint()`` and ``_shape()``."""

    #: Whether a loader-scope state of another ``world_size`` or ``num_workers`` resumes (``planning.elastic``).
    _elastic: ClassVar[bool] = True
    #: Attributes of this process that a pickled copy (a DataLoader worker's) leaves out.
    _process_local: ClassVar[tuple[str, ...]] = ()

    _explicit_world: tuple[int | None, int | None]
    _ranks: tuple[int, int]
    _epochs: EpochCounter
    _worker_passes: int
    _resumer: Resumer

    def _init_passes(self, rank: int | None, world_size: int | None) -> None:
        self._explicit_world = (rank, world_size)
        self._ranks = self._resolve_ranks()
        self._epochs = EpochCounter(0)  # shared with DataLoader workers: each pass takes the next epoch
        self._worker_passes = 0  # passes over this copy inside one DataLoader worker process
        self._resumer = Resumer()

    # -- what a dataset supplies --------------------------------------------------------------

    def _fingerprint(self) -> dict:
        """What identifies this dataset's epochs (recorded in a state, compared on load)."""
        raise NotImplementedError

    def _shape(self) -> tuple[int, int, bool]:
        """``(units per epoch, batch_size, drop_last)``: what the division of the current epoch depends on."""
        raise NotImplementedError

    def _epoch_changes(self, epoch: int | None) -> None:
        """The next pass's epoch is pinned to ``epoch`` (``None``: a state is about to be loaded), so what
        was prepared for another epoch can go (``WindowDataset``: a first buffer read ahead)."""

    def _max_batches(self) -> int | None:
        """Batches of a whole epoch: a state claiming more is refused at load (``None``: not checked)."""
        units, batch_size, _ = self._shape()
        return -(-units // batch_size)

    # -- topology -----------------------------------------------------------------------------

    def _resolve_ranks(self) -> tuple[int, int]:
        return resolve_ranks(self._explicit_world, getattr(self, "_ranks", (0, 1)))

    def _topology(self) -> tuple[int, int]:
        """``(rank, world_size)`` resolved now and kept (a pickled copy takes them along)."""
        self._ranks = self._resolve_ranks()
        return self._ranks

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self._resolve_ranks()[0]

    @property
    def world_size(self) -> int:
        """Number of ranks sharing each epoch."""
        return self._resolve_ranks()[1]

    # -- epochs -------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch of the current (or latest) pass, or the one ``set_epoch`` chose for the next pass."""
        return self._epochs.epoch

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self._epochs.pin(check_int("epoch", epoch))
        self._epoch_changes(self._epochs.epoch)

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` for the next pass (without it each pass takes the epoch after the
        previous pass's); the same ``(seed, epoch)`` gives the same batches."""
        self.epoch = check_int("epoch", epoch)
        self._resumer.forget(self.epoch)
        self._topology()

    def _begin_pass(self) -> tuple[int, World]:
        """Claim the epoch of a pass that starts now: ``(epoch, this reader's World)`` (every DataLoader
        worker of one pass claims the same epoch)."""
        rank, world_size = self._topology()
        worker, num_workers = detect_worker()
        info = worker_info()
        if info is None:
            epoch = self._epochs.begin_pass()
            self._resumer.forget(epoch)
        else:
            self._worker_passes += 1
            watch_pickler(self)  # a forkserver worker: end when the training process does
            epoch = self._epochs.begin_pass(worker_token(info.seed - info.id, self._worker_passes))
        return epoch, World(rank, world_size, worker, num_workers)

    # -- length -------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Exactly how many batches this rank yields per epoch, whatever ``num_workers`` is (during an
        elastic resume, the state's batches plus those this rank yields of the rest)."""
        world_size = self._topology()[1]
        if self._elastic:
            info = worker_info()  # a change of num_workers alone is seen only inside the workers
            workers = None if info is None else info.num_workers
            resumed = self._resumer.elastic_len(self.epoch, world_size, workers, self._shape())
            if resumed is not None:
                return resumed
        units, batch_size, drop_last = self._shape()
        return batches_per_rank(units, world_size, batch_size, drop_last)

    # -- resume -------------------------------------------------------------------------------

    def state_dict(self, batches: int | None = None, num_workers: int | None = None) -> dict:
        """Where the current epoch stands, as a small dict to save with the model checkpoint (the same
        for every rank).

        Without arguments the dataset counts what it yielded itself (also under torchdata's
        ``StatefulDataLoader``); with a plain ``DataLoader`` and workers, pass what the loop took.

        Args:
            batches: Batches the DataLoader yielded in the current pass over it (counted from 0 each
                time the loader is iterated; batches a resume skipped are added).
            num_workers: The DataLoader's ``num_workers`` (required with ``batches``).

        Raises:
            ConfigError: Two passes are in progress (the state would be ambiguous).
        """
        world = World(*self._resolve_ranks(), *detect_worker())
        shape = self._shape() if self._elastic else None
        return self._resumer.save(
            self._fingerprint(), self.epoch, world, len(self), in_worker(), batches, num_workers, shape
        )

    def load_state_dict(self, state: dict) -> None:
        """Resume the epoch ``state`` was saved in, after the batches it had already yielded.

        Every pass over that epoch yields the remaining batches in the uninterrupted order. A
        loader-scope state of another ``world_size`` or ``num_workers`` resumes elastically where
        the dataset allows: the rest is divided between the new readers, each window once, in
        another order (``planning.elastic``).

        Raises:
            ConfigError: The state comes from another dataset or configuration.
        """
        self._epoch_changes(None)
        world_size = self._resolve_ranks()[1]
        max_batches = self._max_batches()
        self.epoch = self._resumer.load(
            state, self._fingerprint(), world_size, elastic=self._elastic, max_batches=max_batches
        )

    # -- pickling -----------------------------------------------------------------------------

    def __getstate__(self) -> dict:
        # DataLoader workers started by spawn/forkserver get a pickled copy: take the ranks of an
        # initialised torch.distributed along, since the workers cannot detect them.
        state = self.__dict__.copy()
        state["_ranks"] = self._resolve_ranks()
        for name in self._process_local:
            state.pop(name, None)
        return record_pickler(state)  # forkserver workers end with this process (workerwatch)
