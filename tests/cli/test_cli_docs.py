"""docs/cli.md against the command line: every flag in its command's synopsis, and the examples'
figures reproduced on the data set the page describes."""

from __future__ import annotations

import argparse
import os
import re

import pytest

from dask_windows.cli.main import build_parser

PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "cli.md")


def _page() -> str:
    with open(PAGE, encoding="utf-8") as f:
        return f.read()


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M)


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_flag_of_every_command_is_in_its_synopsis():
    blocks = _code_blocks(_page())
    for name, parser in _commands().items():
        # a synopsis: a line of a block that starts with the command, and its indented lines
        # (examples start with "$ ")
        entries = [e for b in blocks for e in re.split(r"^(?=dask-windows )", b, flags=re.M)]
        synopsis = "\n".join(e for e in entries if e.startswith(f"dask-windows {name} "))
        assert synopsis, f"docs/cli.md has no synopsis of `dask-windows {name}`"
        flags = {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
        missing = sorted(flags - {"--help", "--verbose"} - set(re.findall(r"--[a-z][a-z-]*", synopsis)))
        assert not missing, f"the synopsis of `dask-windows {name}` in docs/cli.md lacks {missing}"
        unknown = sorted(set(re.findall(r"--[a-z][a-z-]*", synopsis)) - flags)
        assert not unknown, f"the synopsis of `dask-windows {name}` in docs/cli.md names flags it has not: {unknown}"
    assert "`--verbose`" in _page() and "--version" in _page()


# -- the examples, on the data set the page describes ----------------------------------------


def write_raw(folder: str) -> None:
    """The page's data set: 24 hourly CSV exports (``pandas.to_csv``), each 60 readings of 200 sensors
    in random order, ISO-8601 timestamps, a few NaN values in ``c``. Seeded: the same bytes each time."""
    import numpy as np
    import pandas as pd

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    for hour in range(24):
        minutes = pd.Timestamp("2024-01-01") + pd.to_timedelta(hour * 60 + np.arange(60), unit="min")
        frame = pd.DataFrame({"sensor_id": np.repeat(np.arange(200), 60), "timestamp": np.tile(minutes, 200)})
        for column in "abc":
            frame[column] = rng.standard_normal(len(frame))
        frame.loc[rng.random(len(frame)) < 0.00025, "c"] = np.nan
        frame["y"] = rng.standard_normal(len(frame))
        frame.sample(frac=1, random_state=hour).to_csv(os.path.join(folder, f"hour-{hour:03d}.csv"), index=False)


#: the commands whose examples are run, in page order (the others need folders of their own)
RUN = (
    "dask-windows convert raw/ sensors/ --series sensor_id --time timestamp --partition-size 4MB",
    "dask-windows inspect sensors/",
    "dask-windows stats sensors/",
    "dask-windows stats raw/hour-000.csv",
)


def _examples(text: str) -> list[tuple[str, list[str]]]:
    """``(command, expected lines)`` of every ``$ dask-windows ...`` example on the page that ``RUN`` names."""
    out = []
    for block in _code_blocks(text):
        for part in re.split(r"^\$ ", block, flags=re.M)[1:]:
            command, *lines = part.rstrip("\n").split("\n")
            if command.startswith(RUN):
                out.append((command, lines))
    return out


def _figures(lines: list[str]) -> list[str]:
    """The lines that carry figures or errors: not progress labels or bars, nor the time taken."""
    return [
        line.rstrip()
        for line in lines
        if (line == "..." or line.startswith("dask-windows ") or re.search(r"\d", line))
        and not line.startswith(("[", "time "))
    ]


@pytest.mark.slow  # about 10 s: 288,000 rows of CSV written, converted and inspected
def test_the_pages_examples_print_what_the_commands_print(tmp_path, monkeypatch, capsys):
    """The convert, inspect and stats examples of docs/cli.md, run on the data set it describes."""
    import shlex

    import dask

    from dask_windows.cli import cluster
    from dask_windows.cli.main import main

    monkeypatch.setattr(cluster._Cluster, "compute", lambda self, label, *c: dask.compute(*c, scheduler="sync"))
    monkeypatch.chdir(tmp_path)
    write_raw("raw")
    examples = _examples(_page())
    assert {c.split()[1] for c, _ in examples} == {"convert", "inspect", "stats"}
    for command, lines in examples:
        capsys.readouterr()
        main(shlex.split(command)[1:])
        got = capsys.readouterr()
        printed = (got.out + got.err).replace(str(tmp_path), "/tmp/cli_docs").splitlines()
        want, have = _figures(lines), _figures(printed)
        at = 0
        for line in want:  # in order; "..." stands for lines left out
            if line == "...":
                continue
            assert line in have[at:], f"docs/cli.md, `{command}`: {line!r} is not printed; it prints:\n" + "\n".join(
                have
            )
            at = have.index(line, at) + 1


if __name__ == "__main__":  # python tests/cli/test_cli_docs.py raw/: writes the page's data set
    import sys

    write_raw(sys.argv[1] if len(sys.argv) > 1 else "raw")
