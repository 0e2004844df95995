"""PyTorch Forecasting's models (``TemporalFusionTransformer``, ``DeepAR``, ``NHiTS``, ...) on named batches.

PF builds a model with ``Model.from_dataset(dataset, **hparams)`` and trains on ``(x, (y, weight))``
batches of ``TimeSeriesDataSet``'s collate function. ``PFAdapter`` is both halves for a fitted
``Workflow``: what ``from_dataset`` reads (from the workflow's roles and vocabularies, no data read),
and a collate function from each named batch to PF's layout (``adapter(batch)``; ``adapter.loader(ds)``
runs it in the DataLoader's workers). What PF does per window (relative time index, target-scale
features, encoder normaliser, shorter encoders) the adapter does per batch. Where its conventions
differ from PF's (codes ``0`` null, ``1`` unseen, ``2...`` the vocabulary, of any integer dtype;
the workflow's target scaling and transformations; zeros for unknown reals over the decoder;
``groups`` the series code; ``decoder_time_idx`` in global rows with ``index=True``): docs/frameworks.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dask_windows.errors import ConfigError

__all__ = ["PFAdapter", "last_windows"]

_INSTALL = "pip install pytorch-forecasting (see .ci/extras: --no-deps beside pandas 3.1)"


def _pf() -> Any:
    try:
        import pytorch_forecasting
    except ImportError as exc:
        raise ImportError(f"PFAdapter needs PyTorch Forecasting: {_INSTALL}") from exc
    return pytorch_forecasting


@dataclass
class WorkflowCodes:
    """A categorical's codes as PF's encoders expose them (``classes_``: label -> code), for embedding sizes."""

    classes_: dict

    @classmethod
    def of(cls, vocabulary: list) -> WorkflowCodes:
        labels = {"<null>": 0, "<unseen>": 1}
        labels.update({value: code for code, value in enumerate(vocabulary, start=2)})
        return cls(labels)


class PFAdapter:
    """What PF's ``Model.from_dataset`` reads, and the collate function from named batches to PF's batches.

    Example::

        adapter = PFAdapter(wf, max_encoder_length=24, max_prediction_length=6, add_relative_time_idx=True)
        model = TemporalFusionTransformer.from_dataset(adapter, hidden_size=16)
        ds = WindowDataset("data/", workflow=wf.named(index=True), window=24, horizon=6, batch_size=64)
        lightning.Trainer(max_epochs=1).fit(model, adapter.loader(ds))

    Args:
        wf: A fitted ``Workflow`` whose targets are among its ``continuous`` outputs.
        max_encoder_length: The dataset's ``window``; ``max_prediction_length``: its ``horizon``.
        min_encoder_length: Shorter encoders: each window keeps its last ``n`` encoder rows, ``n`` drawn
            uniformly in ``[min_encoder_length, max_encoder_length]`` from ``(seed, the window's start row)``
            (needs ``wf.named(index=True)``), the rest padded as PF pads. Default: ``max_encoder_length``.
        add_relative_time_idx: Add PF's known real ``relative_time_idx`` (``-n .. H-1`` over ``max_encoder_length``).
        add_target_scales: Add the static reals ``<target>_center`` and ``<target>_scale`` (each window's
            ``target_scale``), standardised by their mean and ``std`` over the series the workflow was fitted on
            (with ``target_normalizer="workflow"``), or as they are (``"encoder"``).
        target_normalizer: ``"workflow"``: the workflow's scaling of the target (PF's ``GroupNormalizer``
            with ``Normalize(per_series=True)``); ``"encoder"``: PF's ``EncoderNormalizer``, fitted per window
            on its encoder rows.
        seed: Seed of the encoder lengths drawn with ``min_encoder_length``.
    """

    def __init__(
        self,
        wf: Any,
        max_encoder_length: int,
        max_prediction_length: int,
        *,
        min_encoder_length: int | None = None,
        add_relative_time_idx: bool = False,
        add_target_scales: bool = False,
        target_normalizer: str = "workflow",
        seed: int = 0,
    ) -> None:
        if not wf.fitted:
            raise ConfigError("PFAdapter needs a fitted workflow: call wf.fit(...) or Workflow.load(url) first")
        if not wf.target:
            raise ConfigError("PFAdapter needs a workflow with target=[...]: PF's models predict a target")
        missing = [t for t in wf.target if t not in wf.continuous or t in wf.known]
        if missing:
            raise ConfigError(
                f"target {missing} must be a continuous, unknown output of the workflow (PF feeds the past target to "
                "its encoder): add it to continuous=[...] and leave it out of known=[...]"
            )
        if max_prediction_length < 1:
            raise ConfigError(f"max_prediction_length={max_prediction_length} must be at least 1 (the horizon)")
        min_encoder_length = max_encoder_length if min_encoder_length is None else min_encoder_length
        if not 1 <= min_encoder_length <= max_encoder_length:
            raise ConfigError(
                f"min_encoder_length={min_encoder_length} must lie in [1, max_encoder_length={max_encoder_length}]"
            )
        if target_normalizer not in ("workflow", "encoder"):
            raise ConfigError(f"target_normalizer={target_normalizer!r} must be 'workflow' or 'encoder'")
        pf = _pf()
        self.wf, self.seed, self.normalizer_kind = wf, seed, target_normalizer
        self.max_encoder_length, self.min_encoder_length = max_encoder_length, min_encoder_length
        self.max_prediction_length = self.min_prediction_length = max_prediction_length
        self.add_relative_time_idx, self.add_target_scales = add_relative_time_idx, add_target_scales
        self.add_encoder_length = False
        self.randomize_length = None
        self.target: Any = wf.target[0] if len(wf.target) == 1 else list(wf.target)
        self.target_names = list(wf.target)
        self.multi_target = len(wf.target) > 1
        self.group_ids = [wf.series] if isinstance(wf.series, str) else list(wf.series or [])
        self.time_idx = "row"  # decoder_time_idx counts global rows (``index=True``)

        cats, known = set(wf.categorical), set(wf.known)
        statics = wf.statics
        self._static_reals = list(statics.numeric) if statics is not None else []
        if add_target_scales:
            self._static_reals += [f"{t}_{part}" for t in wf.target for part in ("center", "scale")]
        self._static_categoricals = list(statics.categorical) if statics is not None else []
        self._time_varying_known_reals = [c for c in wf.known if c not in cats]
        if add_relative_time_idx:
            self._time_varying_known_reals.append("relative_time_idx")
        self._time_varying_known_categoricals = [c for c in wf.known if c in cats]
        self._time_varying_unknown_reals = [c for c in wf.continuous if c not in known]
        self._time_varying_unknown_categoricals = [c for c in wf.categorical if c not in known]
        self._variable_groups: dict = {}
        self._lags: dict = {}
        self.lagged_variables: dict = {}
        self.dropout_categoricals: list = []
        self._categorical_encoders = {name: WorkflowCodes.of(_vocabulary(wf, name)) for name in self.categoricals}
        self._scalers: dict = dict.fromkeys(self.reals)
        self.transformations = [_transformation(wf, t) for t in wf.target]
        normalizers = [
            pf.EncoderNormalizer(transformation=transformation)
            if target_normalizer == "encoder"
            else pf.GroupNormalizer(groups=self.group_ids, transformation=transformation)
            for transformation in self.transformations
        ]
        self.target_normalizer = pf.MultiNormalizer(normalizers) if self.multi_target else normalizers[0]
        self._scale_features = self._target_scale_standardisation() if add_target_scales else None
        self._plan = self._sources()

    # -- what from_dataset reads ------------------------------------------------------------

    @property
    def reals(self) -> list[str]:
        return self._static_reals + self._time_varying_known_reals + self._time_varying_unknown_reals

    @property
    def categoricals(self) -> list[str]:
        return (
            self._static_categoricals + self._time_varying_known_categoricals + self._time_varying_unknown_categoricals
        )

    @property
    def flat_categoricals(self) -> list[str]:
        return self.categoricals

    @property
    def target_normalizers(self) -> list:
        return list(getattr(self.target_normalizer, "normalizers", [self.target_normalizer]))

    def _get_lagged_names(self, name: str) -> dict:
        return {}

    def get_parameters(self) -> dict[str, Any]:
        """The dataset's settings, as PF stores them in the model (``dataset_parameters``) and its checkpoints."""
        return {
            "time_idx": self.time_idx,
            "target": self.target,
            "group_ids": self.group_ids,
            "max_encoder_length": self.max_encoder_length,
            "min_encoder_length": self.min_encoder_length,
            "max_prediction_length": self.max_prediction_length,
            "min_prediction_length": self.min_prediction_length,
            "static_categoricals": self._static_categoricals,
            "static_reals": self._static_reals,
            "time_varying_known_categoricals": self._time_varying_known_categoricals,
            "time_varying_known_reals": self._time_varying_known_reals,
            "time_varying_unknown_categoricals": self._time_varying_unknown_categoricals,
            "time_varying_unknown_reals": self._time_varying_unknown_reals,
            "variable_groups": self._variable_groups,
            "lags": self._lags,
            "add_relative_time_idx": self.add_relative_time_idx,
            "add_target_scales": self.add_target_scales,
            "add_encoder_length": self.add_encoder_length,
            "target_normalizer": self.target_normalizer,
            "categorical_encoders": self._categorical_encoders,
            "scalers": self._scalers,
            "randomize_length": self.randomize_length,
        }

    def x_to_index(self, x: dict) -> Any:
        """First decoder step and series id of each window (PF's ``predict(..., return_index=True)``); the id's
        column is named after the workflow's ``series`` column (``"series"`` for several)."""
        import pandas as pd

        keys = np.asarray(self.wf.series_keys, dtype=object)[x["groups"][:, 0].cpu().numpy()]
        name = self.group_ids[0] if len(self.group_ids) == 1 else "series"
        return pd.DataFrame({self.time_idx: x["decoder_time_idx"][:, 0].cpu().numpy(), name: keys})

    # -- batches ----------------------------------------------------------------------------

    def loader(self, dataset: Any, num_workers: int = 0, **kwargs: Any) -> Any:
        """A DataLoader over ``dataset`` (a ``WindowDataset`` with ``workflow=wf.named(...)``) yielding PF's batches."""
        from dask_windows.integrations.loaders import window_loader

        return window_loader(dataset, num_workers, collate_fn=self, **kwargs)

    def __call__(self, batch: Any) -> tuple[dict, tuple[Any, None]]:
        """PF's ``(x, (y, weight))`` of one named batch (see the module docstring)."""
        if not isinstance(batch, dict) or "past_cont" not in batch:
            raise ConfigError(
                f"PFAdapter takes named batches (a dict with 'past_cont', ...), not {type(batch).__name__}: "
                "open the dataset with workflow=wf.named(...)"
            )
        past, target = batch["past_cont"], batch["target"]
        b, length = past.shape[0], past.shape[2]
        horizon = target.shape[-1] if target.ndim == 3 else 0
        if length != self.max_encoder_length or horizon != self.max_prediction_length:
            raise ConfigError(
                f"a batch of window={length}, horizon={horizon} does not match the adapter's max_encoder_length="
                f"{self.max_encoder_length}, max_prediction_length={self.max_prediction_length}: open the dataset "
                "with the same window and horizon"
            )
        loc, scale = batch["target_loc"].float(), batch["target_scale"].float()  # (B, T)
        cont = self._plan["past_target"]
        past_units = past[:, cont].float() * scale[..., None] + loc[..., None]  # (B, T, L) the past targets in units
        future_units = target.float() * scale[..., None] + loc[..., None]  # (B, T, H)
        if self.normalizer_kind == "encoder":
            loc, scale = _encoder_scale(past_units, self.encoder_lengths(batch))
        past_data, future_data = self._data_units(past_units), self._data_units(future_units)

        lengths = self.encoder_lengths(batch)  # (B,)
        reals = [self._real(name, batch, past_units, future_units, loc, scale, lengths) for name in self.reals]
        full_cont = torch.stack(reals, dim=-1) if reals else past.new_zeros((b, length + horizon, 0))  # (B, L+H, R)
        full_cat = self._categoricals(batch, b, length, horizon)  # (B, L+H, Q) int64
        encoder_target = past_data.transpose(1, 2)  # (B, L, T)
        if self.min_encoder_length < self.max_encoder_length:
            full_cont, full_cat, encoder_target = _shorten(full_cont, full_cat, encoder_target, lengths, length)
        decoder_target = future_data.transpose(1, 2)  # (B, H, T)
        if "index" in batch:
            first = batch["index"].long() + length  # the first horizon row, counted in global rows
        else:
            first = torch.full((b,), length, dtype=torch.long)
        series = batch["series"].long() if "series" in batch else torch.zeros(b, dtype=torch.long)
        target_scale = torch.stack([loc, scale], dim=-1)  # (B, T, 2)
        x = {
            "encoder_cat": full_cat[:, :length],
            "encoder_cont": full_cont[:, :length],
            "encoder_lengths": lengths,
            "decoder_cat": full_cat[:, length:],
            "decoder_cont": full_cont[:, length:],
            "decoder_lengths": torch.full((b,), horizon, dtype=torch.long),
            "decoder_time_idx": first[:, None] + torch.arange(horizon)[None, :],
            "groups": series[:, None],
            "target_scale": target_scale[:, 0],
            "encoder_target": encoder_target[..., 0],
            "decoder_target": decoder_target[..., 0],
        }
        if self.multi_target:
            x["target_scale"] = list(target_scale.unbind(1))
            x["encoder_target"] = list(encoder_target.unbind(-1))
            x["decoder_target"] = list(decoder_target.unbind(-1))
        return x, (x["decoder_target"], None)

    def encoder_lengths(self, batch: dict) -> torch.Tensor:
        """``(B,)`` encoder length of each window: ``max_encoder_length``, or drawn from ``(seed, start row)``."""
        b = batch["past_cont"].shape[0]
        if self.min_encoder_length == self.max_encoder_length:
            return torch.full((b,), self.max_encoder_length, dtype=torch.long)
        if "index" not in batch:
            raise ConfigError(
                "min_encoder_length < max_encoder_length draws each window's encoder length from its start row: "
                "open the dataset with workflow=wf.named(index=True)"
            )
        mixed = _mix64(batch["index"].numpy().astype(np.uint64) ^ np.uint64(_mix64(np.uint64(self.seed))))
        span = self.max_encoder_length - self.min_encoder_length + 1
        return torch.from_numpy((self.min_encoder_length + mixed % np.uint64(span)).astype(np.int64))

    # -- internals --------------------------------------------------------------------------

    def _data_units(self, units: torch.Tensor) -> torch.Tensor:
        """``(B, T, N)`` targets in the transformed units back in the data's: each target's transformations undone."""
        if all(t is None for t in self.transformations):
            return units
        columns = [_undo(self.wf, name, units[:, j]) for j, name in enumerate(self.target_names)]
        return torch.stack(columns, dim=1).to(units.dtype)

    def _sources(self) -> dict:
        """Where each real and categorical comes from in a named batch (positions worked out once)."""
        wf, cats = self.wf, set(self.wf.categorical)
        future_cont = [c for c in wf.known if c not in cats]
        future_cat = [c for c in wf.known if c in cats]
        return {
            "past_target": [wf.continuous.index(t) for t in wf.target],
            "cont": {c: i for i, c in enumerate(wf.continuous)},
            "cat": {c: i for i, c in enumerate(wf.categorical)},
            "future_cont": {c: i for i, c in enumerate(future_cont)},
            "future_cat": {c: i for i, c in enumerate(future_cat)},
            "static_cont": {c: i for i, c in enumerate(self.wf.statics.numeric if self.wf.statics else [])},
            "static_cat": {c: i for i, c in enumerate(self.wf.statics.categorical if self.wf.statics else [])},
        }

    def _target_scale_standardisation(self) -> np.ndarray | None:
        """``(T, 2, 2)``: per target, (mean, std) of its center and of its scale over the fitted series."""
        if self.normalizer_kind == "encoder":
            return None
        out = np.zeros((len(self.wf.target), 2, 2), np.float64)
        for j, name in enumerate(self.wf.target):
            op = self.wf.normalizer(name)
            if op is None or not op.per_series:
                out[j] = [[0.0, 1.0], [0.0, 1.0]]
                continue
            loc, scale = op.loc_scale(name, np.arange(len(self.wf.series_keys)))
            for k, values in enumerate((np.asarray(loc, np.float64), np.asarray(scale, np.float64))):
                spread = values.std()
                out[j, k] = values.mean(), spread if spread > 0 else 1.0
        return out

    def _real(
        self, name: str, batch: dict, past_units: torch.Tensor, future_units: torch.Tensor, loc: torch.Tensor,
        scale: torch.Tensor, lengths: torch.Tensor,
    ) -> torch.Tensor:  # fmt: skip
        """``(B, L + H)`` float32 values of the real ``name`` over the encoder then the decoder."""
        b, length = batch["past_cont"].shape[0], batch["past_cont"].shape[2]
        horizon = self.max_prediction_length
        if name in self.target_names:
            j = self.target_names.index(name)
            units = torch.cat([past_units[:, j], future_units[:, j]], dim=1)  # (B, L + H)
            return (units - loc[:, j, None]) / scale[:, j, None]
        if name == "relative_time_idx":
            # (1, L + H) -L .. H - 1; a shorter encoder keeps its last n rows: -n .. -1 (``_shorten``)
            steps = torch.arange(length + horizon, dtype=torch.float32)[None, :] - length
            return (steps / self.max_encoder_length).expand(b, -1)
        if name.endswith(("_center", "_scale")) and name.rsplit("_", 1)[0] in self.target_names:
            target, part = name.rsplit("_", 1)
            j, k = self.target_names.index(target), ("center", "scale").index(part)
            value = (loc if k == 0 else scale)[:, j]
            if self._scale_features is not None:
                mean, std = self._scale_features[j, k]
                value = (value - float(mean)) / float(std)
            return value[:, None].expand(b, length + horizon)
        return self._fields(name, batch, "cont", torch.float32)

    def _categoricals(self, batch: dict, b: int, length: int, horizon: int) -> torch.Tensor:
        """``(B, L + H, Q)`` int64 codes of every categorical over the encoder then the decoder (zeros over the
        decoder for an unknown one), each written once, widened in that copy whatever the batch's code dtype
        (``named(code_dtype="narrow")`` sends 1 byte a code)."""
        plan = self._plan
        out = torch.empty((b, length + horizon, len(self.categoricals)), dtype=torch.long)
        for j, name in enumerate(self.categoricals):
            column = out[:, :, j]  # (B, L + H), strided
            if name in plan["static_cat"]:
                column.copy_(batch["static_cat"][:, plan["static_cat"][name], None].expand(b, length + horizon))
                continue
            column[:, :length].copy_(batch["past_cat"][:, plan["cat"][name]])
            if name in plan["future_cat"]:
                column[:, length:].copy_(batch["future_cat"][:, plan["future_cat"][name]])
            else:
                column[:, length:].zero_()  # unknown: no model reads it over the decoder
        return out

    def _fields(self, name: str, batch: dict, kind: str, dtype: torch.dtype) -> torch.Tensor:
        """``(B, L + H)`` of column ``name`` from the batch's static, past and future ``kind`` (``cont``, ``cat``)."""
        plan = self._plan
        b, length = batch["past_cont"].shape[0], batch["past_cont"].shape[2]
        horizon = self.max_prediction_length
        if name in plan[f"static_{kind}"]:
            return batch[f"static_{kind}"][:, plan[f"static_{kind}"][name], None].to(dtype).expand(b, length + horizon)
        past = batch[f"past_{kind}"][:, plan[kind][name]].to(dtype)  # (B, L)
        if name in plan[f"future_{kind}"]:
            future = batch[f"future_{kind}"][:, plan[f"future_{kind}"][name]].to(dtype)
        else:
            future = past.new_zeros((b, horizon))  # unknown: no model reads it over the decoder
        return torch.cat([past, future], dim=1)


