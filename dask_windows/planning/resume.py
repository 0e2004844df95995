"""Mid-epoch resumption: what a state holds, how it is checked, and each reader's skip.

An epoch's plan is a pure function of the dataset, ``(seed, epoch)`` and the topology, so a
position is a count of batches, saved as a dict of plain values: in **loader scope** the batches
the rank's DataLoader yielded this epoch (each worker's share follows by ``round_robin``, and the
resumed workers take over the original roles, rotated to the worker due next), in **worker scope**
(torchdata's ``StatefulDataLoader``) those one worker yielded. A state records the dataset's
``fingerprint``; another dataset or configuration refuses it."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError
from dask_windows.planning.division import round_robin, worker_batch_range, worker_batches
from dask_windows.planning.resume_math import ORDER_SETTINGS as ORDER_SETTINGS
from dask_windows.planning.resume_math import fingerprint
from dask_windows.planning.world import World

__all__ = ["FORMAT", "VERSION", "Resumer", "fingerprint", "round_robin"]

log = logging.getLogger(__name__)

FORMAT = "dask_windows.WindowDataset"
VERSION = 1
SCOPES = ("loader", "worker")


@dataclass
class _Progress:
    """This process's current pass over one reader's batches."""

    epoch: int
    worker: int
    role: int
    num_workers: int
    start: int
    done: int
    pid: int = field(default_factory=os.getpid)  # a DataLoader worker forked mid-pass does not own it


def check_int(name: str, value: object, minimum: int = 0) -> int:
    """``value`` as an int (numpy ints too), or a ``ConfigError`` when it is not one ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigError(f"{name}={value!r} must be an int >= {minimum}")
    return int(value)


