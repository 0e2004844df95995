"""``WindowStats``: a Lightning callback logging where the training loop's time went (``telemetry``).

At each training epoch's end it logs the dataset's ``Stats`` (``data/wait_share``, ``data/input_bound``,
``data/first_batch_s``, ``data/open_s``) and the verdict, over the ranks under DDP; with DataLoader
workers it times the loop itself (the wait between one batch's end and the next one's start).
"""

from __future__ import annotations

import logging
import time
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError:  # pragma: no cover - the older package name
    try:
        import pytorch_lightning as pl  # type: ignore[no-redef]
    except ImportError as exc:
        raise ImportError("dask_windows.integrations.lightning_stats needs Lightning: pip install lightning") from exc

from dask_windows.runtime.telemetry import Stats, judge

__all__ = ["WindowStats"]

log = logging.getLogger(__name__)


class WindowStats(pl.Callback):
    """Log the training dataset's telemetry each epoch.

    Args:
        dataset: The ``WindowDataset`` (default: the trainer's datamodule's ``train_set``).
        prefix: Prefix of the logged names.
    """

    def __init__(self, dataset: Any = None, prefix: str = "data/") -> None:
        self.dataset, self.prefix = dataset, prefix
        self.last: Stats | None = None
        self._reset()

    def _reset(self) -> None:
        self._ended: int | None = None
        self._started = 0
        self._wait_ns = self._step_ns = self._batches = 0

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._reset()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._started = time.perf_counter_ns()
        if self._ended is not None:
            self._wait_ns += self._started - self._ended
            self._batches += 1

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._ended = time.perf_counter_ns()
        self._step_ns += self._ended - self._started

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        dataset = self.dataset if self.dataset is not None else getattr(trainer.datamodule, "train_set", None)
        if dataset is None or not hasattr(dataset, "stats"):
            return
        stats = dataset.stats(all_ranks=trainer.world_size > 1)
        verdict = stats.verdict
        if stats.batches == 0:  # iterated in DataLoader workers: the loop as this callback timed it
            verdict = judge(self._wait_ns * 1e-9, self._step_ns * 1e-9, self._batches, None)
        self.last = stats
        pl_module.log_dict(
            {
                self.prefix + "wait_share": float(verdict.wait_share),
                self.prefix + "input_bound": float(verdict.input_bound),
                self.prefix + "first_batch_s": float(stats.first_batch_seconds),
                self.prefix + "open_s": float(stats.open_seconds),
            }
        )
        slowest = "" if stats.slowest_rank is None else f" (slowest rank: {stats.slowest_rank})"
        log.info("epoch %d data: %s%s", trainer.current_epoch, verdict, slowest)