def _vocabulary(wf: Any, name: str) -> list:
    """The sorted vocabulary of a categorical output or static of ``wf`` (codes 2, 3, ...)."""
    from dask_windows.workflow.ops import Categorify

    for op in reversed(wf.ops):
        if isinstance(op, Categorify) and name in op.columns:
            return list(op.vocabulary(name))
    if wf.statics is not None and wf.statics.state and name in wf.statics.categorical:
        return list(wf.statics.state["vocabulary"][name])
    raise ConfigError(f"{name!r} is not a Categorify output or a categorical static of the workflow")


def _transformation(wf: Any, column: str) -> str | dict | None:
    """PF's ``transformation=`` for the target ``column``: the name of its one transformation where PF has
    it, else ``{"forward", "reverse"}`` through the workflow's own functions, or ``None``.

    Raises:
        ConfigError: The target goes through an operation ``invert_target`` cannot undo (checked here, on
            one value, so it is refused before training rather than at the first prediction).
    """
    chain, last = wf.target_chain(column), wf.normalizer(column)
    for op in chain:
        if op is not last and op.invert(np.full(1, 0.5), column) is NotImplemented:
            raise ConfigError(
                f"PFAdapter cannot map predictions of the target {column!r} back through {op!r}: write the target "
                "with transformations (Log1p, Transform) first and one Normalize last"
            )
    ops = wf.target_transforms(column)
    if not ops:
        return None
    if len(ops) == 1 and ops[0].name in _PF_NAMED:
        return str(ops[0].name)
    return {"forward": _Chain(column, ops, inverse=False), "reverse": _Chain(column, ops, inverse=True)}


