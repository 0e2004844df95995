"""A ``LightningDataModule`` for ``WindowDataset``: train/valid from ``split``, DDP, mid-epoch resume.

Lightning never calls ``set_epoch`` on an ``IterableDataset``: the dataset advances its epoch each pass,
on every rank and worker alike. With torchdata the loaders are ``StatefulDataLoader`` s, which Lightning
checkpoints, so ``Trainer.fit(ckpt_path=...)`` resumes mid-epoch exactly. Lightning's warning about an
``IterableDataset`` with ``__len__`` is filtered (that message only): ours is exact.
"""

from __future__ import annotations

import warnings
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError:  # pragma: no cover - depends on what is installed
    try:
        import pytorch_lightning as pl  # type: ignore[no-redef]
    except ImportError as exc:
        raise ImportError(
            "dask_windows.integrations.lightning needs Lightning: pip install lightning (or pytorch-lightning)"
        ) from exc

from dask_windows.integrations.loaders import window_loader

__all__ = ["WindowDataModule"]


def _quiet_len_warning() -> None:
    """Filter Lightning's warning about ``__len__`` of an ``IterableDataset`` (exact for ours).

    Added when a loader is made, just before Lightning checks it (a filter added once at import
    would not survive code that restores the warning filters, as pytest does after each test).
    """
    warnings.filterwarnings("ignore", message=r"Your `IterableDataset` has `__len__` defined\.")


class WindowDataModule(pl.LightningDataModule):
    """Train and validation loaders over ``WindowDataset``s.

    Either pass ``train`` (and optionally ``valid``) datasets, or one dataset with ``split``, the
    keyword arguments of ``WindowDataset.split`` (``{"valid": 0.2, "embargo": 512}``), applied once.

    Args:
        num_workers: DataLoader workers of each loader (0 reads on the dataset's prefetch thread).
        stateful: Use torchdata's ``StatefulDataLoader`` (``None``: when installed; needed for
            mid-epoch resume from Lightning checkpoints).
        multiprocessing_context: How workers start; default ``"forkserver"`` (see ``loaders``).
        **loader_kwargs: Other ``DataLoader`` arguments (``pin_memory``, ``persistent_workers``).
    """

    def __init__(
        self,
        train: Any,
        valid: Any = None,
        *,
        split: dict | None = None,
        num_workers: int = 0,
        stateful: bool | None = None,
        multiprocessing_context: Any = None,
        **loader_kwargs: Any,
    ) -> None:
        super().__init__()
        if split is not None:
            if valid is not None:
                raise ValueError("pass either valid= or split=, not both")
            train, valid = train.split(**split)
        self.train_set, self.valid_set = train, valid
        if valid is not None:  # without it Lightning sees no val_dataloader and validates nothing
            self.val_dataloader = self._val_dataloader  # type: ignore[method-assign]
        self._loader_args = dict(
            num_workers=num_workers, stateful=stateful, multiprocessing_context=multiprocessing_context, **loader_kwargs
        )

    def train_dataloader(self) -> Any:
        """The training loader (Lightning asks once per fit and keeps it for every epoch)."""
        _quiet_len_warning()
        return window_loader(self.train_set, **self._loader_args)

    def _val_dataloader(self) -> Any:
        """The validation loader (only defined with a validation dataset)."""
        _quiet_len_warning()
        return window_loader(self.valid_set, **self._loader_args)
