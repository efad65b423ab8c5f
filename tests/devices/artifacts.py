"""Tiny real artifact directories (ONNX built with onnx.helper) for the devices tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgemask.fileio import sha256_file
from edgemask.manifest import SAMPLE_IO, ArtifactFile, Manifest, TensorSpec, write_manifest, write_sample_io


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
                  opset: int = 13, perturb_output: float = 0.0, perturb_relative: float = 0.0,
                  model_name: str = "model.onnx", seed: int = 0, tolerance: dict | None = None) -> Path:
    """An artifact dir like export's: model.onnx, sample_io.npz, manifest.json (written by the contract's writers).

    The first ``wrong_labels`` labels differ from the model's argmax, so accuracy = (n - wrong_labels) / n.
    The reference outputs are the model's y × (1 + ``perturb_relative``) + ``perturb_output`` (to part them from
    what the model computes on purpose). ``seed``: another seed is another model (a re-export that changed the
    file). ``tolerance``: the manifest's (default: an absolute 1e-5 without rtol, as written before issue #37).
    """
    rng = np.random.default_rng(seed)
    d = Path(root)
    d.mkdir(parents=True, exist_ok=True)
    w = rng.standard_normal((out_dim, in_dim)).astype(np.float32)
    b = rng.standard_normal(out_dim).astype(np.float32)
    make_onnx_model(d / model_name, w, b, opset)
    x = rng.standard_normal((n, in_dim)).astype(np.float32)
    y = (x.astype(np.float64) @ w.T.astype(np.float64) + b).astype(np.float32)
    labels = y.argmax(1).astype(np.int64)
    labels[:wrong_labels] = (labels[:wrong_labels] + 1) % out_dim
    write_sample_io(d / SAMPLE_IO, x, y * np.float32(1 + perturb_relative) + np.float32(perturb_output), labels)
    model_file = ArtifactFile(format="onnx", variant="fp32", file=model_name, sha256=sha256_file(d / model_name),
                              bytes=(d / model_name).stat().st_size, runtime="onnxruntime", opset=opset)
    write_manifest(d, Manifest(
        run_id="run-test", client_id="client-007", kind="compacted", algorithm="fedmask", model="linear",
        dataset="synthetic",
        inputs=[TensorSpec("input", [1, in_dim], "float32")], outputs=[TensorSpec("output", [1, out_dim], "float32")],
        files=[model_file],
        sample_io={"file": SAMPLE_IO, "sha256": sha256_file(d / SAMPLE_IO), "count": n},
        params={"dense": w.size + b.size, "compacted": w.size + b.size},
        flops={"dense": 2 * w.size, "compacted": 2 * w.size},
        layers=[{"name": "fc", "kept": out_dim, "total": out_dim}],
        tolerance=tolerance or {"limit": 1e-5, "max_abs_diff": {}},
        created="2026-11-22T10:00:00Z",
    ))
    return d
