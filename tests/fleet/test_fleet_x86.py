"""The harness against an x86_64 stand-in: the host's sshd in its own network namespace, a CPU quota and an
EMULATED power sensor (tests/fleet/powermodel.py) that the runner's real sensor code reads."""

from __future__ import annotations

import json
import sys
import time

import pytest
from artifacts import make_artifact

from edgemask.devices.benchmark import run_benchmark
from edgemask.devices.connection import open_connection
from edgemask.devices.records import RunnerSettings
from edgemask.cli.main import main as edgemask_main
from fleet.standin import write_inventory
from edgemask.profiling import stats

pytestmark = [pytest.mark.fleet, pytest.mark.slow]

SETTINGS = RunnerSettings(warmup_runs=2, warmup_seconds=0.0, min_runs=30, min_seconds=1.0, idle_seconds=0.6,
                          power_rate_hz=50.0)
# CPU time over wall time of a 1.5 s busy loop: 1.0 on an idle core, at most the quota in the device's cgroup
BUSY = ("import time\nw, c = time.monotonic(), time.process_time()\nwhile time.monotonic() - w < 1.5: pass\n"
        "print((time.process_time() - c) / (time.monotonic() - w))")


def test_deploy_and_measure_onnx_with_emulated_power(x86_device, tmp_path):
    art = make_artifact(tmp_path / "art", n=8, wrong_labels=2)
    spec = x86_device.spec()
    with open_connection(spec) as conn:
        m = run_benchmark(conn, spec, art, "onnx", settings=SETTINGS, timeout=120)
        assert conn.uploads == 3  # runner, model, sample_io
        again = run_benchmark(conn, spec, art, "onnx", settings=SETTINGS, timeout=120)
        assert conn.uploads == 3  # unchanged artifacts are not sent again
    with open_connection(spec) as conn:  # nor over a new connection
        run_benchmark(conn, spec, art, "onnx", settings=SETTINGS, timeout=120)
        assert conn.uploads == 0
    for meas in (m, again):
        assert meas.ok, meas.error
        assert meas.accuracy == pytest.approx(6 / 8) and meas.output_check_passed
        assert meas.runs >= 30 and meas.timed_window_s >= 1.0
    # The runner found the emulated Jetson-layout sensor through EDGEMASK_SYSFS_ROOT (set by the device's sshd)
    assert m.power_source == "ina3221:VDD_IN" and m.energy_missing_reason is None
    assert len(m.power_w) >= 20
    # power model: 2 W idle, 6 W with the device's quota fully used. While timed runs spin, the device uses
    # far more of its quota than while the runner sleeps for the idle reading (how much more depends on how
    # busy the host is: a loaded CI host gives the cgroup less than its quota).
    assert 1.9 <= m.idle_power_w <= 3.5
    mean_power_w = sum(m.power_w) / len(m.power_w)
    assert m.idle_power_w + 0.5 <= mean_power_w <= 6.01
    energy = mean_power_w * m.timed_window_s / m.runs * 1e3
    per_inference = stats.energy_per_inference_mj(m.power_w, m.timed_window_s, m.inferences)
    assert per_inference == pytest.approx(energy) and energy > 0
    assert 0 < stats.energy_above_idle_mj(m.power_w, m.idle_power_w, m.timed_window_s, m.inferences) < per_inference


def test_cpu_quota_makes_the_device_slower_than_the_host(x86_device):
    with open_connection(x86_device.spec()) as conn:
        res = conn.run([sys.executable, "-c", BUSY], timeout=60)
    share = float(res.stdout)
    # the device's processes get at most its quota (a quarter of a CPU) whatever the host has free
    assert 0.0 < share <= x86_device.cores * 1.15 + 0.02, share


def test_devices_check_cli_reports_the_standin(x86_device, tmp_path, capsys):
    spec = x86_device.spec()
    inv = write_inventory(tmp_path / "devices.toml", spec, name="x86-a", kind="linux")
    t0 = time.monotonic()
    rc = edgemask_main(["devices", "check", "x86-a", "--inventory", str(inv), "--workspace", str(tmp_path / "ws")])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and time.monotonic() - t0 < 60
    assert report["reachable"] is True and report["arch"] == "x86_64"
    assert report["power_sensors"]["ina3221"] == "ina3221:VDD_IN"
    assert report["runtimes"]["onnxruntime"].startswith("onnxruntime 1.")
    assert report["missing"] == []
