"""The one set of checks for a number or a path a user gives: every command line option and every number a stage
derives from a file goes through these, so each mistake reads the same and none slips past one command that
another refuses (issue #44).

Each check takes ``what`` (the option or field, e.g. ``"--deadline"`` or ``"trace.json: latency_ms"``) and the
value, and returns the value made what it should be, or raises :class:`~edgemask.errors.ConfigError` in one line::

    --deadline nan: not a finite number; give seconds above 0, at most 604800

Numbers are parsed here too (a command line gives text): ``"1e400"`` is ``inf`` and refused, a NaN never passes a
comparison unnoticed (``nan < 0`` is False), and a count is an integer written as one (``"1.5"`` and ``"1e3"`` are
refused rather than rounded).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from edgemask.errors import ConfigError

WEEK_S = 7 * 24 * 3600.0
MAX_COUNT = 1 << 20  # a count with no bound of its own: far above any real one, far below an allocation's overflow


def _show(value: object) -> str:
    text = value if isinstance(value, str) else repr(value)
    return repr(text[:40] + "…") if len(text) > 40 else (repr(text) if not text or text != text.strip() else text)


def number(what: str, value: object) -> float:
    """``value`` (text or a number) as a finite float; NaN, ±inf, text that is no number and booleans refused."""
    if isinstance(value, bool):
        raise ConfigError(f"{what} {value}: not a number; give a finite number")
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{what} {_show(value)}: not a number; give a finite number") from None
    if not math.isfinite(x):
        raise ConfigError(f"{what} {_show(value)}: not a finite number; give a finite number")
    return x


def bounded(what: str, value: object, low: float, high: float, *, low_open: bool = False, unit: str = "") -> float:
    """A finite number in [low, high] (``low_open``: (low, high]); the message states the range in ``unit``."""
    rng = f"{unit or 'a number'} " + (f"above {low:g}, at most {high:g}" if low_open else f"from {low:g} to {high:g}")
    try:
        x = number(what, value)
    except ConfigError as e:
        raise ConfigError(f"{str(e).split(';')[0]}; give {rng}") from None
    if not (low < x if low_open else low <= x) or not x <= high:
        raise ConfigError(f"{what} {_show(value)}: out of range; give {rng}")
    return x


def seconds(what: str, value: object, *, zero: bool = False, maximum: float = WEEK_S) -> float:
    """Seconds: finite, above 0 (``zero``: 0 allowed, e.g. "do not wait") and at most ``maximum`` (a week)."""
    return bounded(what, value, 0.0, maximum, low_open=not zero, unit="seconds")


def positive(what: str, value: object, maximum: float, unit: str) -> float:
    """A finite quantity above 0 and at most ``maximum`` (a bandwidth in kbit/s, a size)."""
    return bounded(what, value, 0.0, maximum, low_open=True, unit=unit)


def fraction(what: str, value: object) -> float:
    """A fraction in (0, 1] (an accuracy target, a share): 95 for 95 % is refused, with what to write instead."""
    return bounded(what, value, 0.0, 1.0, low_open=True, unit="a fraction (0.95 for 95 %)")


def count(what: str, value: object, *, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
    """An integer from ``minimum`` to ``maximum``, written as one (``"2"``, not ``"2.0"`` or ``"1e3"``)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{what} {_show(value)}: not a whole number; give one from {minimum} to {maximum}")
    try:
        n = int(value, 10) if isinstance(value, str) else value
    except ValueError:
        raise ConfigError(f"{what} {_show(value)}: not a whole number; give one from {minimum} to {maximum}") from None
    if not minimum <= n <= maximum:
        raise ConfigError(f"{what} {_show(value)}: out of range; give a whole number from {minimum} to {maximum}")
    return n


def _path(what: str, value: object) -> Path:
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ConfigError(f"{what}: empty; give a path")
    text = str(value)
    if any(ord(c) < 32 for c in text):
        raise ConfigError(f"{what} {_show(text)}: holds a control character; give a plain path")
    return Path(text)


def input_file(what: str, value: object) -> Path:
    """An existing regular file (a link to one is fine): a folder, a missing path or a dangling link refused."""
    p = _path(what, value)
    if p.is_dir():
        raise ConfigError(f"{what} {p}: is a directory; give a file")
    if not p.is_file():
        why = "a link to nothing" if p.is_symlink() else "no such file"
        raise ConfigError(f"{what} {p}: {why}; give an existing file")
    return p


def input_dir(what: str, value: object) -> Path:
    """An existing directory: a file or a missing path refused."""
    p = _path(what, value)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{what} {p}: is a file, not a directory; give a directory")
    if not p.is_dir():
        raise ConfigError(f"{what} {p}: no such directory; give an existing one")
    return p


def output_file(what: str, value: object, inputs: dict[str, Path] | None = None) -> Path:
    """A file to write (a temporary name, then renamed): not a directory, its folder existing, and none of the
    command's ``inputs`` (option -> path), whether named directly or through a link."""
    p = _path(what, value)
    if p.is_dir():
        raise ConfigError(f"{what} {p}: is a directory; give a file name to write")
    if not p.parent.is_dir():
        raise ConfigError(f"{what} {p}: its folder {p.parent} does not exist; create it or write elsewhere")
    if p.is_symlink() or (p.exists() and not p.is_file()):
        raise ConfigError(f"{what} {p}: is a link or a special file; give a plain file name to write")
    for option, src in (inputs or {}).items():
        try:
            same = p.exists() and src.exists() and os.path.samefile(p, src)
        except OSError:
            same = False
        if same or p.resolve() == src.resolve():
            raise ConfigError(f"{what} {p}: is {option}'s input {src}; write to a new file")
    return p
