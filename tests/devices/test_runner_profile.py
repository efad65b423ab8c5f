"""The runner's per-operator profiling: onnxruntime's trace grouped into runs (hand-built trace), the runner's
profiled runs on a real ONNX file, and the explicit "not available" of the runtimes that offer nothing here."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from artifacts import make_artifact

from edgemask.devices.remote.runner.benchmark import profile_runs
from edgemask.devices.remote.runner.profilers import ETDUMP_MISSING, TFLITE_NO_PROFILER, group_onnxruntime_runs
from edgemask.devices.runner_app import runner_path


def _node(name, ts, dur, op="Conv"):
    return {"cat": "Node", "name": name + "_kernel_time", "ts": ts, "dur": dur, "ph": "X",
            "args": {"op_name": op, "provider": "CPUExecutionProvider"}}


def test_onnxruntime_trace_is_grouped_by_model_run():
    events = [
        {"cat": "Session", "name": "session_initialization", "ts": 0, "dur": 50},
        {"cat": "Session", "name": "model_run", "ts": 100, "dur": 40},
        _node("relu_nchwc", 105, 20), _node("node_linear", 126, 9, "Gemm"),
        {"cat": "Node", "name": "node_linear_fence_before", "ts": 125, "dur": 0, "args": {}},  # not a kernel
        {"cat": "Session", "name": "model_run", "ts": 200, "dur": 30},
        _node("relu_nchwc", 203, 11),
        {"cat": "Session", "name": "SequentialExecutor::Execute", "ts": 201, "dur": 25},
    ]
    runs = group_onnxruntime_runs(list(reversed(events)))  # order in the file does not matter
    assert runs == [
        {"total_us": 40.0, "ops": [["node_linear", "Gemm", 9.0, "CPUExecutionProvider"],
                                   ["relu_nchwc", "Conv", 20.0, "CPUExecutionProvider"]]},
        {"total_us": 30.0, "ops": [["relu_nchwc", "Conv", 11.0, "CPUExecutionProvider"]]},
    ]


def test_runner_profiles_onnx_after_the_timed_runs(tmp_path):
    art = make_artifact(tmp_path / "art", n=4)
    res = subprocess.run([sys.executable, str(runner_path()), "--format", "onnx", "--model", str(art / "model.onnx"),
                          "--sample-io", str(art / "sample_io.npz"), "--min-runs", "5", "--min-seconds", "0",
                          "--warmup-seconds", "0", "--idle-seconds", "0", "--power-sensor", "none",
                          "--profile-layers", "--profile-runs", "7", "--profile-warmup", "3"], capture_output=True, text=True)
    doc = json.loads(res.stdout)
    assert doc["ok"], doc
    prof = doc["profile"]
    assert prof["available"] and prof["blocks"] == [] and len(prof["runs"]) == 7  # warm-up runs dropped
    for run in prof["runs"]:
        assert [op[1] for op in run["ops"]] == ["Gemm"]  # the artifact's one node
        assert run["end_to_end_ms"] > 0 and run["total_us"] > 0
    assert not list(tmp_path.glob("**/onnxruntime_profile*"))  # the trace is read, then removed


def test_a_failing_profile_keeps_the_timed_result(tmp_path):
    art = make_artifact(tmp_path / "art", n=4)
    res = subprocess.run([sys.executable, str(runner_path()), "--format", "onnx", "--model", str(art / "model.onnx"),
                          "--sample-io", str(art / "sample_io.npz"), "--min-runs", "5", "--min-seconds", "0",
                          "--warmup-seconds", "0", "--idle-seconds", "0", "--power-sensor", "none",
                          "--profile-layers", "--profile-runs", "3", "--profile-dir", str(tmp_path / "missing")],
                         capture_output=True, text=True)
    doc = json.loads(res.stdout)
    assert res.returncode == 0 and doc["ok"] and len(doc["latency_ms"]) >= 5
    assert doc["profile"]["available"] is False and doc["profile"]["runs"] == []
    assert doc["profile"]["reason"].startswith("the profiled runs failed: FileNotFoundError")


def test_runtimes_without_a_profiler_say_why(tmp_path):
    x = [np.zeros((1, 6), np.float32)]
    got = profile_runs("tflite", str(tmp_path / "model.tflite"), x, 1, 1, 2)
    assert got == {"available": False, "reason": TFLITE_NO_PROFILER, "runs": [], "blocks": []}


def test_executorch_without_event_tracer_says_so(tmp_path):
    """Unit test of executorch_profile alone, with a stand-in program: a runtime built without the event tracer
    writes an empty ETDump (nothing for the host to read)."""
    from edgemask.devices.remote.runner.profilers import executorch_profile

    class NoTracer:  # stand-in for executorch.runtime.Program of a build without EXECUTORCH_ENABLE_EVENT_TRACER
        def write_etdump_result_to_file(self, etdump_path, debug_buffer_path):
            open(etdump_path, "wb").close()

    got = executorch_profile(NoTracer(), 2, [1.5, 2.5], str(tmp_path))
    assert got == {"available": False, "reason": ETDUMP_MISSING, "blocks": [],
                   "runs": [{"end_to_end_ms": 1.5, "ops": []}, {"end_to_end_ms": 2.5, "ops": []}]}


@pytest.mark.slow
def test_executorch_runner_brings_the_etdump_back(tmp_path):
    """ExecuTorch 1.5.1's wheel has the event tracer: the runner's profile carries the ETDump's bytes and their
    digest, whatever the warm-up and run counts, and its temporary directory is gone."""
    import base64
    import hashlib

    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU()).eval()
    prog = to_edge_transform_and_lower(torch.export.export(model, (torch.zeros(1, 6),)),
                                       partitioner=[XnnpackPartitioner()]).to_executorch()
    (tmp_path / "model.pte").write_bytes(prog.buffer)
    got = profile_runs("pte", str(tmp_path / "model.pte"), [np.zeros((1, 6), np.float32)], 1, 2, 3)
    data = base64.b64decode(got["etdump_b64"])
    assert got["available"] is True and got["warmup_runs"] == 2 and got["etdump"] is None
    assert got["etdump_sha256"] == hashlib.sha256(data).hexdigest() and got["etdump_bytes"] == len(data) > 0
    assert len(got["runs"]) == 3 and all(r["end_to_end_ms"] > 0 and r["ops"] == [] for r in got["runs"])
