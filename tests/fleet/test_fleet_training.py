"""A client's local training step (issue #39) measured on the emulated aarch64 board: a STAND-IN for a Raspberry
Pi 4 (Debian bookworm arm64, Python 3.11, the Pi's runtimes with torch 2.13.0, under qemu-user as a Cortex-A72
with one CPU's quota and an emulated INA226). Its step times are an emulator's, not a Pi's: what these tests
prove is the path (deploy, the board's own check of its step against train_io.npz, timed steps and rounds,
power) on an aarch64 Python, with the real exported tiny FedMask step."""

from __future__ import annotations

import json

import pytest
from training_artifacts import TRAINING, make_training_artifact

from edgemask.devices.benchmark import run_benchmark
from edgemask.devices.connection import open_connection
from edgemask.devices.probe import check_device
from edgemask.devices.records import RunnerSettings
from edgemask.manifest import load_manifest
from fleet.standin import PI_TRAINING_RUNTIMES

pytestmark = [pytest.mark.fleet, pytest.mark.slow]

# loading torch (and ExecuTorch's runtime) dominates under emulation: few timed steps, two rounds
SETTINGS = RunnerSettings(warmup_runs=1, warmup_seconds=0.0, min_runs=5, min_seconds=0.2, idle_seconds=0.2,
                          power_rate_hz=20.0)


@pytest.fixture(scope="module")
def fedmask_step(tmp_path_factory):
    return make_training_artifact(tmp_path_factory.mktemp("train-arm64"), "fedmask")


def test_devices_check_says_the_emulated_pi_takes_both_training_formats(arm64_device):
    row = check_device(arm64_device.spec(workdir="/root/training", runtimes=PI_TRAINING_RUNTIMES))
    assert row["reachable"] and row["arch"] == "aarch64", row
    assert row["training"]["pte-train"].startswith("yes — executorch 1.5.1"), row["training"]
    assert row["training"]["torch-train"].startswith("yes — torch 2.13.0"), row["training"]
    assert set(TRAINING) <= set(row["formats"]) and row["missing"] == []


@pytest.mark.parametrize("fmt, version", [("torch-train", "torch 2.13.0"), ("pte-train", "executorch 1.5.1")])
def test_a_local_step_on_the_emulated_pi(arm64_device, fedmask_step, fmt, version):
    spec = arm64_device.spec(workdir="/root/training", runtimes=PI_TRAINING_RUNTIMES)
    info = load_manifest(fedmask_step).training
    with open_connection(spec) as conn:
        m = run_benchmark(conn, spec, fedmask_step, fmt, settings=SETTINGS, timeout=900, train_rounds=2)
    assert m.ok, m.error
    assert m.runtime_version.startswith(version)  # the aarch64 wheel, imported inside the stand-in
    # the stand-in's own step from the file's state met the manifest's rule
    assert m.output_check_passed and m.output_max_abs_diff <= info["limit"]
    assert m.training["train_io_sha256"] == info["sha256"]
    assert m.runs >= SETTINGS.min_runs and m.timed_window_s >= SETTINGS.min_seconds
    assert len(m.training["round_ms"]) == 2 and m.training["steps_per_round"] == info["steps_per_round"]
    assert m.power_source == "hwmon:ina226:hwmon0" and m.power_w
    steps = sorted(m.latency_ms)
    print(json.dumps({"stand-in": "qemu-user aarch64 (Cortex-A72 model), NOT a Raspberry Pi", "format": fmt,
                      "step_ms_median": steps[len(steps) // 2], "round_ms": m.training["round_ms"],
                      "load_ms": m.load_ms, "first_step_ms": m.first_inference_ms}))
