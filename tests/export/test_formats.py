"""Every format's file, run in its real runtime, matches the compacted torch model."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from edgemask.errors import UnknownNameError
from edgemask.export.compact import compact
from edgemask.export.formats import FORMATS, ExportSettings, FormatContext, FormatUnavailableError
from export_helpers import masked_case, sample_input
from edgemask.trainer.models import MaskedModel, build_model, model_sites
from export_helpers import random_masks


def _compacted(name):
    masked = masked_case(name)
    x = sample_input(name, 8)
    return compact(masked, x[:1]).module, x


def _roundtrip(fmt_name, model, x, tmp_path, settings=ExportSettings(), variant="fp32", calibration=None):
    fmt = FORMATS.get(fmt_name)
    path = tmp_path / fmt.filename(variant)
    info = fmt.write(model, path, FormatContext(x[:1], settings, calibration), variant)
    got = fmt.run(path, x.numpy())
    with torch.no_grad():
        want = model(x).numpy()
    return info, got, want


@pytest.mark.parametrize("name", ["cnn", "tiny_mobilenet", "char_lstm"])
def test_onnx_matches_in_onnxruntime(name, tmp_path):
    model, x = _compacted(name)
    info, got, want = _roundtrip("onnx", model, x, tmp_path)
    assert info["opset"] == 18 and info["runtime"] == "onnxruntime"
    assert np.abs(got - want).max() <= 1e-5


def test_onnx_device_profile_caps_the_opset(tmp_path):
    model, x = _compacted("resnet18")
    info, got, want = _roundtrip("onnx", model, x, tmp_path, ExportSettings(device_profile="jetson-tx2"))
    assert info["opset"] == 15
    assert np.abs(got - want).max() <= 1e-5


@pytest.mark.parametrize("name", ["cnn", "tiny_mobilenet"])
def test_pte_matches_in_executorch_runtime(name, tmp_path):
    model, x = _compacted(name)
    info, got, want = _roundtrip("pte", model, x[:4], tmp_path)
    assert info["backend"] == "xnnpack"
    assert np.abs(got - want).max() <= 1e-5


@pytest.mark.slow
def test_pte_lstm_matches(tmp_path):
    # ExecuTorch unrolls the LSTM per time step and lowering is slow: a short sequence
    torch.manual_seed(0)
    model = build_model("char_lstm", (6,), 20, hidden=8, fc=(8, 8)).eval()
    masked = MaskedModel(model, model_sites(model), random_masks(model, 0.4, 3))
    x = torch.randint(0, 20, (3, 6))
    res = compact(masked, x[:1])
    info, got, want = _roundtrip("pte", res.module, x, tmp_path)
    assert np.abs(got - want).max() <= 1e-5


TFLITE = pytest.mark.skipif(importlib.util.find_spec("litert_torch") is None, reason="tflite extra not installed")


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["onnx", "pte", pytest.param("tflite", marks=TFLITE)])
def test_int8_variants_run_and_stay_close(fmt, tmp_path):
    model, _ = _compacted("cnn")
    x = torch.randn(32, 1, 8, 8)
    info, got, want = _roundtrip(fmt, model, x, tmp_path, ExportSettings(int8=True), "int8", x)
    assert got.shape == want.shape
    assert np.abs(got - want).max() < 0.5 * np.abs(want).max()  # quantized, not garbage
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.7
    assert (tmp_path / FORMATS.get(fmt).filename("int8")).stat().st_size < _fp32_bytes(fmt, model, x, tmp_path)


def _fp32_bytes(fmt, model, x, tmp_path):
    path = tmp_path / "fp32" / FORMATS.get(fmt).filename("fp32")
    path.parent.mkdir()
    FORMATS.get(fmt).write(model, path, FormatContext(x[:1]), "fp32")
    return path.stat().st_size


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("litert_torch") is None, reason="tflite extra not installed")
def test_tflite_matches_in_litert(tmp_path):
    model, x = _compacted("cnn")
    info, got, want = _roundtrip("tflite", model, x[:4], tmp_path)
    assert np.abs(got - want).max() <= 1e-5


def test_tflite_without_extra_says_how_to_install(monkeypatch):
    # Whether or not the extra is installed here, pretend the converter is missing.
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "litert_torch" else real(name, *a))
    with pytest.raises(FormatUnavailableError, match=r"litert_torch.*pip install -e \.\[tflite\]"):
        FORMATS.get("tflite").check_available()


def test_unknown_format_lists_the_valid_ones():
    with pytest.raises(UnknownNameError, match="onnx, pte, pte-train, tflite, torch-train"):
        FORMATS.get("coreml")
