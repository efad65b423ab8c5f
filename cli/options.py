"""What each command line option takes, declared once on the option: its check (:mod:`edgemask.values`, the one
set of validators), run by argparse as the option's ``type`` so a bad value is refused before any work starts.

Every option that takes a value names a :class:`Value` (``tests/cli/test_option_sweep.py`` fails on one that does
not, and feeds each the bad values its ``kind`` admits: negative, zero, NaN, ±inf, huge, empty, malformed, a
directory for a file, a missing file, the command's input as its output, a link to it). A refusal is one line::

    edgemask budgets: error: --deadline nan: not a finite number; give seconds above 0, at most 604800
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from edgemask import values
from edgemask.errors import ConfigError
from edgemask.workspace import check_name

MAX_TEXT = 4096  # a path or URL longer than this is no real one (Linux's PATH_MAX)


class OneLineParser(argparse.ArgumentParser):
    """argparse with the project's one-line refusal: ``edgemask <command>: error: <why>``, exit 2, no usage block
    (``--help`` still shows it)."""

    def error(self, message: str) -> NoReturn:
        for action in self._actions:  # "argument --deadline: --deadline nan: …" -> "--deadline nan: …"
            for flag in action.option_strings or [action.dest]:
                prefix = f"argument {flag}: "
                if message.startswith(prefix) and message[len(prefix):].startswith(flag):
                    message = message[len(prefix):]
        if "invalid choice" in message:
            message += f"; see `{self.prog} --help`"
        self.exit(2, f"{self.prog}: error: {message.splitlines()[0] if message else 'bad arguments'}\n")


@dataclass(frozen=True)
class Value:
    """What an option takes. ``kind`` says which bad values the sweep feeds it; ``check(what, text)`` returns the
    value or raises ConfigError; ``inputs``: for an output, the options whose files it must not overwrite."""

    kind: str
    check: Callable[[str, str], Any]
    inputs: tuple[str, ...] = field(default=())

    def bind(self, flag: str) -> Callable[[str], Any]:
        def convert(text: str) -> Any:
            try:
                return self.check(flag, text)
            except ConfigError as e:
                raise argparse.ArgumentTypeError(str(e)) from None

        convert.value = self  # type: ignore[attr-defined]  # read by the sweep
        convert.__name__ = self.kind  # argparse names the type in some messages
        return convert


def _text(what: str, text: str) -> str:
    if not text.strip():
        raise ConfigError(f"{what}: empty; give a value")
    if any(ord(c) < 32 for c in text) or len(text) > MAX_TEXT:
        raise ConfigError(f"{what} {text[:40]!r}: holds a control character or is too long; give a plain value")
    return text


def seconds(zero: bool = False) -> Value:
    return Value("seconds0" if zero else "seconds", lambda w, t: values.seconds(w, t, zero=zero))


def count(maximum: int = values.MAX_COUNT) -> Value:
    return Value("count", lambda w, t: values.count(w, t, maximum=maximum))


def positive(maximum: float, unit: str) -> Value:
    return Value("positive", lambda w, t: values.positive(w, t, maximum, unit))


FRACTION = Value("fraction", values.fraction)
INPUT_FILE = Value("file", values.input_file)
INPUT_DIR = Value("dir", values.input_dir)


def output_file(*inputs: str) -> Value:
    return Value("out", values.output_file, inputs)


def setting(where: str, name: str, kind: str, parse: Callable[[str, str], Any] = _text) -> Value:
    """An option that overrides setting ``name`` of the config dataclass at ``where`` (``module:Class``, imported
    when the option is given: the trainer's config imports torch): checked by ``parse`` and then by that setting's
    one declaration (:func:`edgemask.schema.check_option`), so the option and the config say the same."""

    def check(what: str, text: str) -> Any:
        import importlib

        from edgemask.schema import check_option

        module, cls = where.split(":")
        return check_option(what, parse(what, text), getattr(importlib.import_module(module), cls), name)

    return Value(kind, check)


def _name(what: str, text: str) -> str:
    return check_name(text, what)


NAME = Value("name", _name)  # a run id, a device's name: one plain path component


def run_ref(what: str, text: str) -> str:
    """``export --run``: a run id under runs/ or a path to a run directory (checked when it is read)."""
    text = _text(what, text)
    return text if "/" in text else check_name(text, what)


RUN_REF = Value("run", run_ref)
TEXT = Value("text", _text)  # free text checked by its command against what it reads (a history's metric)


def choice(names: Collection[str], what_kind: str) -> Value:
    """One of ``names`` (a registry's), refused with the valid ones listed."""

    def check(what: str, text: str) -> str:
        if text not in names:
            raise ConfigError(f"{what} {text!r}: unknown {what_kind}; valid: {', '.join(sorted(names))}")
        return text

    return Value("choice", check)


def name_list(names: Collection[str] | None, what_kind: str, all_: bool = False) -> Value:
    """A comma-separated list of names (``onnx,pte``), each of ``names`` when given, none twice, at least one;
    ``all_``: the word ``all`` stands for every name."""

    def check(what: str, text: str) -> list[str] | str:
        if all_ and text == "all":
            return text
        items = [n.strip() for n in text.split(",")]
        if not text.strip() or any(not n for n in items):
            raise ConfigError(f"{what} {text!r}: an empty name; give names separated by commas")
        dup = next((n for i, n in enumerate(items) if n in items[:i]), None)
        if dup is not None:
            raise ConfigError(f"{what} {text}: {dup!r} is given twice; name each once")
        for n in items:
            if names is not None and n not in names:
                raise ConfigError(f"{what} {n!r}: unknown {what_kind}; valid: {', '.join(sorted(names))}")
            check_name(n, what)
        return items

    return Value("names", check)


def url(what: str, text: str) -> str:
    """A package index's address: http(s)://host/…"""
    from urllib.parse import urlsplit

    text = _text(what, text)
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{what} {text!r}: not an http(s) address; give e.g. https://download.pytorch.org/whl/cpu")
    return text


URL = Value("url", url)


def workspace(what: str, text: str) -> str:
    """A workspace folder (created by the stages that write it): not empty, not a file or under one."""
    from edgemask.workspace import Workspace

    text = _text(what, text)
    try:
        Workspace.at(text)
    except ConfigError as e:
        raise ConfigError(f"{what} {text}: {str(e).split(': ', 1)[-1]}") from None
    return text


WORKSPACE = Value("workspace", workspace)


def mix(what: str, text: str) -> dict[str, float]:
    """``local=0.3,pi=0.7``: board names with shares in (0, 1] adding up to 1."""
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        board, sep, share = part.partition("=")
        if not sep or not board:
            raise ConfigError(f"{what}: {part!r} is not <board>=<share>; e.g. {what} jetson-tx2=0.3,rpi4=0.7")
        check_name(board, what)
        if board in out:
            raise ConfigError(f"{what}: board {board!r} is given twice; name each once")
        out[board] = values.fraction(f"{what} {board}=", share)
    total = sum(out.values())
    if abs(total - 1.0) > 1e-6:
        raise ConfigError(f"{what} {text}: the shares add up to {total:g}; make them add up to 1")
    return out


MIX = Value("mix", mix)


def add(parser: argparse.ArgumentParser, *flags: str, value: Value, **kw: Any) -> argparse.Action:
    """``parser.add_argument(*flags, **kw)`` with ``value`` as the option's check."""
    return parser.add_argument(*flags, type=value.bind(flags[0]), **kw)


def check_inputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """After parsing: an output option that names one of its command's inputs (or a link to one) is refused."""
    for action in parser._actions:
        v = getattr(action.type, "value", None)
        out = getattr(args, action.dest, None)
        if v is None or not v.inputs or out is None:
            continue
        given = {f: Path(getattr(args, a.dest)) for a in parser._actions for f in a.option_strings
                 if f in v.inputs and getattr(args, a.dest, None) is not None}
        try:
            values.output_file(action.option_strings[0], out, given)
        except ConfigError as e:
            parser.error(str(e))


def stderr_line(message: str) -> None:
    print(message, file=sys.stderr)
