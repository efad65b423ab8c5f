"""Domain errors: each carries a one-line reason that names the file, field or host and what to do."""

from __future__ import annotations


class EdgemaskError(Exception):
    """An expected failure: bad input, a missing file, an unreachable host.

    The command line prints ``str(error)`` on one line and exits non-zero, without a traceback.
    """


class ConfigError(EdgemaskError):
    """A configuration file or field is invalid."""


class UnknownNameError(EdgemaskError, KeyError):
    """A name looked up in a registry does not exist; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


class CorruptFileError(EdgemaskError):
    """A file is missing where a stage expects it, or cannot be read as what it should be (truncated, wrong
    format, a missing or mistyped field, bad hash)."""
