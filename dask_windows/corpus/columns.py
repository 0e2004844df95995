"""How a list column's rows map to series of ``channels x steps`` in one flat array of values.

Four layouts are read: ``list<float>``, ``list<list<float>>`` (channels x time),
``fixed_size_list<list<float>>[C]`` (LOTSA) and a flat ``list<float>`` beside a
``<column>._np_shape`` column (GluonTS). Each keeps a row's channels one after another in the flat
child array, so only offsets are read at open. The trade-off: a null *channel* cannot be served in
place and is refused; a null *value* is read as NaN.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dask_windows.errors import SchemaError

__all__ = ["SHAPE_SUFFIX", "is_list", "list_offsets"]

#: GluonTS's ``ArrowWriter`` stores the shape of a column of n-d arrays in ``<column>._np_shape``.
SHAPE_SUFFIX = "._np_shape"


def is_list(kind: Any) -> bool:
    """Whether an Arrow type is a list of any kind (variable, large or fixed size)."""
    import pyarrow as pa

    return bool(pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind))


def _offsets(array: Any) -> np.ndarray:
    """``(rows + 1,)`` where each row of a list array starts in its (unsliced) child ``array.values``."""
    import pyarrow as pa

    if pa.types.is_fixed_size_list(array.type):
        size = array.type.list_size
        return (array.offset + np.arange(len(array) + 1, dtype=np.int64)) * size
    return np.asarray(array.offsets, dtype=np.int64)


def _valid(array: Any) -> np.ndarray:
    """``(rows,)`` True where a row is not null."""
    if array.null_count == 0:
        return np.ones(len(array), bool)
    return ~np.asarray(array.is_null(), dtype=bool)


def _check_numbers(values: Any, kind: Any, where: str, target: str) -> None:
    import pyarrow as pa

    t = values.type
    if not (pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_null(t)):
        deeper = " (lists nested deeper than channels x time)" if is_list(t) else ""
        raise SchemaError(
            f"column {target!r} of {where} is {kind}, whose values are {t}{deeper}; a corpus needs numbers in "
            "list<float> (one channel), list<list<float>> or fixed_size_list<list<float>> (channels x time)"
        )


def list_offsets(column: Any, shape: Any, where: str, target: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any]:
    """``(lengths, channels, starts, values)`` of one list column chunk (see the module docstring).

    ``shape`` is the ``<column>._np_shape`` array (GluonTS) or ``None``; ``where`` and ``target`` name
    the partition and column in messages. Channels are 0 for a null row; row ``r``'s channel ``c`` is
    ``values[starts[r] + c * lengths[r] :][: lengths[r]]``.
    """
    kind = column.type
    if not is_list(kind):
        raise SchemaError(
            f"column {target!r} of {where} is {kind}, not a list; a corpus holds one series per row in a "
            "list<float> (or list<list<float>>) column; for one row per time step use WindowDataset"
        )
    outer = _offsets(column)  # (rows + 1,) positions in the child
    rows = len(column)
    valid = _valid(column)
    child = column.values
    if is_list(child.type):  # channels x time
        if shape is not None:
            raise SchemaError(
                f"column {target!r} of {where} is {kind} and has a {target + SHAPE_SUFFIX!r} column; "
                "give one of them (a flat list with its shape, or nested lists)"
            )
        lengths, channels, starts, values = _nested(child, outer, valid, where, target)
    else:
        channels = np.ones(rows, np.int64)
        lengths = np.diff(outer)
        starts = outer[:-1]
        values = child
        if shape is not None:
            lengths, channels = _shaped(shape, lengths, valid, where, target)
    _check_numbers(values, kind, where, target)
    lengths = np.where(valid, lengths, 0).astype(np.int64)
    channels = np.where(valid, channels, 0).astype(np.int64)
    return lengths, channels, starts.astype(np.int64), values


def _nested(
    child: Any, outer: np.ndarray, valid: np.ndarray, where: str, target: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any]:
    """``(lengths, channels, starts, values)`` of a list of lists: channels x time."""
    inner = _offsets(child)  # (sum channels + 1,) positions of each channel in the values
    channels = np.diff(outer)
    last = len(inner) - 1
    first = inner[np.minimum(outer[:-1], last)]
    lengths = np.where(channels > 0, inner[np.minimum(outer[:-1] + 1, last)] - first, 0)
    span = slice(int(outer[0]), int(outer[-1]))
    per_channel = np.diff(inner)[span]  # (sum channels,) steps of each channel
    owner = np.repeat(np.arange(len(channels)), channels)  # (sum channels,) row of each channel
    in_valid = valid[owner]
    null_channel = ~_valid(child)[span] & in_valid
    if null_channel.any():
        bad = int(np.flatnonzero(null_channel)[0])
        row = int(owner[bad])
        raise SchemaError(
            f"row {row} of {where}: channel {bad - int(outer[row] - outer[0])} of column {target!r} is null; "
            "a channel with no value needs a list of nulls of the series' length (null values are served masked)"
        )
    ragged = (per_channel != np.repeat(lengths, channels)) & in_valid
    if ragged.any():
        bad = int(np.flatnonzero(ragged)[0])
        raise SchemaError(
            f"row {int(owner[bad])} of {where}: the channels of column {target!r} differ in length; a multivariate "
            "series needs one length per channel (pad the short channels with null)"
        )
    return lengths, channels, first, child.values


def _shaped(shape: Any, flat: np.ndarray, valid: np.ndarray, where: str, target: str) -> tuple[np.ndarray, np.ndarray]:
    """``(lengths, channels)`` of GluonTS's flat list beside its ``_np_shape`` (``[steps]`` or ``[channels, steps]``)."""
    name = target + SHAPE_SUFFIX
    if not is_list(shape.type):
        raise SchemaError(f"column {name!r} of {where} is {shape.type}; GluonTS writes it as list<int64>")
    dims = np.diff(_offsets(shape))  # (rows,) dimensions of each row's shape
    has = _valid(shape) & valid
    odd = has & ((dims < 1) | (dims > 2))
    if odd.any():
        r = int(np.flatnonzero(odd)[0])
        raise SchemaError(
            f"row {r} of {where}: {name!r} gives {int(dims[r])} dimensions; a series is [steps] or [channels, steps]"
        )
    sizes = np.asarray(shape.values.to_numpy(zero_copy_only=False), dtype=np.int64)
    first = _offsets(shape)[:-1]
    two = has & (dims == 2)
    channels = np.where(two, sizes[np.where(two, first, 0)] if len(sizes) else 0, 1)
    lengths = np.where(two, sizes[np.where(two, first + 1, 0)] if len(sizes) else 0, flat)
    wrong = valid & (lengths * channels != flat)
    if wrong.any():
        r = int(np.flatnonzero(wrong)[0])
        raise SchemaError(
            f"row {r} of {where}: {name!r} says {int(channels[r])} x {int(lengths[r])} values where column "
            f"{target!r} holds {int(flat[r])}; the file is damaged or the shape column belongs to another layout"
        )
    return lengths.astype(np.int64), channels.astype(np.int64)
