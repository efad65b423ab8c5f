"""The boards' and formats' facts are written once (edgemask/targets.py) and every stage reads them from there:
the inventory's kind profiles, export's --target cap and file names, a campaign's formats, setup's pins, and the
board-side runner's own table (it cannot import them) agrees."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from edgemask.errors import UnknownNameError
from edgemask.targets import BOARDS, FORMAT_RUNTIME, FORMATS, TRAINING_FORMATS, artifact_format

ROOT = Path(__file__).resolve().parents[2]


def test_targets_import_no_stage_and_no_torch():
    code = ("import sys, edgemask.targets; bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'numpy', 'trainer', 'export', 'devices', 'profiling', 'cli')); print(bad)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_format_facts_by_hand():
    assert FORMAT_RUNTIME == {"onnx": "onnxruntime", "pte": "executorch", "tflite": "tflite", "trt": "tensorrt",
                              "pte-train": "executorch", "torch-train": "torch"}
    # "trt" is built on the board, from the ONNX file
    assert sorted(FORMATS) == ["onnx", "pte", "pte-train", "tflite", "torch-train"]
    assert TRAINING_FORMATS == ("pte-train", "torch-train")
    assert FORMATS["pte-train"].file_name() == "train.pte" and FORMATS["torch-train"].file_name() == "train.pt2"
    assert artifact_format("trt") == "onnx" and artifact_format("pte") == "pte"
    assert FORMATS["onnx"].file_name() == "model.onnx"
    assert FORMATS["onnx"].file_name("int8") == "model.int8.onnx"
    assert FORMATS["tflite"].file_name("int8") == "model.int8.tflite"


def test_the_tx2_cap_is_one_fact_every_stage_reads():
    from edgemask.devices.inventory import KIND_PROFILES
    from edgemask.devices.setup import packages_for
    from edgemask.devices.inventory import DeviceSpec
    from edgemask.export.formats.base import DEVICE_PROFILES, ExportSettings

    assert BOARDS["jetson-tx2"].max_onnx_opset == 15
    assert KIND_PROFILES["jetson-tx2"] is BOARDS["jetson-tx2"]
    assert DEVICE_PROFILES.get("jetson-tx2") is BOARDS["jetson-tx2"]
    assert ExportSettings(device_profile="jetson-tx2").onnx_opset() == 15
    assert ExportSettings(opset=13, device_profile="jetson-tx2").onnx_opset() == 13
    assert ExportSettings(device_profile="rpi4").onnx_opset() == 18
    tx2 = DeviceSpec(name="tx2", kind="jetson-tx2", host="h", runtimes=("onnxruntime",))
    assert [p.requirement for p in packages_for(tx2)] == ["numpy==1.19.5", "onnxruntime==1.10.0"]


def test_unknown_target_lists_the_boards():
    from edgemask.export.formats.base import DEVICE_PROFILES

    try:
        DEVICE_PROFILES.get("tx1")
    except UnknownNameError as e:
        assert str(e) == "unknown device profile 'tx1'; valid names: jetson-tx2, rpi4"
    else:
        raise AssertionError("tx1 was accepted")


def test_export_formats_and_campaign_formats_follow_the_facts():
    from edgemask.export.formats import FORMATS as EXPORT_FORMATS
    from edgemask.profiling.campaign import FORMATS as CAMPAIGN_FORMATS

    assert EXPORT_FORMATS.names() == sorted(FORMATS)
    assert CAMPAIGN_FORMATS.names() == sorted(FORMAT_RUNTIME)  # the exported formats and "trt"
    assert CAMPAIGN_FORMATS.get("trt") == "tensorrt"
    for name in FORMATS:
        fmt = EXPORT_FORMATS.get(name)
        assert fmt.runtime == FORMAT_RUNTIME[name] == CAMPAIGN_FORMATS.get(name)
        stem, suffix = ("train", FORMATS[name].suffix) if name in TRAINING_FORMATS else ("model", f".{name}")
        assert fmt.filename("fp32") == f"{stem}{suffix}" and fmt.filename("int8") == f"{stem}.int8{suffix}"


def test_the_board_side_runner_agrees_with_the_facts():
    """The runner is stdlib-only and shipped to the board as one file: it keeps its own format -> runtime table."""
    from edgemask.devices.remote.runner.runtimes import RUNTIMES

    assert {fmt: cls.runtime for fmt, cls in RUNTIMES.items()} == FORMAT_RUNTIME
