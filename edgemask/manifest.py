"""The artifact directory's ``manifest.json`` and ``sample_io.npz`` (docs/contracts.md): typed records, the one
writer and the one reader that export, devices and profiling all use.

Torch-free on purpose (numpy only): ``devices`` and ``profiling`` read manifests on machines and in processes
that never load torch.

Every reader failure is one ``CorruptFileError`` line that names the file, and the field where one is at fault:
a missing manifest says to export first; invalid JSON, another schema, a missing, unknown or mistyped field say
to re-export.
"""

from __future__ import annotations

import functools
import json
import types
import typing
import zipfile
from dataclasses import MISSING, asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from edgemask.errors import ConfigError, CorruptFileError, UnknownNameError
from edgemask.fileio import atomic_path, sha256_file, write_json_atomic
from edgemask.workspace import check_name

SCHEMA = 1
MANIFEST = "manifest.json"
SAMPLE_IO = "sample_io.npz"

_EXPORT_FIRST = "export the artifact first (`edgemask export --run RUN`)"
_REEXPORT = "re-export the artifact (`edgemask export --run RUN`)"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: list[int]
    dtype: str


@dataclass(frozen=True)
class ArtifactFile:
    format: str  # onnx | pte | tflite
    variant: str  # fp32 | int8
    file: str
    sha256: str
    bytes: int
    runtime: str  # onnxruntime | executorch | tflite
    opset: int | None = None
    backend: str | None = None
    max_abs_diff: float | None = None  # vs the compacted torch model on the sample_io inputs (fp32 variants)
    accuracy: float | None = None  # this file run in its runtime, on accuracy_set's first accuracy_samples samples
    accuracy_change: float | None = None  # int8 variants: accuracy minus the same format's fp32 file's, same samples
    accuracy_set: str | None = None  # "<client>/test": whose test split (the dense baseline: the first client's)
    accuracy_samples: int | None = None  # how many of that split's samples (its first ones)


class SampleIOInfo(TypedDict):
    file: str
    sha256: str
    count: int


class Counts(TypedDict):  # parameters or FLOPs of the dense model and of the compacted one
    dense: int
    compacted: int


class KeptDead(TypedDict):
    reason: str  # why compaction keeps these dead units (export.compact.LayerStat.why_kept)
    units: list[int]  # unit indices in the dense layer


class LayerAttribution(TypedDict, total=False):
    """Optional per-layer fields written by ``export.layers``: FLOPs of one sample, dense and compacted, per
    ONNX file the names its graph carries for the layer (node and output tensor names), the units the client's
    masks kill (``dead``) and the dead units compaction keeps, with why (``why_kept``)."""

    flops_dense: int
    flops_compacted: int
    graph_names: dict[str, list[str]]
    dead: int
    why_kept: list[KeptDead]


class LayerUnits(LayerAttribution):
    name: str  # module path (the same in the dense and the compacted model)
    kept: int
    total: int


class _RelativePart(TypedDict, total=False):
    rtol: float  # absent in manifests written before it was recorded (issue #37): read as 0 (Manifest.tolerance_rule)


class Tolerance(_RelativePart):
    """The rule export held the compacted model and every fp32 file to, elementwise
    |y - y_ref| <= limit + rtol·|y_ref| (``export.verify.Tolerance``: ``limit`` is its atol), and what it measured."""

    limit: float
    max_abs_diff: dict[str, float]  # "torch" and each fp32 format -> its max abs diff


class TrainingInfo(TypedDict):
    """The client's local step (issue #39, ``export.training``): its ``train_io.npz`` (the minibatch, the SGD
    settings, the host's tensors after one step; ``sha256``, checked where read), the round it belongs to
    (``steps_per_round`` = ⌈num_train / batch_size⌉ · epochs), what trains, and the rule each training file's
    one step met against torch's (|t − t_ref| ≤ limit + rtol·|t_ref|; ``max_abs_diff`` per format)."""

    file: str
    sha256: str
    batch_size: int
    steps_per_round: int
    epochs: int
    num_train: int
    lr: float
    momentum: float
    trained: list[str]  # the trainable tensors the step updates, in the programs' t0, t1, ... order
    frozen: list[str]  # the task's trainable tensors kept whole by grad_keep: constants of the step
    trained_params: int
    step: str  # the task's functions: "fedmask.forward + fedmask.group_lasso"
    limit: float
    rtol: float
    max_abs_diff: dict[str, float]


