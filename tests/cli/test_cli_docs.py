"""docs/cli.md against the command line: every flag in its command's synopsis, and the examples'
figures reproduced on the data set the page describes."""

from __future__ import annotations

import argparse
import os
import re

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
