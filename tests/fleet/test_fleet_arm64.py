"""The harness against the emulated aarch64 board: Debian bookworm arm64, its own sshd, Python 3.11, numpy and
onnxruntime, all running under qemu-user as a Cortex-A72, in a network namespace with a CPU quota and an
EMULATED INA226 hwmon sensor. The same code a user drives a Raspberry Pi 4 with."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from artifacts import make_artifact

from devices.benchmark import run_benchmark
from devices.connection import open_connection
from devices.deploy import remote_path
from devices.probe import check_device
from devices.records import RunnerSettings
from devices.setup import setup_device
from edgemask.cli import main as edgemask_main
from fleet.standin import write_inventory

pytestmark = [pytest.mark.fleet, pytest.mark.slow]

SETTINGS = RunnerSettings(warmup_runs=2, warmup_seconds=0.0, min_runs=20, min_seconds=1.0, idle_seconds=0.5,
                          power_rate_hz=20.0)


def test_devices_check_shows_an_aarch64_board(arm64_device, tmp_path, capsys):
    spec = arm64_device.spec()
    inv = write_inventory(tmp_path / "devices.toml", spec, runtimes=("onnxruntime", "tflite"))
    rc = edgemask_main(["devices", "check", spec.name, "--inventory", str(inv), "--workspace", str(tmp_path / "ws")])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0, report
    assert report["reachable"] is True and report["arch"] == "aarch64"
    assert report["python"].startswith("3.11.") and "aarch64-with-glibc2.36" in report["os"]  # bookworm
    assert report["runtimes"]["onnxruntime"] == "onnxruntime 1.31.1"
    assert report["power_sensors"]["hwmon"] == "hwmon:ina226:hwmon0"
    # onnxruntime is there; TFLite is not, and check says how to get it
    missing = {m["what"]: m for m in report["missing"]}
    assert "onnxruntime" not in missing and "tflite" in missing
    assert missing["tflite"]["fix"].startswith(f"edgemask devices setup {spec.name}")


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
    assert m.energy_per_inference_mj > 0 and m.idle_power_w >= 1.9


def test_setup_installs_from_uploaded_wheels_once(arm64_device, wheels_dir, tmp_path):
    # a fresh workdir: a board nobody set up yet; it has no route out, so the wheels come from the host
    spec = arm64_device.spec(workdir="/root/setup-test")
    wheels = sorted(p.name for p in wheels_dir.glob("*.whl"))
    first = setup_device(spec, wheels_dir=wheels_dir)
    assert first["venv_created"] == "venv"
    assert first["python"] == remote_path(spec, "venv", "bin", "python")
    assert first["installed"] == ["numpy", "onnxruntime"] and first["uploaded"] == len(wheels)
    assert first["versions"]["onnxruntime"] == "1.31.1" and first["versions"]["numpy"].startswith("2.")
    second = setup_device(spec, wheels_dir=wheels_dir)
    assert (second["venv_created"], second["installed"], second["uploaded"]) == (None, [], 0)
    # the venv holds its own copies (not the system's): pip installed them there
    site = arm64_device.host_path("/root/setup-test/venv/lib/python3.11/site-packages")
    assert (site / "onnxruntime").is_dir() and (site / "numpy").is_dir()
    row = check_device(replace(spec, python=first["python"]))
    assert row["reachable"] and row["python_executable"].endswith("venv/bin/python")
    assert row["runtimes"]["onnxruntime"] == "onnxruntime 1.31.1" and row["missing"] == []
    with open_connection(spec) as conn:
        assert conn.run(["rm", "-rf", "/root/setup-test"], timeout=120).rc == 0
