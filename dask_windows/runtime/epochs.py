"""Which epoch each pass over a dataset uses: advanced per pass, agreed by every DataLoader worker.

Frameworks (Lightning, fastai) iterate a loader once per epoch and never call
``set_epoch`` on an ``IterableDataset``, and a plain ``DataLoader`` with
workers iterates copies of the dataset that the main process never sees. So
the epoch is counted where the passes happen, in one 64-bit word of shared
memory (a one-element torch tensor in shared memory: inherited by forked
workers, passed by handle to spawn/forkserver workers, freed with the last
process holding it, so nothing outlives a crash).

The word holds ``(token, epoch)``: the epoch of the latest pass and the token
of the pass that claimed it. A pass started in the main process always claims
the next epoch. A DataLoader worker's token identifies its pass: every worker
of one pass shares the loader iterator's base seed (``seed - id`` of
``get_worker_info()``, drawn afresh by each non-persistent iterator) and has
iterated its copy of the dataset equally often (persistent workers iterate
once per pass). The first worker of a pass to start finds a foreign token and
claims ``epoch + 1``; the others find their token and use that epoch. Workers
racing to claim compute the same word from the same previous word, so the
claim needs no lock: the word is read and written whole (one aligned 8-byte
load or store). ``set_epoch`` and ``load_state_dict`` pin the epoch: the next
pass uses it as is, which is how an explicit ``set_epoch`` still wins.

The trade-off: each process counts its own passes, so ranks agree on the
epoch as long as each rank iterates its loader equally often (every framework
does: one pass per epoch); an extra ``iter(loader)`` that is thrown away also
counts as a pass. Passes of one dataset must not overlap in time (two live
iterators of loaders with workers over the same dataset object).
"""

from __future__ import annotations

from typing import Any

import torch

from dask_windows.errors import ConfigError

__all__ = ["MAX_EPOCH", "EpochCounter", "worker_token"]

#: Epochs are kept in the low 32 bits of the shared word.
MAX_EPOCH = 2**31 - 1
_PINNED = 0  # the next pass uses the word's epoch as is (set_epoch, load_state_dict, a new dataset)
_MAIN = 1  # claimed by a pass in the main process (num_workers=0)
_MASK = 2**32 - 1


def worker_token(base_seed: int, passes: int) -> int:
    """The token of a DataLoader worker's pass: equal for every worker of one pass, not ``_PINNED``/``_MAIN``.

    Args:
        base_seed: The loader iterator's base seed (``info.seed - info.id``).
        passes: How often this worker's copy of the dataset has been iterated, this pass included.
    """
    return hash((int(base_seed), int(passes))) % (2**31 - 2) + 2


class EpochCounter:
    """The epoch of each pass over one dataset, shared by the process and its DataLoader workers.

    Args:
        epoch: The epoch the first pass uses.
    """

    def __init__(self, epoch: int = 0) -> None:
        self._word = torch.zeros(1, dtype=torch.int64).share_memory_()
        self.pin(epoch)

    def _read(self) -> tuple[int, int]:
        word = int(self._word.numpy()[0])
        return word >> 32, word & _MASK

    def _write(self, token: int, epoch: int) -> None:
        self._word.numpy()[0] = (token << 32) | epoch

    @property
    def epoch(self) -> int:
        """The epoch of the latest pass, or the pinned epoch the next pass will use."""
        return self._read()[1]

    def pin(self, epoch: int) -> None:
        """The next pass uses ``epoch`` (``set_epoch``); the passes after it count on from there."""
        if epoch > MAX_EPOCH:
            raise ConfigError(f"epoch={epoch} is larger than {MAX_EPOCH}, the largest epoch counted")
        self._write(_PINNED, int(epoch))

    def begin_pass(self, token: int | None = None) -> int:
        """Claim the epoch of a pass that starts now and return it.

        Args:
            token: ``worker_token`` of a DataLoader worker's pass; ``None`` in the main process,
                where every call is a new pass.
        """
        seen, epoch = self._read()
        if token is not None and seen == token:
            return epoch  # another worker of this pass claimed it
        if seen != _PINNED:
            epoch += 1
            if epoch > MAX_EPOCH:
                raise ConfigError(f"epoch {epoch} is larger than {MAX_EPOCH}; call set_epoch() with a smaller one")
        self._write(_MAIN if token is None else token, epoch)
        return epoch

    def __repr__(self) -> str:
        seen, epoch = self._read()
        return f"EpochCounter(epoch={epoch}, {'pinned' if seen == _PINNED else 'claimed'})"

    def __copy__(self) -> Any:
        return EpochCounter(self.epoch)  # a copied dataset (split) counts its own passes
