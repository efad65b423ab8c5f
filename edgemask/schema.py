"""Checking a TOML table against a declared schema, with one wording for every mistake.

Every config file edgemask reads (``campaign.toml``, ``devices.toml``, a training config with its
``[algorithm.args]`` and ``[model.args]``) declares its tables as a mapping of field name -> :class:`Field` (type,
default, range, choices) and reads them through :class:`Table`. Where a table becomes a dataclass, the dataclass is
the one declaration: each field's type is its annotation, its default the dataclass's, its limits given with
:func:`setting` (``rounds: int = setting(20, minimum=1)``), and :func:`schema_of` derives the table's schema from
it (:func:`signature_schema` does the same for a function's keyword parameters: a model builder's). A mistake is one
:class:`~edgemask.errors.ConfigError` line in one form::

    <file>: [table] field: what is wrong; what to do

e.g. ``campaign.toml: [campaign] formts: unknown field; did you mean 'formats'? valid fields: cooldown_s, …`` or
``devices.toml: [devices.tx2] port: 70000 is out of range; use a value between 1 and 65535``. Checks that only
one file knows (a Jetson-only field, a name that becomes a path) raise through :meth:`Table.error`, so they read
the same.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import functools
import inspect
import math
import types
import typing
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from edgemask.errors import ConfigError

REQUIRED: Any = object()  # a Field's default when the field must be given
ANY = (bool, int, float, str, list, dict)  # a Field's kind that accepts every TOML value (an unannotated parameter)

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
    a tuple accepts any of them (:data:`ANY`: every TOML value). ``minimum``/``maximum`` are inclusive,
    ``above``/``below`` exclusive. ``choices``: the valid strings (a :class:`~edgemask.registry.Registry` too), for
    a str or for each item of a list, called ``what`` in messages. A list with ``items`` holds values of that type; ``nonempty`` and ``unique`` constrain
    it. ``check``: a further test of the value returning what is wrong and what to do (``"…; …"``), or None."""

    kind: type | tuple[type, ...]
    default: Any = REQUIRED
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    below: float | None = None
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
        if k is list and isinstance(value, tuple):  # a config built in code may hold a tuple where TOML has a list
            return True
    return False


def _range_text(f: Field) -> str | None:
    if f.minimum is not None and f.maximum is not None:
        return f"between {f.minimum:g} and {f.maximum:g}"
    if f.above is not None and f.below is not None:
        return f"between {f.above:g} and {f.below:g}, both excluded"
    low = f">= {f.minimum:g}" if f.minimum is not None else f"> {f.above:g}" if f.above is not None else None
    high = f"<= {f.maximum:g}" if f.maximum is not None else f"< {f.below:g}" if f.below is not None else None
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
                if not schema:
                    raise self.error(key, "unknown field", f"[{name}] takes no fields; remove it")
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
        words = "a value" if f.kind == ANY else " or ".join(_WORDS[k] for k in _kinds(f.kind))
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
        if not math.isfinite(value):  # TOML writes nan and inf; no setting means either (a NaN passes every `<`)
            raise self.error(key, f"{value!r} is not a finite number", "write a finite number")
        low = f.minimum is not None and value < f.minimum or f.above is not None and value <= f.above
        high = f.maximum is not None and value > f.maximum or f.below is not None and value >= f.below
        if low or high:
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


# -- one declaration: a dataclass (or a function's signature) is the schema -----------------------------------------
_SCHEMA_KEY = "edgemask.schema"  # where setting() keeps a field's checks in its dataclass metadata
_CHECKS = frozenset(f.name for f in dataclasses.fields(Field)) - {"kind", "default"}


def setting(default: Any = dataclasses.MISSING, *, factory: Callable[[], Any] | Any = dataclasses.MISSING,
            **checks: Any) -> Any:
    """A dataclass field with its checks, declared once: ``rounds: int = setting(20, minimum=1)``. ``default`` (or
    ``factory`` for a mutable one) is the dataclass's default; ``checks`` are :class:`Field`'s limits
    (``minimum``, ``maximum``, ``above``, ``below``, ``choices``, ``what``, ``items``, ``nonempty``, ``unique``,
    ``check``). The kind is the field's annotation; :func:`schema_of` reads both back."""
    wrong = sorted(set(checks) - _CHECKS)
    if wrong:
        raise TypeError(f"setting(): unknown check(s) {', '.join(wrong)}; valid: {', '.join(sorted(_CHECKS))}")
    return dataclasses.field(default=default, default_factory=factory, metadata={_SCHEMA_KEY: checks})


