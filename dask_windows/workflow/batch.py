"""What a dataset with a workflow yields: today's tuple, or a named batch for models with covariates.

The tuple (default) is ``x`` (continuous then categorical outputs as float32 channels), ``y`` and the
index when asked. The named batch (``Workflow.named()``) is a dict of ``BATCH_KEYS`` (fields and dtypes:
docs/workflows.md), carried as it is by collation, ``DevicePrefetcher`` and the framework adapters.
Gathering stays one strided gather of float32 channels plus the targets' (the series code rides as the
last target column); this module slices, so ``past_cont`` and ``target`` are views (``.contiguous()``
before ``.view``). The categorical codes, the last feature channels (``WindowSpec.code_features``), are
kept by the buffer in the narrowest integer holding every code (``apply.copy_dtype``), gathered by
``Gatherer.codes_at`` and widened here to ``code_dtype`` (not with ``"narrow"``: ``widen_codes``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError
from dask_windows.workflow.core import Workflow

__all__ = ["BATCH_KEYS", "CODE_KEYS", "SERIES_CODE", "Emitter", "NamedBatches", "invert_target", "widen_codes"]

SERIES_CODE = "__series_code__"
BATCH_KEYS = ("past_cont", "past_cat", "static_cont", "static_cat", "future_cont", "future_cat", "target",
              "target_loc", "target_scale")  # fmt: skip
CODE_KEYS = ("past_cat", "static_cat", "future_cat")  # the categorical fields (``code_dtype``)


@dataclass
class NamedBatches:
    """``WindowDataset(workflow=wf.named(...))``: named batches (see the module docstring)."""

    wf: Workflow
    index: bool = False
    series_id: bool = True
    scale_target: bool = True
    code_dtype: str = "int64"


def widen_codes(batch: dict, dtype: Any = None) -> dict:
    """``batch`` (a named batch) with its categorical fields (``past_cat``, ``static_cat``, ``future_cat``)
    as ``dtype`` (default ``torch.int64``), the other fields as they are: a new dict.

    For batches of ``named(code_dtype="narrow")``, widened where they are used: on the GPU,
    ``DevicePrefetcher(loader, "cuda", transform=widen_codes)`` sends 1 byte a code (int8) and
    widens on the device. A field already of ``dtype`` is the same tensor.
    """
    import torch

    dtype = torch.int64 if dtype is None else dtype
    return {k: v.to(dtype) if k in CODE_KEYS else v for k, v in batch.items()}


def invert_target(prediction: Any, batch: dict, workflow: Any = None) -> Any:
    """``prediction`` (shaped like ``batch["target"]``) back in the target's units.

    Args:
        prediction: ``(B, T, H)`` or ``(B, T)``, numpy or torch.
        batch: The named batch it was predicted for (its ``target_loc`` and ``target_scale``).
        workflow: The workflow (or ``Workflow.named(...)``) that made the batch: with it every
            transformation of the target (``Log1p``, ``Transform``) is undone after the scale
            (``Workflow.invert_target``). Without it only the scale is, which is the units only
            when no transformation writes the target.
    """
    if workflow is not None:
        wf = workflow.wf if isinstance(workflow, NamedBatches) else workflow
        return wf.invert_target(prediction, batch)
    loc, scale = batch["target_loc"], batch["target_scale"]
    if prediction.ndim == 3:
        loc, scale = loc[..., None], scale[..., None]
    return prediction * scale + loc


class Emitter:
    """Turns a gathered batch (``x`` of ``window + lookback`` rows, ``y``, start rows) into what is yielded."""

    def __init__(
        self, wf: Workflow, named: NamedBatches | None, lookback: int, layout: str, horizon: int, has_y: bool,
        return_index: bool, code_dtype: str | None = None,
    ) -> None:  # fmt: skip
        self.wf, self.named, self.lookback, self.layout = wf, named, lookback, layout
        self.horizon, self.has_y, self.return_index = horizon, has_y, return_index
        n = len(wf.series_keys or [])
        st = wf.statics.state if wf.statics is not None else None
        self.static_cont = np.zeros((n, 0), np.float32)  # (series, S)
        # the categorical fields' dtype (``code_dtype``: what ``named(code_dtype="narrow")`` stands for, ``apply.bind``)
        self.code_dtype = np.dtype(code_dtype or (named.code_dtype if named is not None else np.int64))
        self.static_cat = np.zeros((n, 0), self.code_dtype)  # (series, Q)
        if st and len(st["numeric"]):
            self.static_cont = np.ascontiguousarray(np.asarray(st["numeric"], np.float32).T)
        if st and len(st["categorical"]):
            self.static_cat = np.ascontiguousarray(np.asarray(st["categorical"], self.code_dtype).T)
        cats = set(wf.categorical)
        self.future_cont = [i for i, c in enumerate(wf.known) if c not in cats]  # positions among known
        self.future_cat = [i for i, c in enumerate(wf.known) if c in cats]
        self.normalizers = [wf.normalizer(t) for t in wf.target]
        # whether a target's scale refuses a series the fit did not see (else code -1 takes the global row)
        self.refuses_unseen = any(op is not None and op.unseen == "raise" for op in self.normalizers)
        self.num_cont, self.num_cat, self.num_target = len(wf.continuous), len(wf.categorical), len(wf.target)
        # (series + 1, 2) loc and scale of each target by series code, the global row last (code -1: unseen)
        self.scales = [_scale_table(op, col, n) for op, col in zip(self.normalizers, wf.target)]
        # (series + 1, T) each, the same by target: a batch's ``target_loc`` and ``target_scale`` are one take each
        self.target_loc = np.zeros((n + 1, self.num_target), np.float32)
        self.target_scale = np.ones((n + 1, self.num_target), np.float32)
        for j, table in enumerate(self.scales):
            if table is not None:
                self.target_loc[:, j], self.target_scale[:, j] = table.T
        self._zero_size: dict[int, dict] = {}  # batch size -> the fields without values (``_fixed``)
        self.fits = wf._fits  # the workflow's fits when the dataset was built (``__call__`` refuses a refit)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_zero_size": {}}  # a worker makes its own

    def __call__(
        self, x: np.ndarray, y: np.ndarray | None, rows: np.ndarray | None, codes: np.ndarray | None = None
    ) -> Any:
        """The batch of gathered ``x``, ``y``, start rows and, for a named batch, the ``(B, K, L + lookback)``
        int64 codes gathered on their own (``WindowSpec.code_features``; ``x`` then holds the other channels)."""
        import torch

        if self.wf._fits != self.fits:
            raise ConfigError(
                "the workflow was fitted again after this WindowDataset was built on it: rows read ahead or kept "
                "across epochs (Workflow(cache_bytes=)) hold the old statistics; build a new WindowDataset (and "
                "DataLoader) after a refit, or fit a copy of the workflow (Workflow.load of a saved one)"
            )
        p = self.lookback
        if rows is not None and p:
            rows = rows + p
        if self.named is None:
            if p:
                x = np.ascontiguousarray(x[:, :, p:] if self.layout == "NCL" else x[:, p:, :])
            out = [torch.from_numpy(x)]
            if y is not None:
                out.append(torch.from_numpy(y))
            if self.return_index and rows is not None:
                out.append(torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64)))
            return out[0] if len(out) == 1 else tuple(out)
        return self.named_batch(x, y, rows, torch, codes)

    def codes(self, x: np.ndarray) -> np.ndarray:
        """``(B, K, L)`` categorical codes cast from a gathered ``x``'s last channels: where the runtime
        did not gather them on their own (no categories: ``K = 0``)."""
        p, c, k = self.lookback, self.num_cont, self.num_cat
        if not k:
            return np.zeros((len(x), 0, x.shape[2] - p), self.code_dtype)
        return x[:, c : c + k, p:].astype(self.code_dtype)  # codes are small integers: exact in float32

    def _fixed(self, b: int, torch: Any) -> dict:
        """The fields of a batch of ``b`` windows that hold no value (no statics, no horizon, no target...),
        made once per batch size: zero-size tensors, so sharing them between batches shares nothing."""
        found = self._zero_size.get(b)
        if found is None:
            t, h, s, q = self.num_target, self.horizon, self.static_cont.shape[1], self.static_cat.shape[1]
            shapes = {
                "static_cont": ((b, 0), np.float32, not s),
                "static_cat": ((b, 0), self.code_dtype, not q),
                "future_cont": ((b, 0, h), np.float32, not (h and self.future_cont)),
                "future_cat": ((b, 0, h), self.code_dtype, not (h and self.future_cat)),
                "target": (((b, 0, h) if h else (b, 0)), np.float32, not t),
                "target_loc": ((b, 0), np.float32, not t),
                "target_scale": ((b, 0), np.float32, not t),
            }
            found = {
                k: torch.from_numpy(np.zeros(shape, dtype)) for k, (shape, dtype, empty) in shapes.items() if empty
            }
            self._zero_size[b] = found
        return found

    def named_batch(
        self, x: np.ndarray, y: np.ndarray | None, rows: np.ndarray | None, torch: Any, codes: np.ndarray | None = None
    ) -> dict:
        p, c, t, h = self.lookback, self.num_cont, self.num_target, self.horizon
        assert y is not None  # (the series code is the last target: ``apply.bind``)
        b = len(x)
        code = (y[:, -1, 0] if h else y[:, -1]).astype(np.int64)  # (B,) series code of each window
        # Each numpy call below that copies (fancy indexing, a large cast) lets go of the GIL, and getting it back
        # waits for the reader threads (the workflow's operations): fields without values are made once (_fixed).
        fixed = self._fixed(b, torch)
        batch = {"past_cont": torch.from_numpy(x[:, :c, p:])}  # a view of the gathered batch: no second copy
        if codes is None:  # cast from x's last channels (the runtime gathered them as float32)
            codes = self.codes(x)
        elif codes.dtype != self.code_dtype:  # gathered from a narrower copy (``apply.copy_dtype``): widened
            codes = codes[:, :, p:].astype(self.code_dtype)
        elif p:  # the lookback rows dropped: contiguous, as the cast made it
            codes = np.ascontiguousarray(codes[:, :, p:])
        batch["past_cat"] = torch.from_numpy(codes)
        for key, table in (("static_cont", self.static_cont), ("static_cat", self.static_cat)):
            batch[key] = fixed[key] if key in fixed else torch.from_numpy(table[code])
        known = y[:, t:-1]  # (B, F + G, H)
        for key, at in (("future_cont", self.future_cont), ("future_cat", self.future_cat)):
            if key in fixed:
                batch[key] = fixed[key]
            else:
                values = known[:, at]  # (fancy indexing: a contiguous copy)
                batch[key] = torch.from_numpy(values if key == "future_cont" else values.astype(self.code_dtype))
        if t:
            self._targets(batch, y[:, :t], code, torch)
        else:
            batch.update(target=fixed["target"], target_loc=fixed["target_loc"], target_scale=fixed["target_scale"])
        if self.named is not None and self.named.series_id:
            batch["series"] = torch.from_numpy(code)
        if self.named is not None and self.named.index and rows is not None:
            batch["index"] = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))
        return batch

    def _targets(self, batch: dict, target: np.ndarray, code: np.ndarray, torch: Any) -> None:
        """``target``, ``target_loc`` and ``target_scale`` of ``batch`` (``target``: ``(B, T[, H])``)."""
        h = self.horizon
        if self.refuses_unseen and code.min(initial=0) < 0:  # a series the fit did not see: refused
            for j, table in enumerate(self.scales):
                if table is not None and self.normalizers[j].unseen == "raise":  # type: ignore[union-attr]
                    self.normalizers[j].loc_scale(self.wf.target[j], code)  # type: ignore[union-attr]  # raises
        loc, scale = self.target_loc[code], self.target_scale[code]  # (B, T) each; code -1: the last row
        if not (self.named and self.named.scale_target):
            target = target * (scale[..., None] if h else scale) + (loc[..., None] if h else loc)
            loc, scale = np.zeros_like(loc), np.ones_like(scale)
        batch["target"] = torch.from_numpy(np.asarray(target, np.float32))
        batch["target_loc"], batch["target_scale"] = torch.from_numpy(loc), torch.from_numpy(scale)


def _scale_table(op: Any, column: str, num_series: int) -> np.ndarray | None:
    """``(series + 1, 2)`` float32 loc and scale of ``column`` per series code, the global ones last
    (so code ``-1``, a series the fit did not see, takes them)."""
    if op is None:
        return None
    glob = np.stack(op.loc_scale(column, None), axis=1)  # (1, 2)
    if not op.per_series:
        return np.repeat(glob, num_series + 1, axis=0).astype(np.float32)
    per = np.stack(op.loc_scale(column, np.arange(num_series)), axis=1)  # (series, 2)
    return np.concatenate([per, glob]).astype(np.float32)
