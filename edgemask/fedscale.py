"""FedScale's device traces, read without trusting the file (issue #46: a trace as a run's device mix).

FedScale (Lai et al., "FedScale: Benchmarking Model and System Performance of Federated Learning at Scale", ICML
2022) publishes two kinds of device trace (``benchmark/dataset/data/device_info/README.md``): "Both files are
dictionaries of entries with the formats outlined above and have been serialized using `pickle`."

- ``client_device_capacity``, "a client device computation and communication capacity trace":
  ``{client id: {"computation": ms per sample, "communication": kbit/s}}``. FedScale's words for the first
  (``ClientMetadata.get_completion_time``): "compute_speed is the inference latency of models (ms/sample). As
  reproted in many papers, backward-pass takes around 2x the latency, so we multiple it by 3x"; for the second,
  "communication latency = (pull + push)_update_size/bandwidth", sizes in kbit. ``edgemask report`` writes one
  from a campaign's measurements (:mod:`edgemask.profiling.trace`).
- ``client_behave_trace``, the "client availability trace": ``{client id: {"duration": int, "inactive": [int],
  "finish_time": int, "active": [int], "model": str}}``. FedScale's ``ClientMetadata.is_active(cur_time)``:
  ``norm_time = cur_time % finish_time``, active when ``active[i] <= norm_time <= inactive[i]``.

Unpickling runs whatever callable a file names, so a trace is read by :class:`PlainUnpickler`, which resolves no
global but the builtins ``dict``, ``list``, ``float``, ``int`` and ``str``: a file holding anything else (a numpy
scalar, a class) is refused naming the file and what it asked for. A file whose name ends in ``.json`` is read as
JSON of the same structure (client ids as strings of integers). Every entry is checked (:func:`read_capacity`,
:func:`read_availability`): a mistake is one :class:`~edgemask.errors.ConfigError` line naming the file, the
client and the field.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from edgemask.errors import ConfigError

# what a trace may name: the builtins its plain values are (pickle's own opcodes carry dict, list, tuple, str, int,
# float, bool and None without naming any)
ALLOWED_GLOBALS = frozenset({("builtins", "dict"), ("builtins", "list"), ("builtins", "float"), ("builtins", "int"),
                             ("builtins", "str")})
CAPACITY_FIELDS = ("computation", "communication")
AVAILABILITY_FIELDS = ("active", "inactive", "finish_time")  # what is read; "duration" and "model" may be there too


class PlainUnpickler(pickle.Unpickler):
    """An unpickler that builds plain data only: :data:`ALLOWED_GLOBALS`, no other class or function."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, which a trace of plain numbers needs not (only "
                                     f"dict, list, float, int and str are read)")


@dataclass(frozen=True)
class Capacity:
    """One client of ``client_device_capacity``."""

    computation_ms: float  # ms per sample: one inference (FedScale multiplies it by its augmentation factor)
    communication_kbps: float  # kbit/s, up and down


@dataclass(frozen=True)
class Availability:
    """One client of ``client_behave_trace``: its available intervals ``[active[i], inactive[i]]`` (s), repeating
    every ``finish_time`` seconds."""

    active: tuple[float, ...]
    inactive: tuple[float, ...]
    finish_time: float

    def is_active(self, t: float) -> bool:
        """Whether the client is available at ``t`` seconds: FedScale's rule (``norm_time = t % finish_time``,
        ``active[i] <= norm_time <= inactive[i]``) over every interval. FedScale walks its intervals with an index
        that moves one interval a call, which gives the same answer when it is asked at least once an interval."""
        norm = t % self.finish_time
        return any(a <= norm <= b for a, b in zip(self.active, self.inactive))


@dataclass(frozen=True)
class TraceFile:
    """A trace file as read: its path, its bytes' sha256 and its clients (id -> entry), ids in ascending order."""

    path: str
    sha256: str
    clients: dict[int, Any]


def _read_clients(path: str | Path, field: str, parse: Callable[[int, Any], Any]) -> TraceFile:
    """The trace at ``path`` with each client's entry read by ``parse(client id, entry)``, ids ascending."""
    data, digest = _load(path, field)
    clients = {(cid := _client_id(path, key)): parse(cid, entry) for key, entry in data.items()}
    return TraceFile(str(path), digest, dict(sorted(clients.items())))


