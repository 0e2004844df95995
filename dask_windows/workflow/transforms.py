"""Target transformations with exact inverses: ``log``, ``log1p``, ``logit``, ``softplus``, ``relu``, ``boxcox``.

``Transform(columns, name)`` rewrites columns in place; ``invert_target`` undoes the scale and then each
transform, so a model trained on log prices predicts prices. Names and directions are PyTorch
Forecasting's ``transformation=``: the forward function on the data, the inverse on a prediction
(``softplus`` stores ``log(exp(x) - 1)``; ``relu`` stores the values and clamps predictions at 0;
``boxcox(lmbda)`` is ``(x ** lmbda - 1) / lmbda``, ``lmbda`` given). Forward functions run in float64 in
a stable form; values outside a domain become NaN or infinite, for the loader's ``nan=`` policy. The
inverses take numpy arrays or torch tensors.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dask_windows.errors import ConfigError
from dask_windows.workflow.ops import OPS, Op, Piece, _float

__all__ = ["TRANSFORMS", "Transform", "forward", "inverse"]

TRANSFORMS = ("boxcox", "log", "log1p", "logit", "relu", "softplus")


def forward(name: str, x: np.ndarray, lmbda: float | None = None) -> np.ndarray:
    """The transform ``name`` of float64 values ``x``."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if name == "log" or (name == "boxcox" and not lmbda):
            return np.log(x)
        if name == "log1p":
            return np.log1p(x)
        if name == "logit":
            return np.log(x) - np.log1p(-x)
        if name == "softplus":  # the inverse softplus, log(exp(x) - 1), without overflow for large x
            return x + np.log(-np.expm1(-x))
        if name == "relu":
            return x
        if name == "boxcox":
            return np.expm1(lmbda * np.log(x)) / lmbda  # type: ignore[operator]
    raise ConfigError(f"unknown transform {name!r}; use one of {TRANSFORMS}")


def inverse(name: str, y: Any, lmbda: float | None = None) -> Any:
    """``y`` (numpy or torch) taken back through the transform ``name``: ``inverse(forward(x)) == x``."""
    torch_like = not isinstance(y, np.ndarray) and hasattr(y, "clamp")
    if torch_like:
        import torch

        xp: Any = torch
    else:
        xp, y = np, np.asarray(y)
    if name == "log" or (name == "boxcox" and not lmbda):
        return xp.exp(y)
    if name == "log1p":
        return xp.expm1(y)
    if name == "logit":
        return xp.sigmoid(y) if torch_like else 1.0 / (1.0 + np.exp(-y))
    if name == "softplus":
        return xp.logaddexp(y * 0, y)
    if name == "relu":
        return y.clamp(min=0) if torch_like else np.maximum(y, 0)
    if name == "boxcox":
        return xp.exp(xp.log1p(lmbda * y) / lmbda)
    raise ConfigError(f"unknown transform {name!r}; use one of {TRANSFORMS}")


class Transform(Op):
    """A transformation of columns in place, undone exactly by ``invert_target``.

    Args:
        columns: Columns to transform.
        name: One of ``log``, ``log1p``, ``logit``, ``softplus``, ``relu``, ``boxcox`` (module docstring).
        lmbda: ``boxcox``'s exponent (required for it, refused for the others).
    """

    kind = "transform"

    def __init__(self, columns: Any, name: str, lmbda: float | None = None) -> None:
        super().__init__(columns)
        if name not in TRANSFORMS:
            raise ConfigError(f"Transform(name={name!r}) must be one of {TRANSFORMS}")
        if (name == "boxcox") != (lmbda is not None):
            raise ConfigError(
                f"Transform({name!r}, lmbda={lmbda!r}): lmbda= is boxcox's exponent; give it with 'boxcox' only"
            )
        if lmbda is not None and not (isinstance(lmbda, (int, float)) and np.isfinite(lmbda)):
            raise ConfigError(f"Transform('boxcox', lmbda={lmbda!r}) must be a finite number")
        self.name, self.lmbda = name, None if lmbda is None else float(lmbda)

    def config(self) -> dict:
        return {"columns": list(self.columns), "name": self.name, "lmbda": self.lmbda}

    def apply(self, cols: dict, piece: Piece) -> None:
        for col in self.columns:
            cols[col] = forward(self.name, _float(cols, col, f"Transform({self.name!r})"), self.lmbda)

    def invert(self, values: Any, column: str) -> Any:
        return inverse(self.name, values, self.lmbda)


OPS[Transform.kind] = Transform  # saved workflows name it by kind (``ops.op_from_json``)