@dataclass(frozen=True)
class Manifest:
    run_id: str
    client_id: str
    kind: str  # "compacted" | "dense"
    algorithm: str
    model: str
    dataset: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    files: list[ArtifactFile]
    sample_io: SampleIOInfo
    params: Counts
    flops: Counts
    layers: list[LayerUnits]
    tolerance: Tolerance
    created: str
    etrecord: str | None = None  # ExecuTorch ETRecord file beside the .pte (export.layers.write_etrecord)
    input_hash: str = ""  # sha256 of the run's weights + client file + export settings (skip if unchanged)
    training: TrainingInfo | None = None  # the local step's files (formats pte-train, torch-train), if exported
    schema: int = SCHEMA

    @property
    def artifact(self) -> str:
        return f"{self.run_id}/{self.client_id}"

    @property
    def tolerance_rule(self) -> tuple[float, float]:
        """``(atol, rtol)`` of the rule export held this artifact's fp32 files to, |y - y_ref| <= atol +
        rtol·|y_ref|: what a device holds them to. A manifest without ``tolerance.rtol`` was written when the
        limit was absolute (before issue #37): rtol 0."""
        return self.tolerance["limit"], self.tolerance.get("rtol", 0.0)

    def find_file(self, fmt: str, variant: str = "fp32") -> ArtifactFile | None:
        return next((f for f in self.files if f.format == fmt and f.variant == variant), None)

    def file_for(self, fmt: str, variant: str = "fp32", *, where: str | Path | None = None) -> ArtifactFile:
        """The ``fmt``/``variant`` file; none raises ``UnknownNameError`` naming ``where`` (default: the
        artifact) and the files the manifest has."""
        found = self.find_file(fmt, variant)
        if found is None:
            have = ", ".join(sorted(f"{f.format}/{f.variant}" for f in self.files)) or "none"
            place = where if where is not None else f"artifact {self.artifact}"
            raise UnknownNameError(f"{place}: no {fmt}/{variant} file in the manifest; it has: {have}")
        return found

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> "Manifest":
        """Check ``d`` against the schema and build the records; raises ``ValueError`` naming the field."""
        if not isinstance(d, dict):
            raise _Invalid(f"not a JSON object but {_json_type(d)}")
        if "schema" not in d:
            raise _Invalid("missing field 'schema'")
        if d["schema"] != SCHEMA:
            raise _Invalid(f"field 'schema' is {d['schema']!r}; this edgemask reads schema {SCHEMA}")
        m = _parse(d, cls, "")
        names = {f"files[{i}].file": f.file for i, f in enumerate(m.files)}
        names["sample_io.file"] = m.sample_io["file"]
        if m.training is not None:
            names["training.file"] = m.training["file"]
        for where, name in names.items():  # each becomes <artifact>/<file>: never a path out of the artifact directory
            try:
                check_name(name, f"field {where!r}")
            except ConfigError as e:
                raise _Invalid(str(e)) from None
        return m


def manifest_path(path: str | Path) -> Path:
    """``path`` is an artifact directory or its ``manifest.json``."""
    path = Path(path)
    return path if path.name == MANIFEST else path / MANIFEST


def write_manifest(directory: str | Path, manifest: Manifest) -> Path:
    """Write ``<directory>/manifest.json`` atomically. A manifest the reader would refuse is never written."""
    path = Path(directory) / MANIFEST
    data = manifest.to_dict()
    try:
        Manifest.from_dict(data)
    except ValueError as e:
        raise TypeError(f"{path}: refusing to write an invalid manifest: {e}") from None
    write_json_atomic(path, data)
    return path


