"""Reading TOML with one-line errors, and writing the small subset our configs use (tables of scalars,
lists and nested tables) — ``tomllib`` only reads."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

from edgemask.errors import ConfigError


def read_toml(path: str | Path, missing: str = "file not found") -> dict[str, Any]:
    """Parse a TOML file; a missing or malformed file is a one-line ConfigError naming it
    (``missing`` says what to do when it does not exist)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: {missing}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_scalar(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else _scalar(k)


def dumps_toml(data: dict[str, Any], _prefix: str = "") -> str:
    """Scalars first, then sub-tables as ``[a.b]`` sections. ``None`` values are omitted."""
    lines, tables = [], []
    for k, v in data.items():
        if v is None:
            continue
        if isinstance(v, dict) and _prefix == "" or (isinstance(v, dict) and v and all(
                isinstance(x, dict) for x in v.values())):
            tables.append((k, v))
        else:
            lines.append(f"{_key(k)} = {_scalar(v)}")
    out = "\n".join(lines) + ("\n" if lines else "")
    for k, v in tables:
        name = f"{_prefix}.{_key(k)}" if _prefix else _key(k)
        out += f"\n[{name}]\n" + dumps_toml(v, name)
    return out
