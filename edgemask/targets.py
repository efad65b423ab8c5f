"""The boards and the file formats edgemask knows, written once: which runtime reads a format and what its files
are called, what each kind of board ships with (its OS and Python, the runtimes it has builds of, the newest ONNX
opset its onnxruntime reads, its power sensors, the versions pinned for it).

Torch-free and stage-free, so every stage reads the same facts: ``devices`` (the inventory's kind profiles, what
a board can run, what setup installs), ``export`` (``--target``'s opset cap, the formats' runtimes and file
names), ``profiling`` (a campaign's valid formats) and ``cli`` (help texts). The board-side runner
(``devices/remote/runner.py``) is one standard-library file copied to the board and cannot import this module;
its own format -> runtime table is checked against :data:`FORMAT_RUNTIME` by ``tests/edgemask/test_targets.py``.

Where the facts come from: DESIGN.md, "What the boards can run" (wheels on PyPI, checked): onnxruntime 1.10.0 is
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

    def file_name(self, variant: str = "fp32") -> str:
        """The file an artifact directory holds for ``variant``: ``model.onnx``, ``model.int8.onnx``."""
        return f"model{self.suffix}" if variant == "fp32" else f"model.{variant}{self.suffix}"


FORMATS: dict[str, FormatFacts] = {
    "onnx": FormatFacts("onnx", "onnxruntime", ".onnx", "ONNX for onnxruntime"),
    "pte": FormatFacts("pte", "executorch", ".pte", "ExecuTorch, XNNPACK"),
    "tflite": FormatFacts("tflite", "tflite", ".tflite", "LiteRT; needs the tflite extra"),
}
FORMAT_RUNTIME: dict[str, str] = {f.name: f.runtime for f in FORMATS.values()}
RUNTIME_NAMES: tuple[str, ...] = ("onnxruntime", "executorch", "tflite")

# The Jetson TX2's pins: JetPack 4.6 has Python 3.6, whose last aarch64 onnxruntime wheel is 1.10.0 (with numpy
# 1.19.5, the last for 3.6); onnxruntime 1.10 reads ONNX opset <= 15.
TX2_ONNXRUNTIME = "1.10.0"
TX2_NUMPY = "1.19.5"
TX2_MAX_ONNX_OPSET = 15


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

    @property
    def name(self) -> str:
        return self.kind


BOARDS: dict[str, BoardProfile] = {  # kind -> profile; the kinds an inventory may name
    "local": BoardProfile(
        kind="local", os=sys.platform, python=".".join(map(str, sys.version_info[:2])),
        runtimes=("onnxruntime", "executorch", "tflite"), max_onnx_opset=None, power_sensors=("rapl", "hwmon"),
    ),
    "linux": BoardProfile(
        kind="linux", os="any Linux", python="3", runtimes=("onnxruntime",), max_onnx_opset=None,
        power_sensors=("rapl", "hwmon"),
    ),
    "jetson-tx2": BoardProfile(
        kind="jetson-tx2",
        os="JetPack 4.6 / L4T 32.7 (Ubuntu 18.04, glibc 2.27), aarch64",
        python="3.6",
        runtimes=("onnxruntime",),
        max_onnx_opset=TX2_MAX_ONNX_OPSET,
        power_sensors=("ina3221",),
        notes=f"onnxruntime {TX2_ONNXRUNTIME} + numpy {TX2_NUMPY}; no TFLite or ExecuTorch wheel for Python 3.6; "
        "INA3221 input rail VDD_IN in sysfs",
        requirements={"numpy": f"numpy=={TX2_NUMPY}", "onnxruntime": f"onnxruntime=={TX2_ONNXRUNTIME}"},
    ),
    "rpi4": BoardProfile(
        kind="rpi4",
        os="Raspberry Pi OS bookworm (glibc 2.36), aarch64",
        python="3.11",
        runtimes=("onnxruntime", "tflite", "executorch"),
        max_onnx_opset=None,
        power_sensors=("hwmon",),
        notes="onnxruntime 1.31.1; tflite-runtime 2.14 (numpy<2) or ai-edge-litert 2.3; executorch 1.4.1 needs "
        "torch on the board; power only with an INA219/INA226 hwmon board; vcgencmd for throttling",
    ),
}
