"""The files trtexec writes and what it prints, parsed (pure functions; the host's tests read them too)."""

import json
import re


# The files trtexec writes, in the formats of TensorRT 8.0.1 / 8.2.1's samples/common/sampleReporting.cpp
# (identical in both releases):
#   --exportTimes   [ { "startEnqMs" : t, "endEnqMs" : t, "startH2dMs" : t, "endH2dMs" : t,
#                       "startComputeMs" : t, "endComputeMs" : t, "startD2hMs" : t, "endD2hMs" : t,
#                       "h2dMs" : t, "computeMs" : t, "d2hMs" : t, "latencyMs" : t, "endToEndMs" : t }, ... ]
#                   (every query, warm-up included: a query is warm-up while startComputeMs < --warmUp ms)
#   --exportProfile [ { "count" : N }, { "name" : "...", "timeMs" : t, "averageMs" : t / N,
#                       "percentage" : % }, ... ]   (t summed over the N profiled iterations)
#   --exportOutput  [ { "name" : "out", "dimensions" : "1x10", "values" : [ v, ... ] }, ... ]
#   --exportLayerInfo (8.2+, IEngineInspector JSON): { "Layers" : [name or {"Name": ...}, ...], "Bindings" : [...] }
# and trtexec's stdout: "&&&& RUNNING TensorRT.trtexec [TensorRT v8201] # ..." (NV_TENSORRT_VERSION =
# major * 1000 + minor * 100 + patch), "[I] Engine built in 12.3 sec.", "[I] Starting inference".

_TRT_VERSION_CODE = re.compile(r"\[TensorRT v(\d+)\]")
_TRT_VERSION_LINE = re.compile(r"TensorRT version: (\d+(?:\.\d+)*)")
_TRT_BUILT = re.compile(r"Engine built in ([0-9.eE+-]+) sec")


def trt_version_from_code(code):
    """NV_TENSORRT_VERSION (major * 1000 + minor * 100 + patch, e.g. 8201) -> "8.2.1"."""
    code = int(code)
    return "%d.%d.%d" % (code // 1000, code % 1000 // 100, code % 100)


def parse_trtexec_version(stdout):
    """TensorRT's version from trtexec's stdout: the "&&&& RUNNING ... [TensorRT v8201]" line, else the
    "TensorRT version: 8.2.1" (8.2) or "TensorRT version: 8001" (8.0, getInferLibVersion()) line; None."""
    m = _TRT_VERSION_CODE.search(stdout)
    if m:
        return trt_version_from_code(m.group(1))
    m = _TRT_VERSION_LINE.search(stdout)
    if m:
        v = m.group(1)
        return v if "." in v else trt_version_from_code(v)
    return None


def parse_engine_build_s(stdout):
    """trtexec's own build time ("Engine built in 12.3 sec."), or None."""
    m = _TRT_BUILT.search(stdout)
    return float(m.group(1)) if m else None


def parse_trtexec_times(text):
    """--exportTimes JSON -> list of per-query dicts (warm-up queries included, in order)."""
    doc = json.loads(text)
    if not isinstance(doc, list) or any(not isinstance(q, dict) or "latencyMs" not in q for q in doc):
        raise ValueError("not a trtexec --exportTimes document (a list of queries with latencyMs)")
    return doc


def timed_queries(trace, warmup_ms):
    """The queries after the warm-up, as trtexec itself splits them (sampleReporting.cpp, printPerformanceReport:
    a query is timed when its startComputeMs >= --warmUp ms)."""
    return [q for q in trace if float(q["startComputeMs"]) >= warmup_ms]


def trace_window_s(queries):
    """Seconds from the first timed query's H2D start to the last one's D2H end (trtexec's benchTime)."""
    if not queries:
        return 0.0
    return (float(queries[-1]["endD2hMs"]) - float(queries[0]["startH2dMs"])) / 1000.0


def parse_trtexec_profile(text):
    """--exportProfile JSON -> (iterations N, [{"name", "timeMs", "averageMs", "percentage"}, ...])."""
    doc = json.loads(text)
    if not isinstance(doc, list) or not doc or not isinstance(doc[0], dict) or "count" not in doc[0]:
        raise ValueError('not a trtexec --exportProfile document (first entry {"count": N})')
    layers = doc[1:]
    for entry in layers:
        if not isinstance(entry, dict) or "name" not in entry or "averageMs" not in entry:
            raise ValueError("trtexec profile entry without name/averageMs: %r" % (entry,))
    return int(doc[0]["count"]), layers


def parse_trtexec_output(text):
    """--exportOutput JSON -> {binding name: (dims tuple, [values])}; dims "1x10" -> (1, 10)."""
    doc = json.loads(text)
    out = {}
    for b in doc:
        dims = tuple(int(d) for d in str(b.get("dimensions", "")).split("x") if d.strip())
        out[b["name"]] = (dims, [float(v) for v in b["values"]])
    return out


def parse_layer_info(text):
    """--exportLayerInfo JSON (TensorRT 8.2+) -> the engine's layer names, in execution order. With
    --profilingVerbosity=layer_names_only "Layers" holds names; with detailed, objects with "Name"."""
    doc = json.loads(text)
    layers = doc.get("Layers") if isinstance(doc, dict) else None
    if not isinstance(layers, list):
        raise ValueError('not a TensorRT layer-information document (no "Layers" list)')
    return [l["Name"] if isinstance(l, dict) else str(l) for l in layers]


def foreign_node_blocks(names):
    """Myelin's fused subgraphs ("{ForeignNode[Gemm_5...Relu_8]}"): TensorRT times them as one layer whose
    ONNX nodes cannot be told apart; one note each."""
    return ["TensorRT Myelin %s: its ONNX nodes run as one block" % n for n in names if "ForeignNode" in n]
