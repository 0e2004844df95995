"""Named batches in a mixture: the members' fields checked against each other once, at ``mix()``.

A mixture assembles each batch field by field, so every member must yield the same keys, dtypes,
shapes after the batch axis (the window yielded, not the lookback rows read; the horizon) and the
same columns on each channel axis, in order; that is checked here from each member's workflow,
before anything is read. Workflows fitted apart (a category's codes may stand for other values in
each) only warn: fit one workflow over both members' data. ``series`` stays each member's own code;
``mix(..., return_source=True)`` adds ``source``, the member of each window.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from dask_windows.errors import ConfigError

__all__ = ["named_fields", "named_keys"]


def _emitter(member: Any) -> Any:
    return getattr(member, "_workflow", None)


def named_fields(member: Any) -> dict[str, tuple[str, tuple[int, ...], tuple[str, ...]]] | None:
    """``{key: (dtype, shape after B, columns of the channel axis)}`` of a member's named batches.

    ``None`` for a member that yields tuples (no workflow, or the workflow's tuple).
    """
    emitter = _emitter(member)
    named = getattr(emitter, "named", None)
    if named is None:
        return None
    wf, spec = emitter.wf, member.spec
    window, h = spec.window - emitter.lookback, spec.horizon
    statics = wf.statics
    numeric = tuple(statics.numeric) if statics is not None else ()
    categorical = tuple(statics.categorical) if statics is not None else ()
    future_cont = tuple(wf.known[i] for i in emitter.future_cont)
    future_cat = tuple(wf.known[i] for i in emitter.future_cat)
    per_target = (len(wf.target), h) if h else (len(wf.target),)
    codes = emitter.code_dtype.name  # (``named(code_dtype="narrow")``: the dtype it stands for)
    fields = {
        "past_cont": ("float32", (len(wf.continuous), window), tuple(wf.continuous)),
        "past_cat": (codes, (len(wf.categorical), window), tuple(wf.categorical)),
        "static_cont": ("float32", (len(numeric),), numeric),
        "static_cat": (codes, (len(categorical),), categorical),
        "future_cont": ("float32", (len(future_cont), h), future_cont),
        "future_cat": (codes, (len(future_cat), h), future_cat),
        "target": ("float32", per_target, tuple(wf.target)),
        "target_loc": ("float32", (len(wf.target),), tuple(wf.target)),
        "target_scale": ("float32", (len(wf.target),), tuple(wf.target)),
    }
    if named.series_id:
        fields["series"] = ("int64", (), ())
    if named.index:
        fields["index"] = ("int64", (), ())
    return fields


def named_keys(names: Sequence[str], members: Sequence[Any]) -> list[str] | None:
    """The keys of a mixture's named batches, in order; ``None`` when its members yield tuples.

    Raises:
        ConfigError: Some members yield named batches and others tuples, or a member's field
            differs from the first member's in dtype, shape or columns (the message names both
            members and the field), or the members gather on different devices.
    """
    layouts = [named_fields(m) for m in members]
    if all(layout is None for layout in layouts):
        return None
    first = layouts[0]
    if first is None:
        at = next(i for i, layout in enumerate(layouts) if layout is not None)
        raise ConfigError(
            f"member {names[at]!r} yields named batches (workflow=wf.named()) but {names[0]!r} yields tuples; "
            "give every member named batches, or every member the tuple (workflow=wf)"
        )
    for name, member, layout in zip(names[1:], members[1:], layouts[1:]):
        if layout is None:
            raise ConfigError(
                f"member {name!r} yields tuples but {names[0]!r} yields named batches (workflow=wf.named()); "
                "give every member named batches, or every member the tuple"
            )
        if list(layout) != list(first):
            raise ConfigError(
                f"member {name!r} yields the fields {list(layout)} but {names[0]!r} yields {list(first)}; "
                "open every member with the same wf.named(index=..., series_id=...)"
            )
        for key, (dtype, shape, columns) in layout.items():
            want_dtype, want_shape, want_columns = first[key]
            if shape != want_shape or dtype != want_dtype:
                raise ConfigError(
                    f"member {name!r} yields {key!r} of shape (B, {', '.join(map(str, shape))}) {dtype} where "
                    f"{names[0]!r} yields (B, {', '.join(map(str, want_shape))}) {want_dtype}; a mixture's batches "
                    "need one shape and dtype: open every member with the same window and horizon, workflows with "
                    "the same roles, and the same wf.named(code_dtype=...)"
                )
            if columns != want_columns:
                raise ConfigError(
                    f"member {name!r} yields {key!r} of the columns {list(columns)} where {names[0]!r} yields "
                    f"{list(want_columns)}; declare the same columns in the same order in every member's workflow "
                    "(continuous=, categorical=, target=, known=, statics=)"
                )
        if getattr(member, "device", None) != getattr(members[0], "device", None):
            raise ConfigError(f"member {name!r} differs from {names[0]!r} in device; open every member on one device")
        _warn_on_other_codes(names[0], _emitter(members[0]).wf, name, _emitter(member).wf)
    return list(first)


def _warn_on_other_codes(first: str, a: Any, name: str, b: Any) -> None:
    """Warn when two members' workflows give a categorical column codes of other values."""
    if a is b:
        return
    from dask_windows.workflow.ops import Categorify

    def vocabularies(wf: Any) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for op in wf.ops:
            if isinstance(op, Categorify) and op.state is not None:
                found.update({col: op.state.get(col) for col in op.columns if col in wf.categorical})
        if wf.statics is not None and wf.statics.state:
            found.update({f"static {c}": v for c, v in wf.statics.state["vocabulary"].items()})
        return found

    va, vb = vocabularies(a), vocabularies(b)
    differ = [col for col in va if col in vb and va[col] != vb[col]]
    if differ:
        warnings.warn(
            f"members {first!r} and {name!r} were fitted apart: their codes of {differ} stand for other values "
            "in each (a model's embedding would mix them up); fit one workflow over both members' data and "
            "give it to both",
            stacklevel=4,
        )
