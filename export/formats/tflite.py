"""TFLite via litert-torch, run with ai-edge-litert's interpreter (the optional ``tflite`` extra); int8 with
litert-torch's PT2E quantizer (per-channel symmetric int8 weights, int8 activations: prepare, calibrate on the
client's train samples, convert), lowered to TFLite's quantized kernels with ``QuantConfig`` (static mode)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from edgemask.export.formats.base import (FORMATS, ExportFormatError, Format, FormatContext, FormatUnavailableError,
                                 pt2e_quantized, quiet_exporters)

INSTALL = "install the tflite extra: pip install -e .[tflite]"


class Tflite(Format):
    name = "tflite"
    variants = ("fp32", "int8")

    def check_available(self) -> None:
        missing = [m for m in ("litert_torch", "ai_edge_litert") if importlib.util.find_spec(m) is None]
        if missing:
            raise FormatUnavailableError(f"format 'tflite' needs {', '.join(missing)}; {INSTALL}")

    def write(self, model: nn.Module, path: Path, ctx: FormatContext, variant: str = "fp32") -> dict[str, Any]:
        self.check_available()
        import litert_torch

        from edgemask.fileio import atomic_path

        model = model.eval()
        if variant == "fp32":
            with quiet_exporters():
                edge = litert_torch.convert(model, (ctx.example,))
        elif variant == "int8":
            from litert_torch.quantize.pt2e_quantizer import PT2EQuantizer, get_symmetric_quantization_config
            from litert_torch.quantize.quant_config import QuantConfig

            q = PT2EQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
            with quiet_exporters():
                # litert-torch reads the quantize/dequantize pairs: they stay unfolded (its own tests' setting)
                quantized = pt2e_quantized(model, ctx, q, path.name, fold_quantize=False)
                edge = litert_torch.convert(quantized, (ctx.example,), quant_config=QuantConfig(pt2e_quantizer=q))
        else:
            raise ExportFormatError(f"tflite: unknown variant {variant!r}; valid: {', '.join(self.variants)}")
        with atomic_path(path) as tmp, quiet_exporters():
            edge.export(str(tmp))
        return {"runtime": self.runtime}

    def run(self, path: Path, inputs: np.ndarray, threads: int = 1) -> np.ndarray:
        """An int8 file's input and output are int8 tensors: q = round(x / s) + z in, (q − z)·s out, with the
        (s, z) the file records for each."""
        self.check_available()
        from ai_edge_litert.interpreter import Interpreter

        it = Interpreter(model_path=str(path), num_threads=threads)
        it.allocate_tensors()
        inp, out = it.get_input_details()[0], it.get_output_details()[0]
        res = []
        for x in inputs:
            it.set_tensor(inp["index"], quantize(x[None], inp))
            it.invoke()
            res.append(dequantize(it.get_tensor(out["index"]), out))
        return np.concatenate(res).astype(np.float32)


def quantize(x: np.ndarray, detail: dict) -> np.ndarray:
    """``x`` as the tensor ``detail`` describes: unchanged in a float type, else q = clip(round(x / s) + z)."""
    dtype = np.dtype(detail["dtype"])
    scale, zero = detail["quantization"]
    if dtype.kind == "f" or scale == 0:
        return x.astype(dtype)
    info = np.iinfo(dtype)
    return np.clip(np.round(x / scale) + zero, info.min, info.max).astype(dtype)


def dequantize(q: np.ndarray, detail: dict) -> np.ndarray:
    """The real values of an output tensor: (q − z)·s for an integer one, a copy of a float one."""
    scale, zero = detail["quantization"]
    if np.dtype(detail["dtype"]).kind == "f" or scale == 0:
        return q.astype(np.float32)
    return ((q.astype(np.float32) - zero) * scale).astype(np.float32)


FORMATS.add("tflite", Tflite())
