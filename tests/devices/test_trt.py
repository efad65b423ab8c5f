"""TensorRT (format "trt"): the runner's parsers against the files trtexec 8.0.1/8.2.1 write (layouts copied from
TensorRT's samples/common/sampleReporting.cpp, identical in both releases), the fused-name splitting on the host,
and the runner driving the trtexec STAND-IN (tests/fleet/trtexec_standin.py: no GPU here) end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from artifacts import make_artifact

from edgemask.devices.remote.runner import trt_files
from edgemask.devices.runner_app import runner_path
from edgemask.profiling.layers import OTHER, layer_of, run_layer_us
from edgemask.profiling.trt_profile import split_fused, trt_layer_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fleet"))
import trtexec_standin  # noqa: E402

RUNNER = runner_path()  # the zipapp a board runs

# exportJSONTrace's layout (sampleReporting.cpp, 8.0.1 and 8.2.1): one query per line, "key" : value pairs
TIMES_82 = """[
  { "startEnqMs" : 0.1, "endEnqMs" : 0.2, "startH2dMs" : 0.2, "endH2dMs" : 0.3, "startComputeMs" : 0.3, \
"endComputeMs" : 1.3, "startD2hMs" : 1.3, "endD2hMs" : 1.4, "h2dMs" : 0.1, "computeMs" : 1, "d2hMs" : 0.1, \
"latencyMs" : 1.2, "endToEndMs" : 1.2 }
, { "startEnqMs" : 2, "endEnqMs" : 2.1, "startH2dMs" : 2.1, "endH2dMs" : 2.2, "startComputeMs" : 2.2, \
"endComputeMs" : 3.0, "startD2hMs" : 3.0, "endD2hMs" : 3.1, "h2dMs" : 0.1, "computeMs" : 0.8, "d2hMs" : 0.1, \
"latencyMs" : 1, "endToEndMs" : 1 }
, { "startEnqMs" : 3.1, "endEnqMs" : 3.2, "startH2dMs" : 3.2, "endH2dMs" : 3.3, "startComputeMs" : 3.3, \
"endComputeMs" : 4.2, "startD2hMs" : 4.2, "endD2hMs" : 4.6, "h2dMs" : 0.1, "computeMs" : 0.9, "d2hMs" : 0.4, \
"latencyMs" : 1.4, "endToEndMs" : 1.4 }
]
"""
# Profiler::exportJSONProfile's layout: the count first, then one layer per line (Myelin's subgraph included)
PROFILE_82 = """[
  { "count" : 4 }
, { "name" : "Reformatting CopyNode for Input Tensor 0 to Conv_0 + Relu_1", "timeMs" : 0.4, "averageMs" : 0.1, \
"percentage" : 2 }
, { "name" : "Conv_0 + Relu_1", "timeMs" : 12, "averageMs" : 3, "percentage" : 60 }
, { "name" : "PWN(PWN(Sigmoid_2), Mul_3)", "timeMs" : 1.6, "averageMs" : 0.4, "percentage" : 8 }
, { "name" : "{ForeignNode[Gemm_4...Relu_7]}", "timeMs" : 6, "averageMs" : 1.5, "percentage" : 30 }
]
"""
OUTPUT_82 = """[
  { "name" : "output"
  , "dimensions" : "1x3"
  , "values" : [ 0.5, -1.25, 3 ]
  }
]
"""


def test_trtexec_times_drop_the_warm_up_as_trtexec_does():
    trace = trt_files.parse_trtexec_times(TIMES_82)
    assert len(trace) == 3  # --exportTimes holds the warm-up queries too
    timed = trt_files.timed_queries(trace, warmup_ms=2)  # a query is warm-up while startComputeMs < --warmUp
    assert [q["latencyMs"] for q in timed] == [1, 1.4]
    assert trt_files.trace_window_s(timed) == pytest.approx((4.6 - 2.1) / 1000)  # first H2D start .. last D2H end
    with pytest.raises(ValueError, match="exportTimes"):
        trt_files.parse_trtexec_times('[{"count": 4}]')  # a profile is no trace


def test_trtexec_profile_layers_and_foreign_nodes():
    count, layers = trt_files.parse_trtexec_profile(PROFILE_82)
    assert count == 4 and [l["averageMs"] for l in layers] == [0.1, 3, 0.4, 1.5]
    assert trt_files.foreign_node_blocks([l["name"] for l in layers]) == [
        "TensorRT Myelin {ForeignNode[Gemm_4...Relu_7]}: its ONNX nodes run as one block"]
    with pytest.raises(ValueError, match="count"):
        trt_files.parse_trtexec_profile(TIMES_82)


def test_trtexec_output_and_layer_info():
    assert trt_files.parse_trtexec_output(OUTPUT_82) == {"output": ((1, 3), [0.5, -1.25, 3.0])}
    names = trt_files.parse_layer_info('{"Layers": ["Conv_0 + Relu_1", "Gemm_2"], "Bindings": ["input", "output"]}')
    assert names == ["Conv_0 + Relu_1", "Gemm_2"]
    detailed = '{"Layers": [{"Name": "Conv_0 + Relu_1", "LayerType": "CaskConvolution"}], "Bindings": ["input"]}'
    assert trt_files.parse_layer_info(detailed) == ["Conv_0 + Relu_1"]


@pytest.mark.parametrize("stdout, version", [
    ("&&&& RUNNING TensorRT.trtexec [TensorRT v8201] # /usr/src/tensorrt/bin/trtexec --help\n", "8.2.1"),
    ("&&&& RUNNING TensorRT.trtexec [TensorRT v8001] # trtexec --onnx=m.onnx\n", "8.0.1"),
    ("[11/25/2026-13:00:00] [I] TensorRT version: 8001\n", "8.0.1"),  # 8.0: getInferLibVersion()
    ("[11/25/2026-13:00:00] [I] TensorRT version: 8.2.1\n", "8.2.1"),  # 8.2: MAJOR.MINOR.PATCH
    ("usage: something else\n", None),
])
def test_trtexec_version_lines(stdout, version):
    assert trt_files.parse_trtexec_version(stdout) == version


def test_engine_build_time_line():
    assert trt_files.parse_engine_build_s("[11/25/2026-13:00:00] [I] Engine built in 412.5 sec.\n") == 412.5
    assert trt_files.parse_engine_build_s("[I] Engine loaded in 1.2 sec.\n") is None


def test_fused_names_split_back_to_onnx_nodes():
    assert split_fused("Conv_0 + BatchNormalization_1 + Relu_2") == ["Conv_0", "BatchNormalization_1", "Relu_2"]
    assert split_fused("PWN(PWN(Sigmoid_2), Mul_3)") == ["Sigmoid_2", "Mul_3"]
    assert split_fused("Conv_5 + PWN(Relu_6, Add_7)") == ["Conv_5", "Relu_6", "Add_7"]
    assert split_fused("Reformatting CopyNode for Input Tensor 0 to Conv_0") == []
    assert split_fused("(Unnamed Layer* 12) [Shuffle]") == []
    assert split_fused("{ForeignNode[Gemm_4...Relu_7]}") is None  # Myelin: cannot be split


def test_trt_profile_times_go_to_the_mask_layers():
    index = {"Conv_0": "features.0", "Relu_1": "features.0", "Sigmoid_2": "gate", "Mul_3": "gate",
             "Gemm_4": "classifier"}
    _, layers = trt_files.parse_trtexec_profile(PROFILE_82)
    ops = [[l["name"], "TensorRT", l["averageMs"] * 1000.0, "TensorRT"] for l in layers]
    # the reformat and the ForeignNode (whose first node is Gemm_4, but it cannot be split) stay unattributed
    assert run_layer_us(ops, index) == {OTHER: pytest.approx(100.0 + 1500.0), "features.0": 3000.0, "gate": 400.0}
    # a fusion across two mask layers goes to its first node's layer (FUSED_ATTRIBUTION = "first")
    assert trt_layer_of("Mul_3 + Conv_0", index, layer_of, OTHER) == "gate"


def _run(art: Path, trtexec: str | None, engines: Path, *extra: str) -> dict:
    argv = [sys.executable, str(RUNNER), "--model", str(art / "model.onnx"), "--format", "trt", "--sample-io",
            str(art / "sample_io.npz"), "--input-name", "input", "--engine-dir", str(engines), "--min-runs", "20",
            "--min-seconds", "0.2", "--warmup-seconds", "0.05", "--idle-seconds", "0", *extra]
    if trtexec:
        argv += ["--trtexec", trtexec]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    return json.loads(r.stdout)


def test_runner_builds_caches_and_times_an_engine(tmp_path):
    trtexec = trtexec_standin.install(tmp_path)
    art = make_artifact(tmp_path / "a", n=8, wrong_labels=2)
    first = _run(art, trtexec, tmp_path / "engines", "--profile-layers", "--profile-runs", "5")
    assert first["ok"], first.get("error")
    assert first["runtime_version"] == "tensorrt 8.2.1" and first["accuracy"] == pytest.approx(6 / 8)
    assert 0 < first["output_max_abs_diff"] <= first["state_after"]["tensorrt"]["output_tolerance"]  # FP16 I/O
    assert len(first["latency_ms"]) >= 20 and first["timed_window_s"] >= 0.2
    trt = first["state_after"]["tensorrt"]
    assert trt["cached"] is False and trt["flags"] == ["--fp16"] and trt["build_s"] >= trt["trtexec_build_s"] > 0
    prof = first["profile"]
    assert prof["available"] and prof["iterations"] == 5 and prof["blocks"] == []
    assert [op[0] for op in prof["runs"][0]["ops"]] == ["Reformatting CopyNode for Input Tensor 0 to output",
                                                      "output"]  # the unnamed Gemm is named after its output
    assert prof["engine_layers"] == [op[0] for op in prof["runs"][0]["ops"]]  # 8.2's --exportLayerInfo
    again = _run(art, trtexec, tmp_path / "engines")
    assert again["ok"] and again["state_after"]["tensorrt"]["cached"] is True  # same ONNX, TensorRT, flags
    assert again["state_after"]["tensorrt"]["key"] == trt["key"]
    # another client of the same shapes: a new engine, but its layers' tactics are in the board's timing cache
    other = make_artifact(tmp_path / "b", n=8, wrong_labels=0)
    onnx = other / "model.onnx"
    onnx.write_bytes(onnx.read_bytes().replace(b"tiny", b"tinz"))  # other bytes, same layers
    second = _run(other, trtexec, tmp_path / "engines")
    t2 = second["state_after"]["tensorrt"]
    assert second["ok"] and t2["cached"] is False and t2["key"] != trt["key"]
    assert t2["timing_cache_bytes_before"] > 0 and t2["trtexec_build_s"] < trt["trtexec_build_s"] / 2


def test_runner_on_tensorrt_8_0_has_no_layer_info(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEMASK_TRTEXEC_STANDIN_VERSION", "8.0.1")  # its trtexec refuses --exportLayerInfo
    art = make_artifact(tmp_path / "a", n=4, wrong_labels=0)
    res = _run(art, trtexec_standin.install(tmp_path), tmp_path / "engines", "--profile-layers", "--profile-runs", "3")
    assert res["ok"] and res["runtime_version"] == "tensorrt 8.0.1"
    assert res["profile"]["available"] and "engine_layers" not in res["profile"]


def test_runner_without_trtexec_says_where_it_looked(tmp_path):
    art = make_artifact(tmp_path / "a", n=4, wrong_labels=0)
    res = _run(art, str(tmp_path / "no-trtexec"), tmp_path / "engines")
    assert res["ok"] is False and res["error"].startswith("no trtexec on this device")
    assert 'trtexec = "PATH"' in res["error"]


def test_probe_reports_tensorrt_and_gpu_providers(tmp_path):
    trtexec = trtexec_standin.install(tmp_path)
    r = subprocess.run([sys.executable, str(RUNNER), "--probe", "--trtexec", trtexec], capture_output=True, text=True,
                       timeout=300)
    info = json.loads(r.stdout)
    assert info["runtimes"]["tensorrt"] == "tensorrt 8.2.1"
    t = info["tensorrt"]
    assert t["trtexec"] == trtexec and t["trtexec_version"] == "8.2.1" and t["python_tensorrt"] is None
    assert "CPUExecutionProvider" in t["onnxruntime_providers"] and t["onnxruntime_gpu_providers"] == []
    sizes = info["installed_mb"]
    assert {"onnxruntime", "executorch", "tflite", "all"} <= set(sizes)
    assert "torch" in sizes["executorch"]["dists"] and "onnxruntime" in sizes["onnxruntime"]["dists"]
    assert sizes["all"]["mb"] >= max(sizes[k]["mb"] for k in ("onnxruntime", "executorch", "tflite"))


def test_trtexec_dies_with_its_runner(tmp_path):
    """A runner that leaves (its session gone: the watchdog's os._exit, or killed) takes its trtexec with it."""
    import os
    import signal
    import time

    art = make_artifact(tmp_path / "a", n=4, wrong_labels=0)
    engines = tmp_path / "engines-kill"
    env = dict(os.environ, EDGEMASK_TRTEXEC_STANDIN_TACTIC_S="60")  # a build that would last a minute
    log = tmp_path / "runner.stderr"  # the runner copies trtexec's log there
    with open(log, "w") as err:
        p = subprocess.Popen([sys.executable, str(RUNNER), "--model", str(art / "model.onnx"), "--format", "trt",
                              "--sample-io", str(art / "sample_io.npz"), "--input-name", "input", "--engine-dir",
                              str(engines), "--trtexec", trtexec_standin.install(tmp_path)], env=env,
                             stdout=subprocess.DEVNULL, stderr=err)

    def builds():
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
            except OSError:
                continue
            if "trtexec_standin.py" in cmd and str(engines) in cmd:
                found.append(int(pid))
        return found

    deadline = time.monotonic() + 120  # until the build is timing tactics (silent: no write would break it)
    while "Finish parsing network model" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert builds(), "trtexec never started"
    p.send_signal(signal.SIGKILL)
    p.wait()
    deadline = time.monotonic() + 10
    while builds() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert builds() == []
