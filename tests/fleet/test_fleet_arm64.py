"""The harness against the emulated aarch64 board: Debian bookworm arm64, its own sshd, Python 3.11 and a Pi's
runtimes (numpy, onnxruntime, ai-edge-litert, ExecuTorch's runtime and torch, provisioned as
`edgemask devices setup` provisions a Pi), all running under qemu-user as a Cortex-A72, in a network namespace
with a CPU quota and an EMULATED INA226 hwmon sensor. The same code a user drives a Raspberry Pi 4 with."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from artifacts import make_artifact

from edgemask.devices.benchmark import run_benchmark
from edgemask.devices.connection import open_connection
from edgemask.devices.deploy import remote_path
from edgemask.devices.probe import check_device
from edgemask.devices.records import RunnerSettings
from edgemask.devices.setup import setup_device
from edgemask.cli.main import main as edgemask_main
from edgemask.fileio import sha256_file
from edgemask.manifest import SAMPLE_IO, ArtifactFile, Manifest, TensorSpec, write_manifest, write_sample_io
from edgemask.export.formats import FORMATS, ExportSettings, FormatContext
from fleet.standin import write_inventory
from edgemask.profiling import stats

pytestmark = [pytest.mark.fleet, pytest.mark.slow]

SETTINGS = RunnerSettings(warmup_runs=2, warmup_seconds=0.0, min_runs=20, min_seconds=1.0, idle_seconds=0.5,
                          power_rate_hz=20.0)
# Every format: loading torch for the ExecuTorch runtime dominates under emulation, so few timed runs
FORMAT_SETTINGS = RunnerSettings(warmup_runs=1, warmup_seconds=0.0, min_runs=5, min_seconds=0.2, idle_seconds=0.2,
                                 power_rate_hz=20.0)
PI_RUNTIMES = ("onnxruntime", "tflite", "executorch")


def _check(spec, tmp_path, capsys, runtimes: tuple[str, ...]) -> dict:
    inv = write_inventory(tmp_path / "devices.toml", spec, runtimes=runtimes)
    rc = edgemask_main(["devices", "check", spec.name, "--inventory", str(inv), "--workspace", str(tmp_path / "ws")])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0, report
    return report


def test_devices_check_shows_an_aarch64_board(arm64_device, tmp_path, capsys):
    spec = arm64_device.spec()
    report = _check(spec, tmp_path, capsys, PI_RUNTIMES)
    assert report["reachable"] is True and report["arch"] == "aarch64"
    assert report["python"].startswith("3.11.") and "aarch64-with-glibc2.36" in report["os"]  # bookworm
    assert report["runtimes"] == {"onnxruntime": "onnxruntime 1.31.1", "tflite": "ai_edge_litert 2.3.0",
                                  "executorch": "executorch 1.5.1+cpu",  # its version.py says +cpu
                                  "torch": "torch 2.13.0+cu130"}  # the rootfs's torch: PyPI's aarch64 build
    assert report["power_sensors"]["hwmon"] == "hwmon:ina226:hwmon0"
    assert report["missing"] == []  # a provisioned Pi
    # without ExecuTorch a Pi's plan is tflite-runtime with numpy<2: the board's numpy 2 is named, with the fix
    report = _check(spec, tmp_path, capsys, ("onnxruntime", "tflite"))
    missing = {m["what"]: m for m in report["missing"]}
    assert set(missing) == {"numpy", "python"} and "does not meet numpy<2" in missing["numpy"]["why"]
    assert missing["numpy"]["fix"].startswith(f"edgemask devices setup {spec.name}")


def test_deploy_and_measure_onnx_on_the_emulated_aarch64_board(arm64_device, tmp_path):
    art = make_artifact(tmp_path / "art", n=8, wrong_labels=2)
    spec = arm64_device.spec(workdir="/root/measure")  # its own workdir: nothing deployed there yet
    with open_connection(spec) as conn:
        m = run_benchmark(conn, spec, art, "onnx", settings=SETTINGS, timeout=600)
        assert conn.uploads == 3  # runner, model, sample_io
    with open_connection(spec) as conn:
        again = run_benchmark(conn, spec, art, "onnx", settings=SETTINGS, timeout=600)
        assert conn.uploads == 0  # unchanged artifacts are not sent again
    for meas in (m, again):
        assert meas.ok, meas.error
        assert meas.runtime_version == "onnxruntime 1.31.1"  # the arm64 wheel, inside the board
        assert meas.accuracy == pytest.approx(6 / 8) and meas.output_max_abs_diff <= 1e-5
        assert meas.runs >= 20 and meas.timed_window_s >= 1.0
    # energy per inference from the emulated INA226 read by the runner's hwmon sensor
    assert m.power_source == "hwmon:ina226:hwmon0"
    assert m.power_w and all(2.0 <= w <= 6.01 for w in m.power_w)
    assert stats.energy_per_inference_mj(m.power_w, m.timed_window_s, m.inferences) > 0 and m.idle_power_w >= 1.9


def test_setup_installs_from_uploaded_wheels_once(arm64_device, wheels_dir, tmp_path):
    # a fresh workdir: a board nobody set up yet; it has no route out, so the wheels come from the host. It
    # provisions onnxruntime: the 2.8 GB of torch's CUDA closure (installed in the root filesystem by the same
    # pip calls, see fetch-wheels.sh) stay out of the upload.
    spec = arm64_device.spec(workdir="/root/setup-test")
    heavy = ("torch-", "triton-", "nvidia_", "cuda_", "executorch-")
    onnx_wheels = tmp_path / "wheels"
    onnx_wheels.mkdir()
    for w in wheels_dir.glob("*.whl"):
        if not w.name.startswith(heavy):
            os.symlink(w, onnx_wheels / w.name)
    wheels = sorted(p.name for p in onnx_wheels.glob("*.whl"))
    first = setup_device(spec, wheels_dir=onnx_wheels)
    assert first["venv_created"] == "venv"
    assert first["python"] == remote_path(spec, "venv", "bin", "python")
    assert first["installed"] == ["numpy", "onnxruntime"] and first["uploaded"] == len(wheels)
    assert first["versions"]["onnxruntime"] == "1.31.1" and first["versions"]["numpy"].startswith("2.")
    second = setup_device(spec, wheels_dir=onnx_wheels)
    assert (second["venv_created"], second["installed"], second["uploaded"]) == (None, [], 0)
    # the venv holds its own copies (not the system's): pip installed them there
    site = arm64_device.host_path("/root/setup-test/venv/lib/python3.11/site-packages")
    assert (site / "onnxruntime").is_dir() and (site / "numpy").is_dir()
    row = check_device(replace(spec, python=first["python"]))
    assert row["reachable"] and row["python_executable"].endswith("venv/bin/python")
    assert row["runtimes"]["onnxruntime"] == "onnxruntime 1.31.1" and row["missing"] == []
    with open_connection(spec) as conn:
        assert conn.run(["rm", "-rf", "/root/setup-test"], timeout=120).rc == 0


def _every_format(root: Path, n: int = 8, wrong_labels: int = 2) -> Path:
    """One small MLP (6 -> 16 -> 4) written by the real exporters as model.onnx, model.pte (XNNPACK) and
    model.tflite, with sample_io.npz (x (n, 6), y (n, 4) from torch, labels with ``wrong_labels`` planted
    errors) and a manifest: the artifact directory `edgemask export` makes for a compacted client."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(n, 6)
    with torch.no_grad():
        y = model(x).numpy()
    labels = y.argmax(1).astype(np.int64)
    labels[:wrong_labels] = (labels[:wrong_labels] + 1) % 4
    root.mkdir(parents=True)
    files = []
    for name in ("onnx", "pte", "tflite"):
        fmt = FORMATS.get(name)
        path = root / fmt.filename("fp32")
        info = fmt.write(model, path, FormatContext(x[:1], ExportSettings(), None), "fp32")
        files.append(ArtifactFile(format=name, variant="fp32", file=path.name, sha256=sha256_file(path),
                                  bytes=path.stat().st_size, runtime=info["runtime"], opset=info.get("opset"),
                                  backend=info.get("backend")))
    write_sample_io(root / SAMPLE_IO, x.numpy(), y, labels)
    write_manifest(root, Manifest(
        run_id="run-arm64", client_id="client-000", kind="compacted", algorithm="fedmask", model="mlp",
        dataset="synthetic", inputs=[TensorSpec("input", [1, 6], "float32")],
        outputs=[TensorSpec("output", [1, 4], "float32")], files=files,
        sample_io={"file": SAMPLE_IO, "sha256": sha256_file(root / SAMPLE_IO), "count": n},
        params={"dense": 180, "compacted": 180}, flops={"dense": 320, "compacted": 320},
        layers=[{"name": "0", "kept": 16, "total": 16}], tolerance={"limit": 1e-5, "max_abs_diff": {}},
        created="2026-11-23T10:00:00Z",
    ))
    return root


