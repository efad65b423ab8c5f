"""What every export format provides, the format registry and the device profiles that constrain formats (their
facts, and each format's runtime and file names, are :mod:`edgemask.targets`')."""

from __future__ import annotations

import contextlib
import logging
import warnings

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from edgemask.errors import EdgemaskError
from edgemask.export.runtime import runtime_layout
from edgemask.registry import Registry
from edgemask.targets import BOARDS, FORMATS as FORMAT_FACTS, BoardProfile


class FormatUnavailableError(EdgemaskError):
    """The converter or runtime of a format is not installed."""


class ExportFormatError(EdgemaskError):
    """A converter failed, or its file does not compute what the torch model computes."""


class FormatRuntimeError(ExportFormatError):
    """A converter or a runtime failed on one model's file during export: one line naming the model (client),
    the format and the converter's or runtime's own message."""


class LayerUnsupportedError(ExportFormatError):
    """A format's converter or runtime cannot take one layer of a model (it fails on that layer alone,
    :func:`edgemask.export.formats.isolate.failing_layer`): that format is skipped for the model, the others are
    written."""


# What a target board's runtime can read (--target): the boards' one table, edgemask.targets, as a registry so an
# unknown name lists the valid ones.
DeviceProfile = BoardProfile
DEVICE_PROFILES: Registry[DeviceProfile] = Registry("device profile")
for _kind in ("jetson-tx2", "rpi4"):  # the boards with a fixed profile (linux, local: whatever is installed)
    DEVICE_PROFILES.add(_kind, BOARDS[_kind])


@dataclass(frozen=True)
class ExportSettings:
    """Format options; part of the input hash that decides whether a client is re-exported."""

    opset: int = 18
    device_profile: str | None = None
    int8: bool = False  # also write int8 variants where the format has one

    def onnx_opset(self) -> int:
        if self.device_profile is None:
            return self.opset
        cap = DEVICE_PROFILES.get(self.device_profile).max_onnx_opset
        return min(self.opset, cap) if cap else self.opset


@dataclass
class FormatContext:
    """What a format needs besides the model: a batch-1 example and, for int8, calibration inputs."""

    example: torch.Tensor  # (1, *input_shape), in the runtimes' layout (runtime_layout)
    settings: ExportSettings = field(default_factory=ExportSettings)
    calibration: torch.Tensor | None = None  # (N, *input_shape) from the client's train split

    def __post_init__(self) -> None:
        self.example = runtime_layout(self.example)  # every file is traced with the layout it will be fed
        if self.calibration is not None:
            self.calibration = runtime_layout(self.calibration)


class Format:
    """One export format. ``write`` returns the manifest fields it adds (opset, backend, runtime, ...)."""

    name: str = ""  # a key of edgemask.targets.FORMATS, which says its runtime and file names
    variants: tuple[str, ...] = ("fp32",)

    @property
    def runtime(self) -> str:
        return FORMAT_FACTS[self.name].runtime

    def filename(self, variant: str) -> str:
        return FORMAT_FACTS[self.name].file_name(variant)

    def check_available(self) -> None:
        """Raise :class:`FormatUnavailableError` (with the install command) when the toolchain is missing."""

    def write(self, model: nn.Module, path: Path, ctx: FormatContext, variant: str = "fp32") -> dict[str, Any]:
        raise NotImplementedError

    def run(self, path: Path, inputs: np.ndarray, threads: int = 1) -> np.ndarray:
        """Run the file in its real runtime, one batch-1 sample at a time -> (N, n_out) float32."""
        raise NotImplementedError


FORMATS: Registry[Format] = Registry("export format")


@contextlib.contextmanager
def quiet_exporters():
    """Silence the exporters' and runtimes' chatter (deprecation warnings, "torchvision is not installed" log
    lines; ExecuTorch's cpuinfo lines and litert-torch's progress, printed to Python's streams: to the log of
    ``edgemask.terminal.quiet_terminal``) so a user sees progress and results; real failures still raise."""
    from edgemask.terminal import library_output

    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch._export", "torch.export", "executorch")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings(), library_output():
        warnings.simplefilter("ignore")
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, lv in zip(loggers, levels):
                lg.setLevel(lv)


def pt2e_quantized(model: nn.Module, ctx: FormatContext, quantizer: Any, where: str,
                   fold_quantize: bool = True) -> nn.Module:
    """Post-training static int8 by PT2E: export ``model``, insert ``quantizer``'s observers, run the client's
    calibration samples through it one at a time (batch 1, as deployed), convert to quantize/dequantize ops.

    ``ctx.calibration``: (N, *input_shape) from the client's train split. Returns the converted graph module,
    which the format then lowers (XNNPACK for ``.pte``, LiteRT for ``.tflite``); ``where`` (the file's name)
    starts the error message when there are no calibration samples."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    if ctx.calibration is None:
        raise ExportFormatError(f"{where}: int8 needs calibration samples")
    gm = torch.export.export(model.eval(), (ctx.example,)).module()
    prepared = prepare_pt2e(gm, quantizer)
    with torch.no_grad():
        for x in ctx.calibration:
            prepared(x[None])
    return convert_pt2e(prepared, fold_quantize=fold_quantize)
