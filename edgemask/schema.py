"""Checking a TOML table against a declared schema, with one wording for every mistake.

Every config file edgemask reads (``campaign.toml``, ``devices.toml``) declares its tables as a mapping of field
name -> :class:`Field` (type, default, range, choices) and reads them through :class:`Table`. A mistake is one
:class:`~edgemask.errors.ConfigError` line in one form::

    <file>: [table] field: what is wrong; what to do

e.g. ``campaign.toml: [campaign] formts: unknown field; did you mean 'formats'? valid fields: cooldown_s, …`` or
``devices.toml: [devices.tx2] port: 70000 is out of range; use a value between 1 and 65535``. Checks that only
one file knows (a Jetson-only field, a name that becomes a path) raise through :meth:`Table.error`, so they read
the same.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from edgemask.errors import ConfigError

REQUIRED: Any = object()  # a Field's default when the field must be given

# what each TOML type is called in a message, and how to write one
_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list",
          dict: "a table"}
_PLURAL = {bool: "true/false values", int: "integers", float: "numbers", str: "strings", list: "lists",
           dict: "tables"}
_HOW = {bool: "write true or false, without quotes", int: "write a whole number, without quotes",
        float: "write a number, without quotes", str: "write it in double quotes", list: "write a list in [ ]",
        dict: "write a table"}


@dataclass(frozen=True)
class Field:
    """One field of a table. ``kind``: bool, int, float (an int is accepted and made a float), str, list or dict;
    a tuple accepts any of them. ``minimum``/``maximum`` are inclusive, ``above`` exclusive. ``choices``: the
    valid strings (a :class:`~edgemask.registry.Registry` too), for a str or for each item of a list, called
    ``what`` in messages. A list with ``items`` holds values of that type; ``nonempty`` and ``unique`` constrain
    it. ``check``: a further test of the value returning what is wrong and what to do (``"…; …"``), or None."""

    kind: type | tuple[type, ...]
    default: Any = REQUIRED
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    choices: Collection[str] | None = None
    what: str = "name"
    items: type | None = None
    nonempty: bool = False
    unique: bool = False
    check: Callable[[Any], str | None] | None = None


def did_you_mean(word: str, valid: Collection[str]) -> str:
    """`` did you mean 'formats'?`` for the closest valid name, else ``""``."""
    close = difflib.get_close_matches(word, list(valid), n=1, cutoff=0.6)
    return f" did you mean {close[0]!r}?" if close else ""


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _is(value: Any, kind: type | tuple[type, ...]) -> bool:
    """``value`` is of ``kind`` as TOML means it: a bool is not an integer, an integer is a number."""
    for k in _kinds(kind):
        if k is bool and isinstance(value, bool):
            return True
        if k in (int, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
            if k is float or isinstance(value, int):
                return True
        if k not in (bool, int, float) and isinstance(value, k):
            return True
    return False


def _range_text(f: Field) -> str | None:
    if f.minimum is not None and f.maximum is not None:
        return f"between {f.minimum:g} and {f.maximum:g}"
    low = f">= {f.minimum:g}" if f.minimum is not None else f"> {f.above:g}" if f.above is not None else None
    high = f"<= {f.maximum:g}" if f.maximum is not None else None
    return " and ".join(t for t in (low, high) if t) or None


class Table:
    """One table of ``source`` read through its schema: unknown fields are refused when it is made, each value is
    checked when it is read (``table[key]``: the value, or the field's default when absent)."""

    def __init__(self, source: str, name: str, data: Any, schema: Mapping[str, Field]) -> None:
        self.source, self.name, self.schema = source, name, schema
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: {self._where('')}is {data!r}, not a table; write it as [{name}]")
        self.data = data
        for key in data:
            if key not in schema:
                valid = ", ".join(sorted(schema))
                raise self.error(key, "unknown field", f"{did_you_mean(key, schema)} valid fields: {valid}".strip())

    def _where(self, key: str) -> str:
        where = f"[{self.name}] " if self.name else ""
        return f"{where}{key}: " if key else where

    def error(self, key: str, wrong: str, todo: str) -> ConfigError:
        """The one wording: ``<file>: [table] key: wrong; todo``."""
        return ConfigError(f"{self.source}: {self._where(key)}{wrong}; {todo}")

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def __getitem__(self, key: str) -> Any:
        f = self.schema[key]
        words = " or ".join(_WORDS[k] for k in _kinds(f.kind))
        if key not in self.data:
            if f.default is REQUIRED:
                what = f"one of {', '.join(sorted(f.choices))}" if f.choices is not None else words
                raise self.error(key, "missing field", f"add {key} = … ({what})")
            return f.default
        value = self.data[key]
        if not _is(value, f.kind):
            raise self.error(key, f"must be {words}, not {value!r}", _HOW[_kinds(f.kind)[0]])
        if isinstance(value, list):
            self._check_list(key, value, f)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            self._check_range(key, value, f)
            if float in _kinds(f.kind) and int not in _kinds(f.kind):
                value = float(value)
        elif isinstance(value, str) and f.choices is not None and value not in f.choices:
            raise self._unknown(key, value, f)
        if f.check is not None and (why := f.check(value)):
            wrong, _, todo = why.partition("; ")
            raise self.error(key, wrong, todo)
        return value

    def values(self) -> dict[str, Any]:
        """Every field of the schema that this table gives, checked."""
        return {key: self[key] for key in self.schema if key in self.data}

    def _unknown(self, key: str, value: str, f: Field) -> ConfigError:
        return self.error(key, f"unknown {f.what} {value!r}", f"valid names: {', '.join(sorted(f.choices))}")

    def _check_range(self, key: str, value: float, f: Field) -> None:
        low = f.minimum is not None and value < f.minimum or f.above is not None and value <= f.above
        if low or f.maximum is not None and value > f.maximum:
            raise self.error(key, f"{value!r} is out of range", f"use a value {_range_text(f)}")

    def _check_list(self, key: str, value: list, f: Field) -> None:
        if f.nonempty and not value:
            raise self.error(key, "is empty", f"name at least one {f.what}")
        seen = []
        for item in value:
            if f.items is not None and not _is(item, f.items):
                raise self.error(key, f"must be a list of {_PLURAL[f.items]}, not {value!r}",
                                 _HOW[f.items] + ", for each item")
            if isinstance(item, (int, float)) and not isinstance(item, bool):
                self._check_range(key, item, f)
            if f.choices is not None and item not in f.choices:
                raise self._unknown(key, item, f)
            if f.unique and item in seen:
                raise self.error(key, f"names {item!r} twice", "list each once")
            seen.append(item)
