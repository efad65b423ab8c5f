"""Per-operator profilers' output read on the board: profiled runs, separate from the timed ones (a profiler
inflates latency). A profile document is {"available": bool, "profiler", "reason" (when not available), "runs":
[{"end_to_end_ms", "total_us" (the runtime's own time for the run), "ops": [[name, op type, microseconds,
provider], ...]}], "blocks" (delegates that report as one block), "etdump" (ExecuTorch: its file on the board),
"etdump_b64", "etdump_sha256", "etdump_bytes" (ExecuTorch: the ETDump itself, its ops filled in on the host)}."""

import json
import os

from .errors import ProfilerMissing


ETDUMP_MAX_BYTES = 16 * 1000 * 1000  # an ETDump larger than this stays on the board (JSON over SSH)
ORT_KERNEL_SUFFIX = "_kernel_time"
TFLITE_NO_PROFILER = ("the TFLite Python interpreter exposes no per-operator profiler (its op profiling is only "
                      "in the benchmark_model binary: --enable_op_profiling=true)")
ETDUMP_MISSING = ("this ExecuTorch runtime wrote no ETDump: it was built without its event tracer "
                  "(EXECUTORCH_ENABLE_EVENT_TRACER=OFF, as in the pip wheels); rebuild with it ON to profile layers")


def group_onnxruntime_runs(events):
    """onnxruntime's profile (Chrome trace events) -> one entry per ``model_run``, in order:
    {"total_us": the run's duration, "ops": [[node name, op type, duration us, provider], ...]}.

    Node events ("cat": "Node", name "<node>_kernel_time") belong to the model_run whose [ts, ts + dur] holds them;
    the node name is given without the suffix."""
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    out = [{"total_us": float(r["dur"]), "ops": []} for r in runs]
    for e in events:
        name = e.get("name", "")
        if e.get("cat") != "Node" or not name.endswith(ORT_KERNEL_SUFFIX):
            continue
        args = e.get("args") or {}
        for r, entry in zip(runs, out):
            if r["ts"] <= e["ts"] <= r["ts"] + r["dur"]:
                entry["ops"].append([name[:-len(ORT_KERNEL_SUFFIX)], args.get("op_name", "?"), float(e["dur"]),
                                     args.get("provider", "?")])
                break
    return out


def onnxruntime_profile(trace_path, warmup, end_to_end_ms):
    """Read (then delete) onnxruntime's trace; drop the warm-up runs; pair each run with its end-to-end time."""
    with open(trace_path) as f:
        events = json.load(f)
    os.remove(trace_path)
    runs = group_onnxruntime_runs(events)[warmup:]
    if len(runs) != len(end_to_end_ms):
        raise ProfilerMissing("onnxruntime's trace has %d model runs after the warm-up, %d were made"
                              % (len(runs), len(end_to_end_ms)))
    for r, ms in zip(runs, end_to_end_ms):
        r["end_to_end_ms"] = ms
    providers = sorted(set(op[3] for r in runs for op in r["ops"]) - set(["CPUExecutionProvider"]))
    blocks = ["%s: its nodes are one block each in onnxruntime's trace" % p for p in providers]
    return {"available": True, "profiler": "onnxruntime enable_profiling", "runs": runs, "blocks": blocks}


def executorch_profile(program, warmup, end_to_end_ms, profile_dir):
    """Write the ETDump (warm-up and profiled runs) into profile_dir and bring its bytes back in the result
    ("etdump_b64", its "etdump_sha256" and "etdump_bytes"): the host reads its events with the Inspector and the
    artifact's ETRecord (profiling.layers.etdump_runs), so the board needs no devtools. No ETDump (a runtime built
    without the event tracer): not available; one over ETDUMP_MAX_BYTES: not brought back, said why."""
    import base64
    import hashlib

    path = os.path.join(profile_dir, "model.etdp")
    program.write_etdump_result_to_file(path, os.path.join(profile_dir, "model.debug.bin"))  # no buffer: none
    runs = [{"end_to_end_ms": ms, "ops": []} for ms in end_to_end_ms]
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return {"available": False, "reason": ETDUMP_MISSING, "runs": runs, "blocks": []}
    with open(path, "rb") as f:
        data = f.read()
    if len(data) > ETDUMP_MAX_BYTES:
        return {"available": False, "runs": runs, "blocks": [], "etdump": path,
                "reason": "the ETDump is %d bytes, over the %d the runner sends back; profile fewer runs"
                          % (len(data), ETDUMP_MAX_BYTES)}
    return {"available": True, "profiler": "executorch etdump", "etdump": path, "warmup_runs": warmup,
            "etdump_bytes": len(data), "etdump_sha256": hashlib.sha256(data).hexdigest(),
            "etdump_b64": base64.b64encode(data).decode("ascii"), "runs": runs, "blocks": []}
