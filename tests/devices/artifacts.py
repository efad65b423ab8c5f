"""Tiny real artifact directories (ONNX built with onnx.helper) for the devices tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgemask.fileio import sha256_file


def make_onnx_model(path: Path, w: np.ndarray, b: np.ndarray, opset: int = 13) -> None:
    """y = x @ w.T + b as one Gemm; x (1, in), y (1, out); static batch 1."""
    out_dim, in_dim = w.shape
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["input", "w", "b"], ["output"], transB=1)],
        "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, in_dim])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, out_dim])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def make_artifact(root: Path, n: int = 8, in_dim: int = 6, out_dim: int = 4, wrong_labels: int = 2,
                  opset: int = 13, perturb_output: float = 0.0, model_name: str = "model.onnx") -> Path:
    """An artifact dir like export's: model.onnx, sample_io.npz, manifest.json.

    The first ``wrong_labels`` labels differ from the model's argmax, so accuracy = (n - wrong_labels) / n.
    ``perturb_output`` is added to the reference outputs (to make the output check fail on purpose).
    """
    rng = np.random.default_rng(0)
    d = Path(root)
    d.mkdir(parents=True, exist_ok=True)
    w = rng.standard_normal((out_dim, in_dim)).astype(np.float32)
    b = rng.standard_normal(out_dim).astype(np.float32)
    make_onnx_model(d / model_name, w, b, opset)
    x = rng.standard_normal((n, in_dim)).astype(np.float32)
    y = (x.astype(np.float64) @ w.T.astype(np.float64) + b).astype(np.float32)
    labels = y.argmax(1).astype(np.int64)
    labels[:wrong_labels] = (labels[:wrong_labels] + 1) % out_dim
    np.savez(d / "sample_io.npz", input=x, output=y + np.float32(perturb_output), label=labels)
    manifest = {
        "schema": 1, "run_id": "run-test", "client_id": "client-007", "kind": "compacted",
        "inputs": [{"name": "input", "shape": [1, in_dim], "dtype": "float32"}],
        "outputs": [{"name": "output", "shape": [1, out_dim], "dtype": "float32"}],
        "files": [{"format": "onnx", "variant": "fp32", "file": model_name, "sha256": sha256_file(d / model_name),
                   "bytes": (d / model_name).stat().st_size, "opset": opset, "runtime": "onnxruntime"}],
        "sample_io": {"file": "sample_io.npz", "sha256": sha256_file(d / "sample_io.npz"), "count": n},
    }
    (d / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return d
