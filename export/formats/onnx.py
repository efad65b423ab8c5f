"""ONNX via torch.onnx, run in onnxruntime; int8 by onnxruntime static quantization (QDQ) with calibration
samples from the client's train split.

Opset ≥ 18 uses the dynamo exporter. Older opsets (e.g. ``jetson-tx2``: onnxruntime 1.10, opset ≤ 15) use the
TorchScript exporter, which targets them natively: the dynamo exporter's down-conversion silently leaves
opset 18 when a node cannot be adapted (ReduceMean's axes, seen here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from edgemask.fileio import atomic_path
from edgemask.export.formats.base import FORMATS, ExportFormatError, Format, FormatContext, quiet_exporters


def _export_fp32(model: nn.Module, path: Path, example: torch.Tensor, opset: int) -> None:
    with quiet_exporters():
        torch.onnx.export(model.eval(), (example,), str(path), dynamo=opset >= 18, opset_version=opset,
                          input_names=["input"], output_names=["output"], external_data=False,
                          verbose=False)


def _opset_of(path: Path) -> int:
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    return next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))


class Onnx(Format):
    name = "onnx"
    variants = ("fp32", "int8")

    def write(self, model: nn.Module, path: Path, ctx: FormatContext, variant: str = "fp32") -> dict[str, Any]:
        opset = ctx.settings.onnx_opset()
        if variant == "fp32":
            with atomic_path(path) as tmp:
                _export_fp32(model, tmp, ctx.example, opset)
                got = _opset_of(tmp)
                if got > opset:
                    raise ExportFormatError(f"{path.name}: exporter wrote opset {got}, above the requested {opset}")
        elif variant == "int8":
            if ctx.calibration is None:
                raise ExportFormatError(f"{path.name}: int8 needs calibration samples")
            from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

            class Reader(CalibrationDataReader):
                def __init__(self, xs: np.ndarray) -> None:
                    self.it = iter(xs)

                def get_next(self):
                    x = next(self.it, None)
                    return None if x is None else {"input": x[None]}

            fp32 = path.with_name(f".{path.name}.fp32.onnx")
            try:
                _export_fp32(model, fp32, ctx.example, opset)
                with atomic_path(path) as tmp:
                    quantize_static(str(fp32), str(tmp), Reader(ctx.calibration.numpy()),
                                    quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                                    weight_type=QuantType.QInt8, per_channel=True)
            finally:
                fp32.unlink(missing_ok=True)
        else:
            raise ExportFormatError(f"onnx: unknown variant {variant!r}; valid: {', '.join(self.variants)}")
        return {"opset": _opset_of(path), "runtime": self.runtime}

    def run(self, path: Path, inputs: np.ndarray, threads: int = 1) -> np.ndarray:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        return np.concatenate([sess.run(None, {name: x[None]})[0] for x in inputs]).astype(np.float32)


FORMATS.add("onnx", Onnx())
