"""The columnar units of a pool plan (``dask_windows.planning.units``) against ``PoolUnit`` objects."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_pool_plan import layouts, plan

from dask_windows.planning.units import PoolUnit, PoolUnits, place_units


def placed_one_by_one(sizes: list[int], rows: int) -> list[int]:
    """The oracle: each unit after the last, at row 0 when it would pass the pool's end."""
    out, end = [], 0
    for size in sizes:
        if end + size > rows:
            end = 0
        out.append(end)
        end += size
    return out


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=40), st.integers(1, 60))
def test_place_units_equals_placing_one_by_one(sizes: list[int], rows: int) -> None:
    assert place_units(np.array(sizes, np.int64), rows).tolist() == placed_one_by_one(sizes, rows)


@settings(max_examples=30, deadline=None)
@given(layouts())
def test_a_plans_units_are_columns_that_read_as_pool_units(cfg: dict) -> None:
    units = plan(cfg, 0, 0).units
    assert isinstance(units, PoolUnits)  # columns: no PoolUnit held per unit
    objects = tuple(units)
    assert all(isinstance(u, PoolUnit) for u in objects) and len(objects) == len(units)
    assert PoolUnits.of(objects) == units and units == objects and units[1:] == objects[1:]
    assert units.num_windows.tolist() == [u.num_windows for u in objects]
    assert units.num_rows.tolist() == [u.num_rows for u in objects]
    kept = {(u.partition, a, b) for u in objects for a, b in u.keep}
    assert set(zip(*(v.tolist() for v in units.kept()))) == kept
    assert [u.offset for u in units.with_offsets(0)] == [0] * len(units)
