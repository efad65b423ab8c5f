"""A Jetson TX2's GPU through the harness: format "trt" on the fleet's TX2 stand-in.

The stand-in is the x86_64 fleet device (its own sshd in a network namespace, a CPU quota, an EMULATED INA3221
with the TX2's VDD_IN and VDD_SYS_GPU rails) with a STAND-IN trtexec (tests/fleet/trtexec_standin.py: TensorRT's
command line and file formats over onnxruntime; this machine has no NVIDIA GPU). The runner, the SSH harness, the
deploy, the engine cache and the `devices check --self-test` path are the ones a real TX2 gets; what the stand-in
cannot show is TensorRT itself (real engines, FP16 kernels, Myelin fusions, real GPU power)."""

from __future__ import annotations

import json

import pytest
from artifacts import make_artifact

from edgemask.cli.main import main as edgemask_main
from edgemask.devices.benchmark import run_benchmark
from edgemask.devices.connection import open_connection
from edgemask.devices.records import RunnerSettings
from fleet.standin import write_inventory
from fleet.trtexec_standin import install

pytestmark = [pytest.mark.fleet, pytest.mark.slow]

SETTINGS = RunnerSettings(warmup_runs=1, warmup_seconds=0.2, min_runs=20, min_seconds=1.0, idle_seconds=0.3,
                          power_rate_hz=20.0, profile_layers=True, profile_runs=5)


def _tx2(dev, **kw):
    trtexec = install(dev.dir)  # the x86 stand-in shares this machine's filesystem and Python
    return dev.spec(kind="jetson-tx2", runtimes=("onnxruntime", "tensorrt"), trtexec=trtexec, **kw)


def test_a_trt_job_runs_through_the_real_runner_over_ssh(x86_device, tmp_path):
    spec = _tx2(x86_device, workdir=str(x86_device.dir / "trt work"))
    art = make_artifact(tmp_path / "art", n=8, wrong_labels=2)
    with open_connection(spec) as conn:
        m = run_benchmark(conn, spec, art, "trt", settings=SETTINGS, timeout=600)
        again = run_benchmark(conn, spec, art, "trt", settings=SETTINGS, timeout=600)
    assert m.ok, m.error
    assert m.format == "trt" and m.runtime_version == "tensorrt 8.2.1"
    # --exportTimes writes std::ostream's 6 significant digits: at 1,000-9,999 ms each end is rounded to 0.005 ms, so
    # the window read back may fall up to 10 us short of the --duration that trtexec itself reached (CI: 0.999998 s).
    assert m.accuracy == pytest.approx(6 / 8) and m.runs >= 20 and m.timed_window_s >= 1.0 - 1e-5
    trt = m.state_after["tensorrt"]
    assert trt["cached"] is False and trt["build_s"] > 0 and trt["flags"] == ["--fp16"]
    assert trt["timing_cache"].startswith(spec.workdir)  # one timing cache per board, in its workdir
    assert again.ok and again.state_after["tensorrt"]["cached"] is True  # built once per board
    # power: the input rail for energy (never summed with the others), the GPU rail beside it
    assert m.power_source == "ina3221:VDD_IN" and m.power_w
    assert trt["gpu_power_source"] == "ina3221:VDD_SYS_GPU" and trt["gpu_power_samples"] > 0
    assert trt["gpu_power_w_mean"] == 0.0 < min(m.power_w)  # the stand-in has no GPU: its emulated rail reads 0
    assert m.profile["available"] and m.profile["runs"][0]["ops"][-1][0] == "output"


def test_devices_check_reports_tensorrt_and_self_tests(x86_device, tmp_path, capsys):
    spec = _tx2(x86_device, workdir=str(x86_device.dir / "self-test work"))  # the shared device's own workdir
    # stays as the other fleet tests expect it
    inv = write_inventory(tmp_path / "devices.toml", spec, runtimes=("onnxruntime", "tensorrt"))
    inv.write_text(inv.read_text() + f'trtexec = "{spec.trtexec}"\n')
    rc = edgemask_main(["devices", "check", spec.name, "--inventory", str(inv), "--workspace", str(tmp_path / "ws"),
                        "--self-test"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0, report
    assert report["runtimes"]["tensorrt"] == "tensorrt 8.2.1" and "trt" in report["formats"]
    assert report["tensorrt"]["trtexec_version"] == "8.2.1"
    assert report["tensorrt"]["onnxruntime_gpu_providers"] == []  # PyPI's onnxruntime: CPU only
    st = report["self_test"]
    assert st["ok"], st
    assert st["tensorrt"] == "8.2.1" and st["runs"] >= 20 and st["accuracy"] == 1.0
    assert st["layers"] == ["Reformatting CopyNode for Input Tensor 0 to Conv_0 + Relu_1", "Conv_0 + Relu_1",
                            "Flatten_2", "Gemm_3"]

