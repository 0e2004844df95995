"""One time type for CSV inputs whose time column Arrow infers differently per file.

``DataFrame.to_csv`` writes one datetime column in the shortest text that
holds its values: ``2020-01-01`` when every time is midnight, seconds when
none has a fraction, fractions otherwise. Arrow infers ``date32``,
``timestamp[s]`` and ``timestamp[ns]`` from these, so files cut from one
frame disagree on a column that ``convert`` parses with
``pandas.to_datetime`` anyway. This module settles the time column before the
schemas are compared: every date or timestamp kind (all with an offset, or
all without) is one parsed timestamp, and with ``--parse-time`` whatever the
files hold is parsed. The other columns are compared as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["PARSED", "time_parsing"]

PARSED = "timestamp (parsed)"  # the one label every parsed time column gets


def _is_time_kind(kind: str) -> bool:
    return kind.startswith(("timestamp", "date"))


def time_parsing(
    fmt: str, schemas: Sequence[dict[str, str]], time: str, parse_time: bool | str
) -> tuple[list[dict[str, str]], bool | str, str | None]:
    """The schemas with the time column settled, how to parse it, and a remedy.

    Args:
        fmt: the input format; only ``"csv"`` is settled here.
        schemas: each file's column types (``readers.file_schemas``).
        time: the time column.
        parse_time: ``--parse-time`` (``True``, ``"utc"`` or ``False``).

    Returns:
        ``(schemas, parsing, remedy)``: ``parsing`` is ``False``, ``True`` or
        ``"utc"`` (parse to UTC: the text has offsets); ``remedy`` is the flag
        to advise when the time column still differs between files, or
        ``None``.
    """
    if fmt != "csv" or not schemas:
        return list(schemas), parse_time, None
    kinds = [s[time] for s in schemas if s.get(time, "null") != "null"]
    if parse_time:
        return [_settled(s, time) for s in schemas], parse_time, None
    if not kinds or not all(_is_time_kind(k) for k in kinds):
        remedy = f"pass --parse-time to parse column {time!r} of every file with pandas.to_datetime"
        return list(schemas), False, remedy if len(set(kinds)) > 1 else None
    zoned = {"tz=" in k for k in kinds}
    if len(zoned) > 1:
        remedy = (
            f"column {time!r} has UTC offsets in some files and none in others; write every "
            f"time with an offset (or none) and convert again"
        )
        return list(schemas), True, remedy
    return [_settled(s, time) for s in schemas], "utc" if zoned.pop() else True, None


def _settled(schema: dict[str, str], time: str) -> dict[str, str]:
    return {n: (PARSED if n == time else t) for n, t in schema.items()}
