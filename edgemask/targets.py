"""The boards and the file formats edgemask knows, written once: which runtime reads a format and what its files
are called, what each kind of board ships with (its OS and Python, the runtimes it has builds of, the newest ONNX
opset its onnxruntime reads, its power sensors, the versions pinned for it).

Torch-free and stage-free, so every stage reads the same facts: ``devices`` (the inventory's kind profiles, what
a board can run, what setup installs), ``export`` (``--target``'s opset cap, the formats' runtimes and file
names), ``profiling`` (a campaign's valid formats) and ``cli`` (help texts). The board-side runner
(``devices/remote/runner/``) is standard-library only, shipped to the board as one zipapp, and cannot import this
module; its own format -> runtime table is checked against :data:`FORMAT_RUNTIME` by ``tests/edgemask/test_targets.py``.

Where the facts come from: docs/architecture.md, "What the boards can run" (wheels on PyPI, checked): onnxruntime 1.10.0 is
the last cp36 aarch64 wheel, the newest a Jetson TX2 on JetPack 4.6 (Python 3.6) can install, and it reads
ONNX opset <= 15; a Raspberry Pi 4 on bookworm (Python 3.11) gets onnxruntime 1.31.1 and has no opset cap.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class FormatFacts:
    """One export format: the runtime that reads its files and the files' suffix."""

    name: str  # "onnx" | "pte" | "tflite": the name in --formats, campaigns and manifests
    runtime: str  # the runtime name in the inventory and manifests
    suffix: str  # ".onnx"
    title: str  # for help texts
    # the artifact file this format's runtime reads: itself for the exported formats; "onnx" for "trt", whose
    # engine the board builds from the artifact's ONNX (engines are not portable across GPUs)
    reads: str = ""
    stem: str = "model"  # "train" for the training formats: a client's local step (issue #39), beside its model
    training: bool = False  # the file is a local training step, not an inference model

    @property
    def artifact_format(self) -> str:
        return self.reads or self.name

    def file_name(self, variant: str = "fp32") -> str:
        """The file an artifact directory holds for ``variant``: ``model.onnx``, ``model.int8.onnx``."""
        return f"{self.stem}{self.suffix}" if variant == "fp32" else f"{self.stem}.{variant}{self.suffix}"


FORMATS: dict[str, FormatFacts] = {
    "onnx": FormatFacts("onnx", "onnxruntime", ".onnx", "ONNX for onnxruntime"),
    "pte": FormatFacts("pte", "executorch", ".pte", "ExecuTorch, XNNPACK"),
    "tflite": FormatFacts("tflite", "tflite", ".tflite", "LiteRT; needs the tflite extra"),
    # a client's local training step (export.training): ExecuTorch's joint forward-backward program, and the same
    # step as a torch.export program for torch on the board's Python (the fallback)
    "pte-train": FormatFacts("pte-train", "executorch", ".pte", "ExecuTorch training step (portable kernels)",
                             stem="train", training=True),
    "torch-train": FormatFacts("torch-train", "torch", ".pt2", "torch.export training step, torch on the board",
                               stem="train", training=True),
}
# What export writes unless told otherwise (`edgemask export` / `edgemask demo` --formats, export_run): the one
# declaration of that default
DEFAULT_EXPORT_FORMATS: tuple[str, ...] = ("onnx", "pte")
# What the demo exports and measures: the inference formats and the local training step for torch on the board
# (ExecuTorch's portable training kernels take seconds a step on the demo's MLP: `pte-train` is measured by
# benchmarks/bench_training.py, not on every demo run)
DEMO_FORMATS: tuple[str, ...] = (*DEFAULT_EXPORT_FORMATS, "torch-train")
# Formats a board builds itself from an exported file (export writes nothing for them).
BOARD_BUILT_FORMATS: dict[str, FormatFacts] = {
    "trt": FormatFacts("trt", "tensorrt", ".onnx", "TensorRT FP16 engine, built on the board from the ONNX",
                       reads="onnx"),
}
# Every format a campaign may name -> the runtime that reads it
FORMAT_RUNTIME: dict[str, str] = {f.name: f.runtime for f in (*FORMATS.values(), *BOARD_BUILT_FORMATS.values())}
RUNTIME_NAMES: tuple[str, ...] = ("onnxruntime", "executorch", "tflite", "tensorrt", "torch")
TRAINING_FORMATS: tuple[str, ...] = tuple(f.name for f in FORMATS.values() if f.training)


def artifact_format(fmt: str) -> str:
    """The exported format whose file a job of ``fmt`` reads from the artifact: "onnx" for "trt", else ``fmt``."""
    facts = FORMATS.get(fmt) or BOARD_BUILT_FORMATS.get(fmt)
    return facts.artifact_format if facts is not None else fmt

