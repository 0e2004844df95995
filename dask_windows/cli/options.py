"""Options shared by the ``dask-windows`` commands, their argument types, and :func:`_cli_message`,
which names flags where the loader's messages name keywords (``batch_size=0``)."""

from __future__ import annotations

import argparse
import re
import textwrap
from collections.abc import Iterable
from typing import Any

from dask_windows.cli.keywords import FLAGS, OPTIONS

__all__: list[str] = []  # internal to the command line


def _paragraphs(text: str) -> str:
    """Plain text wrapped at 79 columns, paragraphs kept (help shows no markup)."""
    return "\n\n".join(textwrap.fill(part, 79) for part in text.split("\n\n"))


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Shows ``(default: X)`` after every option with a meaningful default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            action.option_strings
            and "default" not in text
            and all(action.default is not v for v in (None, False, argparse.SUPPRESS))
            and action.nargs != 0
        ):
            text += " (default: %(default)s)"
        return text


def _parsed(kind: str, parse: Any) -> Any:
    """An argparse type: ``parse(text)`` or a usage error naming the flag and an example."""
    examples = {"size": "256MB, 2GiB or 1000000", "duration": "10s, 2min or 1.5", "memory": "auto, 4GB or 2GiB"}

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except (ValueError, TypeError, KeyError) as exc:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind} (e.g. {examples[kind]}): {exc}") from None

    convert.__name__ = kind
    return convert


def _size_arg(text: str) -> str:
    from dask.utils import parse_bytes

    if parse_bytes(text) <= 0:
        raise ValueError("it must be positive")
    return text


def _memory_arg(text: str) -> str:
    return text if text == "auto" else _size_arg(text)


def _duration_arg(text: str) -> str:
    from dask.utils import parse_timedelta

    parse_timedelta(text)
    return text


def _count(text: str) -> int:
    """A non-negative int (``num_workers``); the loader validates its own settings."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be an int >= 0")
    return value


_SIZE = _parsed("size", _size_arg)
_TIMEOUT = {
    "default": "10s",
    "metavar": "TIME",
    "type": _parsed("duration", _duration_arg),
    "help": "how long to try reaching --scheduler",
}


def _verbose_option(parser: argparse.ArgumentParser, dest: str) -> None:
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        dest=dest,
        help="log progress (-v) or debug details and tracebacks (-vv); allowed before or after the command",
    )


def _cluster_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cluster")
    group.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="address of a running Dask scheduler, e.g. tcp://10.0.0.5:8786 (default: start a LocalCluster)",
    )
    group.add_argument("--workers", type=_count, default=2, metavar="N", help="LocalCluster worker processes")
    group.add_argument(
        "--threads-per-worker", type=_count, default=1, metavar="N", help="threads in each LocalCluster worker"
    )
    group.add_argument(
        "--memory-limit",
        default="auto",
        type=_parsed("memory", _memory_arg),
        metavar="BYTES",
        help="LocalCluster memory limit per worker, e.g. 2GB",
    )
    group.add_argument(
        "--local-directory",
        metavar="DIR",
        help="where LocalCluster workers spill to disk (default: Dask's temporary directory)",
    )
    group.add_argument("--connect-timeout", **_TIMEOUT)
    group.add_argument("--no-progress", action="store_true", help="no progress bars on stderr (default: show them)")


def _keyword_options(parser: argparse.ArgumentParser, command: str, keywords: Iterable[str] = FLAGS) -> None:
    """The flags of ``cli.keywords``'s table that set ``keywords`` (default: all), as ``command`` has them."""
    types = {"count": _count, "size": _SIZE}
    for option in OPTIONS:
        if option.flag is not None and option.keyword in keywords:
            settings = {**option.settings, **(option.bench if command == "bench" else {})}
            if isinstance(settings.get("type"), str):
                settings["type"] = types[settings["type"]]
            parser.add_argument(option.flag, dest=option.keyword, **settings)


#: Python keywords in the loader's messages, and the flags that set them here.
_FLAGS = {**FLAGS, "num_workers": "--num-workers", "partition_size": "--partition-size"}


def _cli_message(message: str) -> str:
    """The loader's message with CLI flags: ``--flag: name=value ...``, ``--on-error skip``."""
    message = re.sub(r"on_error=['\"]skip['\"]", "--on-error skip", message)
    message = re.sub(r"\bnan=['\"](drop|raise)['\"]", r"--nan \1", message)
    message = re.sub(r"\bretries=\s?", "--retries ", message)
    message = message.replace("needs targets=[...]", "needs --targets")
    match = re.match(r"(\w+)(=| is required)", message)
    if "is also a feature" in message:
        message = f"--features: {message}"
    elif match and match.group(1) in _FLAGS:
        message = f"{_FLAGS[match.group(1)]}: {message}"
    return message
