"""Argument checks shared by the mask generators of ``dask_windows.ondevice.masks`` (torch only).

Every message names the calling function.
"""

from __future__ import annotations

import numbers

import torch


def _check_batch(x: object, caller: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(
            f"{caller}: x is a {type(x).__name__}; it must be a torch.Tensor shaped "
            "(batch, variables, time); convert it with torch.as_tensor"
        )
    if x.ndim != 3:
        raise ValueError(
            f"{caller}: x has shape {tuple(x.shape)} ({x.ndim} dims); it must have 3 "
            "dims (batch, variables, time); add the missing axes with x[None] or "
            "x[:, None], or pass x.transpose(1, 2) for a (batch, time, variables) batch"
        )
    return x


def _check_ratio(r: object, caller: str) -> float:
    if isinstance(r, bool) or not isinstance(r, numbers.Real):
        raise TypeError(f"{caller}: r={r!r} must be a real number in (0, 1), the share of values to hide")
    if not 0.0 < float(r) < 1.0:
        raise ValueError(
            f"{caller}: r={r!r} is outside (0, 1); r is the expected share of hidden "
            "values, so pass e.g. r=0.15 (to hide nothing, skip the mask)"
        )
    return float(r)


def _check_generator(generator: object, x: torch.Tensor, caller: str) -> None:
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"{caller}: generator is a {type(generator).__name__}; pass a torch.Generator "
            f"on {x.device} (torch.Generator(device={str(x.device)!r}).manual_seed(0)) or None"
        )
    gen_device = generator.device
    same_index = gen_device.index is None or x.device.index is None or gen_device.index == x.device.index
    if gen_device.type != x.device.type or not same_index:
        raise ValueError(
            f"{caller}: generator lives on {gen_device} but x lives on {x.device}; "
            f"create the generator with torch.Generator(device={str(x.device)!r})"
        )


def _check_mask_args(x: object, r: object, generator: object, caller: str) -> tuple[torch.Tensor, float]:
    """Checks a mask's batch, ratio and generator; returns the batch and the ratio as a float."""
    batch = _check_batch(x, caller)
    ratio = _check_ratio(r, caller)
    _check_generator(generator, batch, caller)
    return batch, ratio
