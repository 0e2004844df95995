"""Which epoch each pass over a dataset uses: advanced per pass, agreed by every DataLoader worker.

The epoch is counted where the passes happen, in one shared 64-bit word ``(token, epoch)`` (a shared
torch tensor). A pass in the main process claims the next epoch; a worker's token identifies its pass
(the loader's base seed and the copy's pass count): the first worker of a pass claims ``epoch + 1``,
the others find their token, and racing workers write the same word, so no lock is needed.
``set_epoch`` and ``load_state_dict`` pin the next pass's epoch. Trade-off: ranks agree as long as each
iterates its loader equally often (a discarded ``iter(loader)`` counts), and passes must not overlap.
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
    """The epoch of each pass over one dataset, shared by the process and its DataLoader workers
    (``epoch``: the first pass's)."""

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
        """Claim the epoch of a pass that starts now and return it (``token``: ``worker_token`` of a
        worker's pass; ``None`` in the main process, where every call is a new pass)."""
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
