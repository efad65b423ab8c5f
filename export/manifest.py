"""The artifact directory's ``manifest.json`` and ``sample_io.npz`` (docs/contracts.md): typed records,
writer and reader."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgemask.errors import CorruptFileError, EdgemaskError
from edgemask.fileio import atomic_path, write_json_atomic

SCHEMA = 1
MANIFEST = "manifest.json"
SAMPLE_IO = "sample_io.npz"


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
    runtime: str
    opset: int | None = None
    backend: str | None = None
    max_abs_diff: float | None = None  # vs the compacted torch model (fp32 variants)
    accuracy: float | None = None  # on the sample_io labels, run in its runtime
    accuracy_change: float | None = None  # int8 variants: vs the fp32 torch model on the client's test split


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
    sample_io: dict[str, Any]  # {"file", "sha256", "count"}
    params: dict[str, int]  # {"dense", "compacted"}
    flops: dict[str, int]
    layers: list[dict[str, Any]]  # [{"name", "kept", "total"}]
    tolerance: dict[str, Any]  # {"limit", "max_abs_diff": {"torch": .., "onnx": ..}}
    created: str
    input_hash: str = ""  # sha256 of the run's weights + client file + export settings (skip if unchanged)
    schema: int = SCHEMA

    def file_for(self, fmt: str, variant: str = "fp32") -> ArtifactFile:
        for f in self.files:
            if f.format == fmt and f.variant == variant:
                return f
        have = ", ".join(f"{f.format}/{f.variant}" for f in self.files) or "(none)"
        raise EdgemaskError(f"artifact {self.run_id}/{self.client_id} has no {fmt}/{variant} file; it has: {have}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Manifest":
        d = dict(d)
        d["inputs"] = [TensorSpec(**t) for t in d["inputs"]]
        d["outputs"] = [TensorSpec(**t) for t in d["outputs"]]
        d["files"] = [ArtifactFile(**f) for f in d["files"]]
        return cls(**d)


def write_manifest(directory: Path, manifest: Manifest) -> Path:
    path = Path(directory) / MANIFEST
    write_json_atomic(path, manifest.to_dict())
    return path


def load_manifest(directory: str | Path) -> Manifest:
    """Read ``<directory>/manifest.json``; a missing, unreadable or malformed one raises naming the file."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise EdgemaskError(f"{path}: not found; export the run first (`edgemask export --run RUN`)")
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        if d.get("schema") != SCHEMA:
            raise ValueError(f"schema {d.get('schema')!r}, expected {SCHEMA}")
        return Manifest.from_dict(d)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise CorruptFileError(f"{path}: not a valid artifact manifest ({e}); re-export this client") from None


def write_sample_io(path: Path, inputs: np.ndarray, outputs: np.ndarray, labels: np.ndarray) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, input=inputs, output=outputs.astype(np.float32), label=labels.astype(np.int64))


def load_sample_io(path: str | Path) -> dict[str, np.ndarray]:
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            out = {k: z[k] for k in ("input", "output", "label")}
    except (OSError, ValueError, KeyError) as e:
        raise CorruptFileError(f"{path}: not a valid sample_io.npz ({e}); re-export this client") from None
    return out
