"""fastai / tsai ``DataLoaders`` over ``WindowDataset``s.

``WindowDataLoaders`` gives what fastai's and tsai's learners read (``len``, ``device``, ``dls.vars``,
``dls.len``, ``dls.c``, ``dls.d``) from the dataset's settings, without reading a batch. Batches are
tuples (``(x,)`` or ``(x, y)``, ``n_inp = 1``); each fastai epoch advances the dataset's epoch;
``one_batch`` and ``show_batch`` read from a copy. Trade-off: not ``TfmdDL`` s, so fastai's transforms,
``decode``, ``test_dl`` and ``export`` do not apply (normalise with ``normalize=``).
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator
from typing import Any

try:
    from fastai.data.core import DataLoaders
    from fastai.torch_core import to_device
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError("dask_windows.integrations.fastai needs fastai: pip install fastai") from exc

import torch

from dask_windows.integrations.loaders import window_loader

__all__ = ["WindowDL", "WindowDataLoaders"]


log = logging.getLogger(__name__)


class WindowDL:
    """One fastai-style loader over a ``WindowDataset``: tuples of tensors on ``device``.

    Args:
        dataset: A ``WindowDataset`` (its ``return_index`` must be off: fastai would take the index for a target).
        num_workers: DataLoader worker processes.
        device: Where batches go (``None``: left on the CPU until ``to``).
        **loader_kwargs: Passed to ``window_loader`` (``pin_memory``, ``multiprocessing_context``, ...).
    """

    def __init__(self, dataset: Any, num_workers: int = 0, device: Any = None, **loader_kwargs: Any) -> None:
        if dataset.spec.return_index:
            raise ValueError(
                "return_index=True adds the window start rows to each batch, which fastai would pass to the loss "
                "as a target; open the dataset with return_index=False for fastai"
            )
        self.dataset = dataset
        self.device = device
        self.num_workers = num_workers
        self.loader = window_loader(dataset, num_workers, stateful=False, **loader_kwargs)

    @property
    def bs(self) -> int:
        """Windows per batch."""
        return self.dataset.spec.batch_size

    @property
    def drop_last(self) -> bool:
        return self.dataset.spec.drop_last

    @property
    def n(self) -> int:
        """Windows in the dataset (all ranks)."""
        return self.dataset.num_windows

    def __len__(self) -> int:
        return len(self.dataset)

    def _batches(self, loader: Any) -> Generator[tuple, None, None]:
        for batch in loader:
            if isinstance(batch, dict):  # a workflow's named batch: the model takes it, the loss its target
                batch = (batch, batch["target"])
            batch = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
            yield to_device(batch, self.device) if self.device is not None else batch

    def __iter__(self) -> Iterator[tuple]:
        """One epoch; each pass takes the dataset's next epoch unless ``set_epoch`` chose one. The loop's
        wait for batches is measured (``dataset.stats()``) and the verdict logged at the epoch's end."""
        yield from self._batches(self.dataset.watch(self.loader))
        log.info("%s: %s", self.dataset.source.description, self.dataset.stats().verdict)

    def close(self) -> None:
        """Stop the loader's persistent worker processes now (a later epoch starts new ones).

        fastai's ``Learner`` holds reference cycles, so without this the workers stop only when the cycle
        collector runs, and torch's shutdown then waits about 5 s on each worker.
        """
        workers = getattr(self.loader, "_iterator", None)  # torch keeps persistent workers' iterator here
        self.loader._iterator = None
        if workers is not None:
            workers._shutdown_workers()

    def to(self, device: Any) -> WindowDL:
        """Move future batches to ``device``."""
        self.device = device
        return self

    def one_batch(self) -> tuple:
        """The first batch of the current epoch's order, read from a copy (the epoch does not advance)."""
        probe = self.dataset._with_grid(self.dataset.grid, "probe")
        probe.set_epoch(self.dataset.epoch)
        batches = self._batches(iter(probe))
        try:
            return next(batches)
        finally:
            batches.close()

    def show_batch(self, max_n: int = 9, ncols: int = 3, figsize: tuple | None = None, **kwargs: Any) -> Any:
        """Plot the first ``max_n`` windows of ``one_batch`` (channels as lines); returns the figure."""
        import matplotlib.pyplot as plt

        x = self.one_batch()[0].detach().cpu()
        if self.dataset.spec.layout == "NLC":
            x = x.transpose(1, 2)
        count = min(max_n, len(x))
        nrows = -(-count // ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=figsize or (4 * ncols, 2.5 * nrows), squeeze=False, **kwargs)
        for k, ax in enumerate(axes.flat):
            if k < count:
                for c, name in enumerate(self.dataset.spec.features):
                    ax.plot(x[k, c].numpy(), label=str(name))
            ax.set_axis_off() if k >= count else None
        axes.flat[0].legend(fontsize="small")
        return fig

    def new(self, **kwargs: Any) -> WindowDL:
        """fastai asks for a loader with other settings (``shuffle``, ``drop_last``); open the dataset with them."""
        raise NotImplementedError(
            f"WindowDL cannot rebuild itself with {sorted(kwargs)}; open a WindowDataset with those settings "
            "(shuffle=, drop_last=) and pass WindowDL(dataset) as dl="
        )

    def decode_batch(self, batch: Any, max_n: int = 9, **kwargs: Any) -> list:
        """Batches need no decoding: the windows of ``batch`` as a list of tuples."""
        return [tuple(t[i] for t in batch) for i in range(min(max_n, len(batch[0])))]


class WindowDataLoaders(DataLoaders):
    """fastai ``DataLoaders`` of ``WindowDL`` s, with tsai's ``vars``, ``len``, ``c``, ``d`` and ``cat``.

    Args:
        *loaders: ``WindowDL`` s, training first, then validation.
        c: Outputs of the model tsai builds (``dls.c``); default the number of targets, or of
            features without targets (the MVP reconstruction head replaces it anyway). Pass the
            number of classes for a classifier.
        device: Where batches go; default CUDA when available, else CPU.
    """

    n_inp = 1  # xb = b[:1], yb = b[1:]: without targets yb is empty (MVP fills it)

    def __init__(self, *loaders: WindowDL, c: int | None = None, device: Any = None, path: str = ".") -> None:
        if not loaders:
            raise ValueError("pass at least the training WindowDL")
        super().__init__(
            *loaders, path=path, device=device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
        )
        self._c = c

    @classmethod
    def from_datasets(
        cls,
        train: Any,
        valid: Any = None,
        *,
        num_workers: int = 0,
        c: int | None = None,
        device: Any = None,
        **kwargs: Any,
    ) -> WindowDataLoaders:
        """``DataLoaders`` of ``WindowDL(train)`` and ``WindowDL(valid)`` (e.g. ``from_datasets(*ds.split(valid=0.2))``).

        ``valid=None`` uses the training dataset for both; ``c`` and ``device`` as for the class; ``**kwargs``
        are passed to each ``WindowDL``.
        """
        loaders = [WindowDL(train, num_workers, **kwargs)]
        loaders.append(WindowDL(valid if valid is not None else train, num_workers, **kwargs))
        return cls(*loaders, c=c, device=device)

    @property
    def _spec(self) -> Any:
        return self.loaders[0].dataset.spec

    @property
    def vars(self) -> int:
        """Channels of ``x`` (tsai's ``c_in``)."""
        return len(self._spec.features)

    @property
    def len(self) -> int:
        """Window length (tsai's ``seq_len``)."""
        return self._spec.window

    @property
    def c(self) -> int:
        """Model outputs (tsai's ``c_out``)."""
        if self._c is not None:
            return self._c
        return len(self._spec.targets) or len(self._spec.features)

    @property
    def d(self) -> Any:
        """Shape of ``y`` after the batch axis as tsai reports it: ``None`` without targets, ``T`` for
        ``(B, T)`` (``horizon=0``), ``[T, H]`` for ``(B, T, H)``."""
        s = self._spec
        if not s.targets:
            return None
        return len(s.targets) if not s.horizon else [len(s.targets), s.horizon]

    @property
    def cat(self) -> bool:
        """Targets are values, not classes (tsai then picks an MSE loss)."""
        return False

    def one_batch(self) -> tuple:
        return self.train.one_batch()

    def close(self) -> None:
        """Stop every loader's worker processes (``WindowDL.close``); call it after ``fit`` with workers."""
        for loader in self.loaders:
            loader.close()

    def show_batch(self, **kwargs: Any) -> Any:
        return self.train.show_batch(**kwargs)