_PF_NAMED = ("log", "log1p", "logit", "softplus", "relu")  # PF's TorchNormalizer.TRANSFORMATIONS that match ours


class _Chain:
    """The workflow's transformations of one target as a function of tensors (PF's custom ``transformation``)."""

    def __init__(self, column: str, ops: list, inverse: bool) -> None:
        self.column, self.ops, self.inverse = column, list(ops), inverse

    def __call__(self, values: torch.Tensor) -> torch.Tensor:
        from dask_windows.workflow.transforms import forward

        if self.inverse:
            for op in reversed(self.ops):
                values = op.invert(values, self.column)
            return values
        data = values.detach().cpu().numpy().astype(np.float64)
        for op in self.ops:
            data = forward(op.name, data, op.lmbda)
        return torch.as_tensor(data, dtype=values.dtype, device=values.device)


def _undo(wf: Any, column: str, values: torch.Tensor) -> torch.Tensor:
    """Values of ``column`` in its transformed units (after the scale is undone) back in the data's units."""
    last = wf.normalizer(column)
    for op in reversed(wf.target_chain(column)):
        if op is not last:
            values = op.invert(values, column)
    return values


def _encoder_scale(units: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """PF's ``EncoderNormalizer`` per window: ``(B, T)`` mean and ``std + eps`` of the last ``lengths`` rows
    of ``units`` ``(B, T, L)``."""
    length = units.shape[-1]
    kept = (torch.arange(length)[None, :] >= length - lengths[:, None]).to(units.dtype)[:, None, :]  # (B, 1, L)
    count = lengths.to(units.dtype)[:, None]  # (B, 1)
    center = (units * kept).sum(-1) / count
    spread = (((units - center[..., None]) * kept) ** 2).sum(-1) / (count - 1).clamp(min=1)  # unbiased, as torch.std
    return center, spread.sqrt() + torch.finfo(units.dtype).eps


def _shorten(
    cont: torch.Tensor, cat: torch.Tensor, encoder_target: torch.Tensor, lengths: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Encoders of ``lengths`` rows (the last rows of each window's encoder), moved to the front and padded
    with zeros behind as PF's collate pads them; the decoder rows stay where they are."""
    b = len(lengths)
    steps = torch.arange(length)[None, :]  # (1, L)
    source = (steps + length - lengths[:, None]).clamp(max=length - 1)  # (B, L) row each encoder slot takes
    valid = steps < lengths[:, None]  # (B, L)

    def moved(values: torch.Tensor) -> torch.Tensor:
        picked = values[:, :length].gather(1, source[..., None].expand(b, length, values.shape[-1]))
        picked = picked * valid[..., None].to(picked.dtype)
        return torch.cat([picked, values[:, length:]], dim=1)

    return moved(cont), moved(cat), moved(encoder_target)


def _mix64(values: Any) -> Any:
    """SplitMix64's finaliser: a well-mixed uint64 of each uint64 (wraps modulo 2**64)."""
    with np.errstate(over="ignore"):
        z = np.asarray(values, np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def last_windows(dataset: Any) -> Any:
    """Predict mode: ``dataset`` restricted to each series' last window (its last start on the stride grid).

    With ``workflow=wf.named(...)`` each batch carries ``"series"`` (the position of the window's series in
    ``wf.series_keys``), which ``PFAdapter`` passes on as ``groups``. Its window and horizon are the last
    ``window + horizon`` rows of the series, as PF's ``TimeSeriesDataSet(predict=True)`` takes them: the known
    covariates of the horizon must be in the data; its target values are not used for a forecast.
    """
    from dask_windows.planning.split import SeriesTable, split_grid
    from dask_windows.sources.arrays import ArraySource

    if dataset._series is None:
        one_series = dataset.spec.series is None and not isinstance(dataset.source, ArraySource)
        rows = [p.num_rows for p in dataset.source.partitions]
        dataset._series = SeriesTable.from_runs(dataset.runs, one_series=one_series, num_rows=rows)
    table = dataset._series
    span, stride = dataset.spec.span, dataset.spec.stride
    cuts = np.maximum(table.rows_per_series - span - (stride - 1), 0).astype(np.int64)  # (S,) the last grid start
    _, last = split_grid(dataset.grid, table, cuts, span, 0)
    return dataset._with_grid(last, "predict")
