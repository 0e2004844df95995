"""Exception types, each a subclass of a built-in so callers may catch either; beside them the fault
machinery: ``faults`` (raise or skip an unreadable partition), ``failures`` (which kind a failure is,
and its message) and ``remedies`` (where the generic remedy would mislead)."""

from __future__ import annotations

__all__ = ["ConfigError", "DataError", "SchemaError", "SourceReadError"]


class ConfigError(ValueError):
    """An invalid parameter combination given to a dataset or function."""


class DataError(ValueError):
    """The data itself breaks a rule (NaN inside a window, no windows at all)."""


class SchemaError(DataError, KeyError):
    """A column is missing or the files of a dataset disagree on their schema."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class SourceReadError(OSError):
    """A partition could not be read (unreadable, truncated or corrupt)."""