# The Jetson TX2's pins: JetPack 4.6 has Python 3.6, whose last aarch64 onnxruntime wheel is 1.10.0 (with numpy
# 1.19.5, the last for 3.6); onnxruntime 1.10 reads ONNX opset <= 15.
TX2_ONNXRUNTIME = "1.10.0"
TX2_NUMPY = "1.19.5"
TX2_MAX_ONNX_OPSET = 15
# TensorRT on a TX2 (NVIDIA's JetPack release notes): JetPack 4.6 ships TensorRT 8.0.1, JetPack 4.6.1/4.6.2
# TensorRT 8.2.1, both with CUDA 10.2 and trtexec at TX2_TRTEXEC (not on PATH). Pascal has no fast INT8
# (platformHasFastInt8() is false): FP16 is its fast mode, so engines are built with --fp16.
TX2_TENSORRT = ("8.0.1", "8.2.1")
TX2_TRTEXEC = "/usr/src/tensorrt/bin/trtexec"
# The training formats need ExecuTorch's training extension (Python >= 3.10) or torch >= 2.1 with torch.export; for
# Python 3.6 NVIDIA's newest Jetson wheel is torch 1.10 (JetPack 4.6), which has no torch.export.
TX2_NO_TRAINING = ("Python 3.6 on a TX2 (JetPack 4.6): no ExecuTorch (needs Python >= 3.10) and no torch >= 2.1 "
                   "(NVIDIA's newest wheel for it is torch 1.10, without torch.export); time the local step on "
                   "another board")


@dataclass(frozen=True)
class BoardProfile:
    """What a kind of board ships with: the facts that decide which artifacts it can run."""

    kind: str
    os: str
    python: str
    runtimes: tuple[str, ...]
    max_onnx_opset: int | None  # None: the newest onnxruntime, no limit known here
    power_sensors: tuple[str, ...]
    notes: str = ""
    # runtime (or "numpy") -> the pip requirement setup installs on this kind; absent: the newest that fits
    requirements: Mapping[str, str] = field(default_factory=dict)
    # why this kind takes no training step at all (formats pte-train, torch-train); "": it may, if installed
    no_training: str = ""

    @property
    def name(self) -> str:
        return self.kind


BOARDS: dict[str, BoardProfile] = {  # kind -> profile; the kinds an inventory may name
    "local": BoardProfile(
        kind="local", os=sys.platform, python=".".join(map(str, sys.version_info[:2])),
        runtimes=("onnxruntime", "executorch", "tflite", "torch"), max_onnx_opset=None,
        power_sensors=("rapl", "hwmon"),
    ),
    "linux": BoardProfile(
        kind="linux", os="any Linux", python="3", runtimes=("onnxruntime",), max_onnx_opset=None,
        power_sensors=("rapl", "hwmon"),
    ),
    "jetson-tx2": BoardProfile(
        kind="jetson-tx2",
        os="JetPack 4.6 / L4T 32.7 (Ubuntu 18.04, glibc 2.27), aarch64",
        python="3.6",
        runtimes=("onnxruntime", "tensorrt"),
        max_onnx_opset=TX2_MAX_ONNX_OPSET,
        power_sensors=("ina3221",),
        notes=f"onnxruntime {TX2_ONNXRUNTIME} + numpy {TX2_NUMPY}; TensorRT {' / '.join(TX2_TENSORRT)} from "
        f"JetPack (trtexec at {TX2_TRTEXEC}); no TFLite or ExecuTorch wheel for Python 3.6; "
        "INA3221 input rail VDD_IN (and VDD_SYS_GPU) in sysfs",
        requirements={"numpy": f"numpy=={TX2_NUMPY}", "onnxruntime": f"onnxruntime=={TX2_ONNXRUNTIME}"},
        no_training=TX2_NO_TRAINING,
    ),
    "rpi4": BoardProfile(
        kind="rpi4",
        os="Raspberry Pi OS bookworm (glibc 2.36), aarch64",
        python="3.11",
        runtimes=("onnxruntime", "tflite", "executorch", "torch"),
        max_onnx_opset=None,
        power_sensors=("hwmon",),
        notes="onnxruntime 1.31.1; tflite-runtime 2.14 (numpy<2) or ai-edge-litert 2.3; executorch 1.5.1 needs "
        "torch on the board (torch 2.13.0 CPU, which also takes the torch-train step); power only with an "
        "INA219/INA226 hwmon board; vcgencmd for throttling",
    ),
}
