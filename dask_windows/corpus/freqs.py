"""Frequency strings of a corpus: checked, compared by meaning, numbered by first appearance.

Corpora use pandas aliases of every version (``"H"``, ``"15T"`` beside ``"h"``, ``"15min"``), so
strings are checked against the aliases' grammar here, not by pandas (``"unknown"``: no frequency).
``freq_key`` maps the aliases of one frequency to one key, so ``patch_sizes`` keys match whatever
the spelling; ``freq_id`` keeps the data's own strings.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from dask_windows.errors import ConfigError, SchemaError

__all__ = ["UNKNOWN", "check_freq", "freq_codes", "freq_key"]

#: A row whose ``freq`` is null (and no ``freq=`` given).
UNKNOWN = "unknown"

# Aliases of every pandas version (lower case) -> one name per frequency.
_CANON = {
    "n": "ns", "ns": "ns", "u": "us", "us": "us", "l": "ms", "ms": "ms",
    "s": "s", "sec": "s", "t": "min", "min": "min", "h": "h", "d": "D", "b": "B", "c": "C",
    "bh": "bh", "cbh": "cbh", "w": "W", "m": "M", "me": "M", "bm": "BM", "bme": "BM",
    "bms": "BMS", "sm": "SM", "sme": "SM", "sms": "SMS", "cbm": "CBM", "cbme": "CBM", "cbms": "CBMS",
    "q": "Q", "qe": "Q", "qs": "QS", "bq": "BQ", "bqe": "BQ", "bqs": "BQS",
    "a": "Y", "y": "Y", "ye": "Y", "as": "YS", "ys": "YS", "ba": "BY", "by": "BY", "bye": "BY",
    "bas": "BYS", "bys": "BYS", "wom": "WOM",
}  # fmt: skip
_DEFAULT_ANCHOR = {"W": "-SUN", "Q": "-DEC", "BQ": "-DEC", "Y": "-DEC", "BY": "-DEC", "QS": "-JAN", "YS": "-JAN"}
_ALIAS = re.compile(r"^(\d+(?:\.\d+)?)?([A-Za-z]+)(-[A-Za-z0-9]+)?$")


def freq_key(freq: str) -> str:
    """One key per frequency, whichever pandas alias names it (see the module docstring); unparsed: itself."""
    found = _ALIAS.match(freq.strip())
    if found is None or found.group(2).lower() not in _CANON:
        return freq
    count, alias, anchor = found.groups()
    if alias == "MS":  # month start: "ms" in lower case is the millisecond
        base = "MS"
    else:
        base = _CANON[alias.lower()]
    anchor = (anchor or _DEFAULT_ANCHOR.get(base, "")).upper()
    multiple = "" if count in (None, "1") else count
    return f"{multiple}{base}{anchor}"


def _valid(freq: Any) -> bool:
    if not isinstance(freq, str):
        return False
    if freq == UNKNOWN:
        return True
    found = _ALIAS.match(freq.strip())
    return found is not None and found.group(2).lower() in _CANON


def check_freq(freq: Any, what: str) -> str:
    """``freq`` if it is a frequency alias (or ``"unknown"``), else ``ConfigError`` naming ``what``."""
    if not _valid(freq):
        raise ConfigError(
            f"{what}={freq!r} is not a frequency; give a pandas offset alias such as 'h', '15min', 'D', 'W', "
            "'M', 'Q', 'Y' (older spellings such as 'H', '15T', 'A' too)"
        )
    return str(freq)


def freq_codes(column: Any, default: str | None, where: str) -> tuple[list[str], np.ndarray]:
    """A ``freq`` column as ``(names, (rows,) index into names)``, names in order of first appearance.

    A null row takes ``default`` (``freq=``), else ``"unknown"``. The order depends only on the rows,
    never on how they are cut into partitions, so ``freq_id`` is the same for the same rows in
    every file format.
    """
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type) or pa.types.is_null(column.type)):
        raise SchemaError(f"column 'freq' of {where} is {column.type}; it needs strings (pandas offset aliases)")
    encoded = column.dictionary_encode()
    given = ["" if v is None else str(v) for v in encoded.dictionary.to_pylist()] + [default or UNKNOWN]
    raw = encoded.indices.fill_null(len(given) - 1).to_numpy(zero_copy_only=False).astype(np.int64)  # (rows,)
    _, first = np.unique(raw, return_index=True)
    order = raw[np.sort(first)]  # dictionary entries in order of first appearance
    names: list[str] = []
    remap = np.zeros(len(given), np.int64)
    for k in order.tolist():
        name = given[k]
        if not _valid(name):
            raise SchemaError(
                f"{where}: column 'freq' holds {name!r}, which is not a frequency; write pandas offset aliases "
                "('h', '15min', 'D', 'W', 'M', 'Q', 'Y', or older spellings such as 'H', '15T', 'A')"
            )
        if name not in names:  # a null row beside a row that says the default: one name
            names.append(name)
        remap[k] = names.index(name)
    return names, remap[raw]