def same_setting(cls: type, name: str) -> Any:
    """Field ``name`` of dataclass ``cls`` as a field of another dataclass, its default and checks those of the one
    declaration (FedPeWS's ``mu`` is FedProx's ``mu``)."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    return dataclasses.field(default=f.default, default_factory=f.default_factory, metadata=f.metadata)


def kind_of(annotation: Any) -> tuple[type | tuple[type, ...], type | None]:
    """``(kind, items)`` of a :class:`Field` for a type annotation: ``int`` -> int; ``float | None`` -> float
    (None is "not set", which TOML cannot write); ``tuple[int, ...]``, ``list[float]``, ``Sequence[int]`` -> a list
    of that type; ``dict[str, Any]`` -> a table; anything else (``Any``, none, a class of ours) -> :data:`ANY`."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(options) == 1:
            return kind_of(options[0])
        kinds = [kind_of(a)[0] for a in options]
        flat = tuple(dict.fromkeys(k for ks in kinds for k in (ks if isinstance(ks, tuple) else (ks,))))
        return flat, None
    if origin in (list, tuple, collections.abc.Sequence) or annotation in (list, tuple):
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        items = args[0] if args and all(a is args[0] for a in args) and args[0] in (bool, int, float, str) else None
        return list, items
    if origin is dict or annotation is dict:
        return dict, None
    if annotation in (bool, int, float, str):
        return annotation, None
    return ANY, None


def _resolved_hints(obj: Any) -> dict[str, Any]:
    """``obj``'s annotations as types; where one cannot be resolved (a name its module does not define), all of
    them as written (strings, read as :data:`ANY`)."""
    try:
        return typing.get_type_hints(obj)
    except Exception:  # noqa: BLE001 - an unresolvable annotation only loses the type check, never the names
        return dict(getattr(obj, "__annotations__", {}) or {})


@functools.lru_cache(maxsize=None)
def schema_of(cls: type) -> dict[str, Field]:
    """The schema of a dataclass's table: per field, its annotation's kind (:func:`kind_of`), the dataclass's
    default, and the limits given with :func:`setting`."""
    hints = _resolved_hints(cls)
    out: dict[str, Field] = {}
    for f in dataclasses.fields(cls):
        kind, items = kind_of(hints.get(f.name))
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = REQUIRED
        out[f.name] = Field(kind, default, **{"items": items, **f.metadata.get(_SCHEMA_KEY, {})})
    return out


def signature_schema(fn: Callable[..., Any], skip: int = 0) -> tuple[dict[str, Field], bool]:
    """The schema of ``fn``'s keyword parameters after its first ``skip`` (those it is always given
    positionally): per parameter, its annotation's kind (:func:`kind_of`) and its default. The bool: ``fn`` takes
    ``**kwargs`` too, so names outside the schema cannot be refused."""
    params = list(inspect.signature(fn).parameters.values())[skip:]
    hints = _resolved_hints(fn)
    out = {}
    for p in params:
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            kind, items = kind_of(hints.get(p.name))
            out[p.name] = Field(kind, REQUIRED if p.default is p.empty else p.default, items=items)
    return out, any(p.kind is p.VAR_KEYWORD for p in params)


def _unset_dropped(data: Any, schema: Mapping[str, Field]) -> Any:
    """``data`` without the entries that are None where None is the field's default: "not set" (a config
    written by ``to_dict()`` holds them so; TOML itself has no None)."""
    if not isinstance(data, dict):
        return data
    return {k: v for k, v in data.items() if not (v is None and k in schema and schema[k].default is None)}


def read_dataclass(source: str, name: str, data: Any, cls: type) -> Any:
    """Table ``[name]`` of ``source`` read into dataclass ``cls`` through :func:`schema_of` (a field left out keeps
    the dataclass's default)."""
    schema = schema_of(cls)
    return cls(**Table(source, name, _unset_dropped(data, schema), schema).values())


class _Option(Table):
    """A command-line option standing for one field: its errors read ``--rounds 0: …``, without a table."""

    def _where(self, key: str) -> str:
        return ""


def check_option(option: str, value: Any, cls: type, name: str) -> Any:
    """``value``, given as command-line ``option`` to override field ``name`` of dataclass ``cls``, checked by that
    field's one declaration, in the one wording: ``--rounds 0: 0 is out of range; use a value >= 1``."""
    return _Option(f"{option} {value}", "", {name: value}, {name: schema_of(cls)[name]})[name]


def check_call(source: str, name: str, data: Any, fn: Callable[..., Any], skip: int = 0) -> None:
    """Check table ``[name]`` of ``source`` against the keyword parameters ``fn`` will be called with
    (:func:`signature_schema`): unknown names (unless ``fn`` takes ``**kwargs``) and, where annotated, types."""
    schema, open_ = signature_schema(fn, skip)
    data = _unset_dropped(data, schema)
    if open_ and isinstance(data, dict):
        data = {k: v for k, v in data.items() if k in schema}
    table = Table(source, name, data, schema)
    for key in schema:  # each given value checked, each parameter without a default given
        table[key]