def load_manifest(path: str | Path) -> Manifest:
    """Read an artifact's manifest (``path``: the artifact directory or its ``manifest.json``).

    Raises ``CorruptFileError`` naming the file: missing (export first), or unreadable, invalid JSON, another
    schema, a missing, unknown or mistyped field (named, e.g. ``files[0].sha256``; re-export).
    """
    path = manifest_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CorruptFileError(f"{path}: no manifest; {_EXPORT_FIRST}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CorruptFileError(f"{path}: cannot read the manifest ({_one_line(e)}); {_REEXPORT}") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise CorruptFileError(f"{path}: not valid JSON ({e}); {_REEXPORT}") from None
    try:
        return Manifest.from_dict(d)
    except _Invalid as e:
        raise CorruptFileError(f"{path}: {e}; {_REEXPORT}") from None


def load_artifact(path: str | Path) -> Manifest:
    """Read an artifact directory's manifest (:func:`load_manifest`) and check it against where it sits and the
    files it describes: what a campaign measures and a report shows must be what the manifest says (issue #27).

    - ``run_id`` / ``client_id`` must name the directories it sits in (``artifacts/<run_id>/<client_id>/``): an
      artifact copied under another client's name is refused, never measured as that client;
    - every ``files[i]``: present, ``bytes`` equal to its size (the report's size reduction), ``sha256`` equal to
      its digest; ``sample_io``: present, ``sha256`` equal to its digest (a device checks its outputs against it).
    Each failure is one ``CorruptFileError`` naming the file and the field. Hashing reads every file once."""
    mpath = manifest_path(path)
    m = load_manifest(mpath)
    where = mpath.parent
    if (where.parent.name, where.name) != (m.run_id, m.client_id):
        raise CorruptFileError(f"{mpath}: run_id/client_id say {m.run_id}/{m.client_id} but it sits at "
                               f"{where.parent.name}/{where.name}: an artifact copied under another name is not "
                               f"that artifact; export run {where.parent.name} (`edgemask export --run "
                               f"{where.parent.name}`) instead of copying")
    checks = [(f"files[{i}]", f.file, f.bytes, f.sha256) for i, f in enumerate(m.files)]
    checks.append(("sample_io", m.sample_io["file"], None, m.sample_io["sha256"]))
    if m.training is not None:
        checks.append(("training", m.training["file"], None, m.training["sha256"]))
    for field, name, size, digest in checks:
        f = where / name
        try:
            actual = f.stat().st_size
            got = sha256_file(f) if size is None or actual == size else None
        except FileNotFoundError:
            raise CorruptFileError(f"{f}: missing, though {mpath.name} field {field + '.file'!r} names it; "
                                   f"{_REEXPORT}") from None
        except OSError as e:
            raise CorruptFileError(f"{f}: cannot read it ({e.strerror}); {_REEXPORT}") from None
        if size is not None and actual != size:
            raise CorruptFileError(f"{mpath}: field {field + '.bytes'!r} is {size} but {name} has {actual} bytes; "
                                   f"{_REEXPORT}")
        if got != digest:
            raise CorruptFileError(f"{mpath}: field {field + '.sha256'!r} is {digest[:12]}... but {name} hashes to "
                                   f"{got[:12]}...: the file changed after export; {_REEXPORT}")
    return m


def write_sample_io(path: str | Path, inputs: np.ndarray, outputs: np.ndarray, labels: np.ndarray) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, input=inputs, output=outputs.astype(np.float32), label=labels.astype(np.int64))


def load_sample_io(path: str | Path) -> dict[str, np.ndarray]:
    """``{"input", "output", "label"}`` arrays of a ``sample_io.npz``; failures name the file, like the manifest's."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in ("input", "output", "label")}
    except FileNotFoundError:
        raise CorruptFileError(f"{path}: no sample_io; {_EXPORT_FIRST}") from None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise CorruptFileError(f"{path}: not a valid sample_io.npz ({_one_line(e)}); {_REEXPORT}") from None


# ------------------------------------------------------------------------------------------------
# Checking JSON against the records' annotations
# ------------------------------------------------------------------------------------------------
class _Invalid(ValueError):
    """A manifest field is missing, unknown or of the wrong type; the message names it."""


_JSON_TYPES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _json_type(value: Any) -> str:
    """How ``value`` reads in JSON: ``null``, ``true``, ``a string ("12")``, ``a list``, ..."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    shown = json.dumps(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"{_JSON_TYPES.get(type(value), type(value).__name__)} ({shown})"


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _parse(value: Any, tp: Any, where: str) -> Any:
    """``value`` (decoded JSON) checked against the annotation ``tp``; returns it with the records built.

    ``where`` is the field's path (``files[0].sha256``) for the message."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _parse(value, inner, where)
    if origin is list:
        _expect(isinstance(value, list), value, "a list", where)
        return [_parse(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _expect(isinstance(value, dict), value, "an object", where)
        return {k: _parse(v, args[1], f"{where}.{k}") for k, v in value.items()}
    if typing.is_typeddict(tp) or is_dataclass(tp):
        _expect(isinstance(value, dict), value, "an object", where)
        hints = _hints(tp)
        required = (tp.__required_keys__ if typing.is_typeddict(tp) else
                    {f.name for f in fields(tp) if f.default is MISSING and f.default_factory is MISSING})
        prefix = f"{where}." if where else ""
        for key in hints:
            if key in required and key not in value:
                raise _Invalid(f"missing field {prefix + key!r}")
        for key in value:
            if key not in hints:
                raise _Invalid(f"unknown field {prefix + key!r}")
        parsed = {k: _parse(v, hints[k], prefix + k) for k, v in value.items()}
        return tp(**parsed) if is_dataclass(tp) else parsed
    if tp is float:
        _expect(isinstance(value, (int, float)) and not isinstance(value, bool), value, "a number", where)
        return float(value)
    if tp in (str, int, bool):
        _expect(isinstance(value, tp) and (tp is bool or not isinstance(value, bool)), value, _JSON_TYPES[tp], where)
        return value
    raise TypeError(f"manifest field {where!r}: no check for annotation {tp!r}")  # a new field type: add it here


def _expect(ok: bool, value: Any, expected: str, where: str) -> None:
    if not ok:
        raise _Invalid(f"field {where!r} is {_json_type(value)}, expected {expected}")
