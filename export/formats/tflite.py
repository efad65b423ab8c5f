"""TFLite via litert-torch, run with ai-edge-litert's interpreter (the optional ``tflite`` extra)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from export.formats.base import FORMATS, ExportFormatError, Format, FormatContext, FormatUnavailableError

INSTALL = "install the tflite extra: pip install -e .[tflite]"


class Tflite(Format):
    name = "tflite"
    runtime = "tflite"

    def check_available(self) -> None:
        missing = [m for m in ("litert_torch", "ai_edge_litert") if importlib.util.find_spec(m) is None]
        if missing:
            raise FormatUnavailableError(f"format 'tflite' needs {', '.join(missing)}; {INSTALL}")

    def write(self, model: nn.Module, path: Path, ctx: FormatContext, variant: str = "fp32") -> dict[str, Any]:
        self.check_available()
        if variant != "fp32":
            raise ExportFormatError(f"tflite: unknown variant {variant!r}; valid: fp32")
        import litert_torch

        from edgemask.fileio import atomic_path

        edge = litert_torch.convert(model.eval(), (ctx.example,))
        with atomic_path(path) as tmp:
            edge.export(str(tmp))
        return {"runtime": self.runtime}

    def run(self, path: Path, inputs: np.ndarray, threads: int = 1) -> np.ndarray:
        self.check_available()
        from ai_edge_litert.interpreter import Interpreter

        it = Interpreter(model_path=str(path), num_threads=threads)
        it.allocate_tensors()
        inp, out = it.get_input_details()[0], it.get_output_details()[0]
        res = []
        for x in inputs:
            it.set_tensor(inp["index"], x[None].astype(inp["dtype"]))
            it.invoke()
            res.append(it.get_tensor(out["index"]).copy())
        return np.concatenate(res).astype(np.float32)


FORMATS.add("tflite", Tflite())