@pytest.fixture(scope="module")
def every_format(tmp_path_factory) -> Path:
    return _every_format(tmp_path_factory.mktemp("art") / "client-000")


@pytest.mark.parametrize("fmt, version", [("onnx", "onnxruntime 1.31.1"), ("tflite", "ai_edge_litert 2.3.0"),
                                          ("pte", "executorch 1.5.1")])
def test_every_format_runs_on_the_emulated_pi(arm64_device, every_format, fmt, version):
    art = every_format
    spec = arm64_device.spec(workdir="/root/formats", runtimes=PI_RUNTIMES)
    with open_connection(spec) as conn:
        m = run_benchmark(conn, spec, art, fmt, settings=FORMAT_SETTINGS, timeout=900)
    assert m.ok, m.error
    assert m.runtime_version.startswith(version)  # the aarch64 wheel, imported inside the board
    # the on-device output check against sample_io.npz: torch's outputs, 2 of 8 labels planted wrong
    assert m.output_check_passed and m.output_max_abs_diff <= 1e-5
    assert m.accuracy == pytest.approx(6 / 8)
    assert m.runs >= 5 and m.timed_window_s >= 0.2 and m.load_ms > 0
    assert m.power_source == "hwmon:ina226:hwmon0"
    assert stats.energy_per_inference_mj(m.power_w, m.timed_window_s, m.inferences) > 0