def read_capacity(path: str | Path, field: str = "capacity") -> TraceFile:
    """``client_device_capacity`` at ``path`` (``field``: the config field naming it, for a message): each client's
    computation (ms per sample) and communication (kbit/s), positive finite numbers."""

    def parse(cid: int, entry: Any) -> Capacity:
        e = _entry(path, cid, entry, CAPACITY_FIELDS, "a table {\"computation\": ms per sample, \"communication\": "
                                                      "kbit/s}")
        return Capacity(_number(path, cid, "computation", e["computation"], positive=True),
                        _number(path, cid, "communication", e["communication"], positive=True))

    return _read_clients(path, field, parse)


def read_availability(path: str | Path, field: str = "availability") -> TraceFile:
    """``client_behave_trace`` at ``path``: each client's ``active`` and ``inactive`` lists (seconds, as many of
    one as of the other, at least one) and ``finish_time`` (the period they repeat over, > 0)."""

    def parse(cid: int, entry: Any) -> Availability:
        e = _entry(path, cid, entry, AVAILABILITY_FIELDS, "a table {\"active\": [s], \"inactive\": [s], "
                                                          "\"finish_time\": s}")
        lists = {}
        for name in ("active", "inactive"):
            v = e[name]
            if not isinstance(v, (list, tuple)) or not v:
                raise ConfigError(f"{path}: client {cid}: field {name} is {_short(v)}; expected a non-empty list of "
                                  f"seconds (FedScale's client_behave_trace)")
            lists[name] = tuple(_number(path, cid, f"{name}[{i}]", x, nonnegative=True) for i, x in enumerate(v))
        if len(lists["active"]) != len(lists["inactive"]):
            raise ConfigError(f"{path}: client {cid}: fields active and inactive hold {len(lists['active'])} and "
                              f"{len(lists['inactive'])} times; expected one inactive time per active one")
        return Availability(lists["active"], lists["inactive"],
                            _number(path, cid, "finish_time", e["finish_time"], positive=True))

    return _read_clients(path, field, parse)


def _load(path: str | Path, field: str) -> tuple[dict, str]:
    """The file's top-level dictionary (pickle through :class:`PlainUnpickler`, or JSON for ``*.json``) and its
    sha256."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file ([system.trace] {field}); give the path of a FedScale trace, relative "
                          f"to the working directory") from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: a directory, not a trace file ([system.trace] {field}); name the file") from None
    except OSError as e:
        raise ConfigError(f"{p}: unreadable ({e.strerror}) ([system.trace] {field})") from None
    if p.suffix == ".json":
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise ConfigError(f"{p}: not JSON ({e}); write FedScale's dictionary as a JSON object") from None
    else:
        try:
            data = PlainUnpickler(io.BytesIO(raw)).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError,
                OverflowError, UnicodeDecodeError, RecursionError) as e:
            why = " ".join(str(e).split()) or type(e).__name__
            raise ConfigError(f"{p}: not a plain pickle of FedScale's dictionary ({why}); give FedScale's file, or "
                              f"the same dictionary as JSON in a file ending in .json") from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{p}: holds {_short(data)}; expected FedScale's non-empty dictionary {{client id: "
                          f"entry}} ([system.trace] {field})")
    return data, hashlib.sha256(raw).hexdigest()


def _client_id(path: str | Path, key: Any) -> int:
    """A client id: an integer (a JSON key: its decimal text)."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    if isinstance(key, str) and key.strip().lstrip("-").isdigit():
        return int(key)
    raise ConfigError(f"{path}: client id {_short(key)} is no integer; FedScale's traces key clients by integer ids")


def _entry(path: str | Path, cid: int, entry: Any, required: tuple[str, ...], shape: str) -> dict:
    if not isinstance(entry, dict):
        raise ConfigError(f"{path}: client {cid}: its entry is {_short(entry)}; expected {shape}")
    for name in required:
        if name not in entry:
            raise ConfigError(f"{path}: client {cid}: field {name} missing; expected {shape}")
    return entry


def _number(path: str | Path, cid: int, name: str, v: Any, *, positive: bool = False,
            nonnegative: bool = False) -> float:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    ok = ok and (not positive or v > 0) and (not nonnegative or v >= 0)
    if not ok:
        want = "positive " if positive else "non-negative " if nonnegative else ""
        raise ConfigError(f"{path}: client {cid}: field {name} is {_short(v)}; expected a finite {want}number")
    return float(v)


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."