class Resumer:
    """The one owner of a dataset's resume state: a loaded state (``load``), used up by the next pass over
    its epoch (``begin``; in the main process it stays until ``forget``, as workers iterate copies), and
    the batches counted (``step``) that ``save`` turns into a state."""

    def __init__(self) -> None:
        self.pending: dict | None = None
        self.progress: _Progress | None = None  # the most recent pass
        self.live: list[_Progress] = []  # passes begun and not yet finished, closed or dropped
        self.elastic_pass: dict | None = None  # the rest an elastic pass of this process divides

    # -- loading ------------------------------------------------------------------------------

    def load(
        self, state: Any, expected: dict, world_size: int, elastic: bool = False, max_batches: int | None = None
    ) -> int:
        """Validate ``state`` against this dataset; keep it; return its epoch.

        ``max_batches``: a whole epoch's batches (a state claiming more is refused). With ``elastic``, a
        loader-scope state of another topology is kept for ``elastic_share`` to re-divide.
        """
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ConfigError(
                f"not a WindowDataset state (format {state.get('format') if isinstance(state, dict) else None!r}, "
                f"expected {FORMAT!r}); pass the dict returned by WindowDataset.state_dict()"
            )
        keys = ("dataset", "world_size", "scope", "epoch", "num_workers", "batches")
        missing = [k for k in keys if k not in state or (k == "dataset" and not isinstance(state[k], dict))]
        if missing:
            raise ConfigError(
                f"the state lacks {missing}; pass the dict returned by WindowDataset.state_dict() unchanged"
            )
        if state.get("version") != VERSION:
            raise ConfigError(
                f"state version {state.get('version')!r} is not supported (this dask_windows reads version {VERSION}); "
                "resume with the dask_windows release that saved it, or start the epoch over"
            )
        differ = [
            f"{key}: {state['dataset'].get(key)!r} in the state, {value!r} here"
            for key, value in expected.items()
            if state["dataset"].get(key) != value and (key != "files" or "files" in state["dataset"])
        ]  # a state saved before file identities were recorded has no "files"
        if "piece_order" in state["dataset"]:  # saved by the piece order (pieces_per_partition > 1), now retired
            differ.insert(
                0,
                f"the state was saved by the piece order (pieces_per_partition="
                f"{state['dataset'].get('pieces_per_partition')!r}), which is no longer served",
            )
        check_int("state['world_size']", state["world_size"], minimum=1)  # '1' or 1.0 is not a world size
        regroup = elastic and state.get("scope") == "loader"
        if state["world_size"] != world_size and not regroup:
            differ.append(f"world_size: {state['world_size']} in the state, {world_size} here")
        if "rest" in state and not regroup:
            differ.append("the state is of an elastic resume, which this dataset does not support")
        if differ:
            raise ConfigError(
                "the state was saved by a different dataset or configuration ("
                + "; ".join(differ)
                + "); resume with the same data, settings and world size, or start the epoch over without the state"
            )
        if state.get("scope") not in SCOPES:
            raise ConfigError(f"state scope {state.get('scope')!r} must be one of {SCOPES}")
        for key in ("epoch", "batches") + (("worker", "role") if state["scope"] == "worker" else ()):
            check_int(f"state[{key!r}]", state.get(key))
        check_int("state['num_workers']", state.get("num_workers"), minimum=1)
        if max_batches is not None and state["batches"] > max_batches:
            raise ConfigError(
                f"state['batches']={state['batches']:,} is more than a whole epoch of this dataset holds "
                f"({max_batches:,} batches); pass the dict returned by WindowDataset.state_dict() unchanged"
            )
        self.pending = dict(state)
        self.progress = None
        self.elastic_pass = None
        return int(state["epoch"])

    # -- elastic resume -----------------------------------------------------------------------

    def elastic_share(
        self, epoch: int, world: World, shape: tuple[int, int, bool]
    ) -> tuple[tuple, tuple[int, int], tuple[int, ...]] | None:
        """Start a pass of an elastic resume: ``(pieces, origin, sizes)`` this reader yields (``None`` unless
        a loaded state of ``epoch`` resumes elastically); ``shape``: ``(num_windows, batch_size, drop_last)``."""
        from dask_windows.planning.elastic import divide, is_elastic

        state = self.pending if self.pending is not None and self.pending["epoch"] == epoch else None
        if state is None or not is_elastic(state, world.world_size, world.num_workers):
            return None
        pieces, origin = self._rest(state, shape)
        share = divide(pieces, world, shape[1])
        self.pending = None  # used up by this pass
        self.progress = _Progress(epoch, world.worker, world.worker, world.num_workers, 0, 0)
        self.elastic_pass = {"epoch": epoch, "rest": {"pieces": [list(p) for p in pieces], "origin": list(origin)}}
        self.elastic_pass["counted"] = int(state["batches"])  # for len(): the state's batches, then the rest's
        return share.pieces, origin, share.sizes

    def elastic_len(
        self, epoch: int, world_size: int, num_workers: int | None, shape: tuple[int, int, bool]
    ) -> int | None:
        """``len()`` of an elastic epoch: the state's ``batches`` plus this rank's batches of the rest
        (``None`` unless a loaded state of ``epoch`` resumes elastically or such a pass is in progress)."""
        from dask_windows.planning.elastic import batches_of_rest, is_elastic

        done = getattr(self, "elastic_pass", None)
        due = self.pending is not None and self.pending["epoch"] == epoch  # a state not yet used
        if done is not None and done["epoch"] == epoch and "counted" in done and not done.get("ended") and not due:
            return done["counted"] + batches_of_rest(done["rest"]["pieces"], world_size, shape[1])
        state = self.pending
        if state is None or state["epoch"] != epoch or state["scope"] != "loader":
            return None
        if not is_elastic(state, world_size, num_workers):
            return None
        pieces, _ = self._rest(state, shape)
        return int(state["batches"]) + batches_of_rest(pieces, world_size, shape[1])

    def end_elastic(self, epoch: int) -> None:
        """The elastic pass of ``epoch`` finished or was closed: ``len()`` is the full epoch's again."""
        done = getattr(self, "elastic_pass", None)
        if done is not None and done["epoch"] == epoch:
            done["ended"] = True

    def _rest(self, state: dict, shape: tuple[int, int, bool]) -> tuple[list, tuple[int, int]]:
        from dask_windows.planning.elastic import rest_from_state

        if state["scope"] != "loader":
            raise ConfigError(
                "a state saved inside one DataLoader worker (StatefulDataLoader) cannot be resumed with another "
                "world size or num_workers; save with state_dict(batches=K, num_workers=W) in the training loop"
            )
        return rest_from_state(state, round_robin, *shape)

    def forget(self, epoch: int) -> None:
        """``set_epoch(epoch)``: a loaded state of another epoch no longer applies."""
        elastic = getattr(self, "elastic_pass", None)
        if elastic is not None and elastic["epoch"] != epoch:
            self.elastic_pass = None
        if self.pending is not None and self.pending["epoch"] != epoch:
            if epoch < self.pending["epoch"]:
                log.warning(
                    "set_epoch(%d) goes back before the loaded state's epoch %d; the state is dropped and "
                    "epoch %d starts from its beginning",
                    epoch,
                    self.pending["epoch"],
                    epoch,
                )
            self.pending = None

    # -- iterating ----------------------------------------------------------------------------

    def begin(self, epoch: int, world: World, num_batches: int) -> tuple[World, int]:
        """Start a pass: ``(reader, skip_batches)``, ``world`` with the worker whose role (plan and seeds)
        this worker takes over, and that role's batches already yielded (``num_batches``: ``len(ds)``)."""
        role, skip = world.worker, 0
        state = self.pending if self.pending is not None and self.pending["epoch"] == epoch else None
        if state is not None:
            role, skip = _resume_point(state, world, num_batches)
            self.pending = None  # used up by this pass
        self.progress = _Progress(epoch, world.worker, role, world.num_workers, skip, skip)
        return World(world.rank, world.world_size, role, world.num_workers), skip

    def step(self, progress: _Progress | None = None) -> None:
        """Count one batch yielded by pass ``progress`` (default: the most recent pass)."""
        progress = self.progress if progress is None else progress
        if progress is not None:
            progress.done += 1

    def track(self, progress: _Progress) -> None:
        """Count ``progress`` as a live pass until ``end`` (callers that call ``end`` when it finishes)."""
        self.live = [*getattr(self, "live", []), progress]

    def end(self, progress: _Progress) -> None:
        """Pass ``progress`` finished, was closed or dropped (idempotent): an older live pass is current again."""
        self.live = [p for p in getattr(self, "live", []) if p is not progress]
        if progress is self.progress and self.live:
            self.progress = self.live[-1]

    # -- saving -------------------------------------------------------------------------------

    def save(
        self,
        identity: dict,
        epoch: int,
        world: World,
        num_batches: int,
        in_worker: bool,
        batches: int | None = None,
        num_workers: int | None = None,
        shape: tuple[int, int, bool] | None = None,
    ) -> dict:
        """The state of the current position (see ``WindowDataset.state_dict``).

        Args:
            identity: The dataset's ``fingerprint``.
            batches: Batches the DataLoader yielded in its current pass (loader scope), or ``None``
                to use this process's own count; ``num_workers`` is then required.
            shape: ``(num_windows, batch_size, drop_last)``, for a state inside an elastic resume.
        """
        state = {"format": FORMAT, "version": VERSION, "dataset": identity, "world_size": world.world_size}
        rest = self._elastic_rest(epoch, world.world_size, num_workers if batches is not None else None, shape)
        if rest is not None:  # inside an elastic resume: the state records the pieces being divided
            if batches is not None:
                taken, readers = check_int("batches", batches), max(check_int("num_workers", num_workers or 1), 1)
            elif self.progress is not None and self.progress.epoch == epoch and self.progress.num_workers == 1:
                taken, readers = self.progress.done, 1
            else:
                raise ConfigError(
                    "inside an elastic resume, save with state_dict(batches=K, num_workers=W): a worker's own "
                    "count cannot describe the division of the rest of the epoch"
                )
            return {**state, "scope": "loader", "epoch": epoch, "num_workers": readers, "batches": taken, "rest": rest}
        if batches is not None:
            if num_workers is None:
                raise ConfigError(
                    f"state_dict(batches={batches}) also needs num_workers=, the DataLoader's num_workers: "
                    "each worker's share of the batches depends on it"
                )
            readers = max(check_int("num_workers", num_workers), 1)
            offset = self._pass_start(epoch, readers)
            taken = offset + check_int("batches", batches)
            if taken > num_batches:
                raise ConfigError(
                    f"batches={batches}"
                    + (f" (+{offset} skipped by the resume)" if offset else "")
                    + f" is more than the {num_batches} batches of this rank's epoch; count the batches the "
                    "DataLoader yielded in the current pass over it"
                )
            return {**state, "scope": "loader", "epoch": epoch, "num_workers": readers, "batches": taken}
        live = [p for p in getattr(self, "live", []) if p.pid == os.getpid()]
        if len(live) > 1 and batches is None:
            raise ConfigError(
                f"state_dict() is ambiguous: {len(live)} passes over this dataset are in progress (iter(ds) was "
                "called again before the first pass ended); finish or close the other iterator (it.close(), or "
                "drop it), or pass state_dict(batches=K, num_workers=W) for the pass you mean"
            )
        if len(live) == 1 and batches is None:
            epoch = live[0].epoch  # the pass in progress, though a later pass (a peek) advanced the epoch
        if self.progress is not None and self.progress.epoch == epoch:
            p = self.progress
            if p.num_workers == 1:
                return {**state, "scope": "loader", "epoch": epoch, "num_workers": 1, "batches": p.done}
            scope = {"scope": "worker", "worker": p.worker, "role": p.role}
            return {**state, **scope, "epoch": epoch, "num_workers": p.num_workers, "batches": p.done}
        if self.pending is not None and self.pending["epoch"] == epoch:
            return {**self.pending, "dataset": identity}
        if self.progress is None and not in_worker:
            raise ConfigError(
                "state_dict() cannot see what a DataLoader with workers consumed: this process never iterated the "
                "dataset (the workers iterate copies). Pass state_dict(batches=K, num_workers=W) with K the batches "
                "the loader yielded in its current pass, or use torchdata's StatefulDataLoader, which asks each worker"
            )
        return {**state, "scope": "loader", "epoch": epoch, "num_workers": world.num_workers, "batches": 0}

    def _elastic_rest(
        self, epoch: int, world_size: int, num_workers: int | None, shape: tuple[int, int, bool] | None
    ) -> dict | None:
        """The pieces an elastic pass of ``epoch`` divides (begun here, or due by the loaded state)."""
        from dask_windows.planning.elastic import is_elastic

        done = getattr(self, "elastic_pass", None)
        if done is not None and done["epoch"] == epoch and (self.pending is None or self.pending["epoch"] != epoch):
            return done["rest"]
        state = self.pending
        if state is None or state["epoch"] != epoch or shape is None or not is_elastic(state, world_size, num_workers):
            return None
        pieces, origin = self._rest(state, shape)
        return {"pieces": [list(p) for p in pieces], "origin": list(origin)}

    def _pass_start(self, epoch: int, readers: int) -> int:
        """Batches of ``epoch`` a resume skipped before the current pass of the DataLoader."""
        state = self.pending
        if state is None or state["epoch"] != epoch:
            p = self.progress
            # Iterated here (num_workers=0): the pass began where its resume put it.
            return p.start if p is not None and p.epoch == epoch and p.num_workers == readers == 1 else 0
        if state["num_workers"] != readers:
            raise ConfigError(
                f"state_dict(num_workers={readers}) but the loaded state was saved with num_workers="
                f"{state['num_workers']}; a resumed epoch must keep the DataLoader's num_workers"
            )
        if state["scope"] != "loader" and readers > 1:
            raise ConfigError(
                "the loaded state came from one DataLoader worker (StatefulDataLoader); save with "
                "StatefulDataLoader.state_dict() too, or start the epoch over to count batches yourself"
            )
        return int(state["batches"])


def _resume_point(state: dict, world: World, num_batches: int) -> tuple[int, int]:
    """``(role, skip_batches)`` of DataLoader worker ``world.worker`` resuming ``state``."""
    readers = world.num_workers
    if state["num_workers"] != readers:
        raise ConfigError(
            f"the state was saved with num_workers={state['num_workers']} (0 and 1 are the same) but this "
            f"DataLoader has num_workers={readers}; resume with the same num_workers: each worker's batches "
            "depend on it"
        )
    if state["scope"] == "worker":
        if state["worker"] != world.worker:
            raise ConfigError(
                f"the state belongs to DataLoader worker {state['worker']} but was loaded in worker {world.worker}; "
                "restore worker states through StatefulDataLoader.load_state_dict"
            )
        role, skip = int(state["role"]), int(state["batches"])
        b0, b1 = worker_batch_range(num_batches, role, readers)
        if skip > b1 - b0:
            raise ConfigError(f"the state says worker {role} yielded {skip} batches but it has only {b1 - b0}")
        return role, skip
    consumed, next_worker = round_robin(worker_batches(num_batches, readers), int(state["batches"]))
    role = (next_worker + world.worker) % readers
    return role, int(consumed[role])
