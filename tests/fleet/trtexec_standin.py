#!/usr/bin/env python3
"""STAND-IN for NVIDIA's `trtexec` (TensorRT 8.0.1 / 8.2.1, JetPack 4.6.x), for the test fleet's TX2 stand-in.
This machine has no NVIDIA GPU and no TensorRT: nothing here builds or runs a TensorRT engine.

What it keeps of the real tool, so the runner's trtexec driving is exercised as on a board:
- the command line the runner uses (``--onnx --saveEngine --fp16 --timingCacheFile --buildOnly --loadEngine
  --loadInputs --exportOutput --exportTimes --exportProfile --exportLayerInfo (8.2 only) --warmUp --duration
  --iterations``); an unknown option fails as trtexec 8.x does ("Unknown option: ...", rc 1);
- stdout lines: "&&&& RUNNING TensorRT.trtexec [TensorRT v8201] # <cmdline>", "[I] TensorRT version: 8.2.1"
  (8.0.1: "TensorRT version: 8001"), "[I] Engine built in X sec.", "[I] Starting inference", the performance
  summary, "&&&& PASSED ..." — each info line with its "[MM/DD/YYYY-HH:MM:SS] [I] " prefix;
- the JSON files, byte for byte in the layout of TensorRT 8.0.1/8.2.1's samples/common/sampleReporting.cpp
  (exportJSONTrace, Profiler::exportJSONProfile, exportJSONOutput) and the {"Layers", "Bindings"} layer info;
- the semantics: warm-up queries (startComputeMs < --warmUp) are in --exportTimes; at least --iterations queries
  and at least --duration seconds; a fused layer's name joins its ONNX node names with " + " (a Conv/Gemm/MatMul
  with the BatchNormalization/Relu/Add nodes that follow it only), and a reformat layer for the input appears on
  its own; a timing cache makes a second build of the same layers cheaper.

What it emulates instead: the "engine" is the ONNX model behind a header, run with onnxruntime (CPU) with
inputs and outputs rounded to float16 (an FP16 engine's I/O precision); layer times come from onnxruntime's own
per-node profile, summed per fused layer; tactic timing during a build costs TACTIC_S per layer the timing cache
does not hold yet (a sleep: the real search times kernels on the GPU). Version: $EDGEMASK_TRTEXEC_STANDIN_VERSION
(default 8.2.1).
"""

import json
import os
import sys
import time

MAGIC = b"EDGEMASK-TRTEXEC-STANDIN-ENGINE\n"
TACTIC_S = float(os.environ.get("EDGEMASK_TRTEXEC_STANDIN_TACTIC_S", "0.25"))  # emulated tactic search per layer
# not in the timing cache
FUSE_HEADS = ("Conv", "Gemm", "MatMul")
FUSE_TAILS = ("BatchNormalization", "Relu", "Add", "Clip", "Sigmoid")
OPTIONS = {"--onnx", "--saveEngine", "--loadEngine", "--fp16", "--timingCacheFile", "--buildOnly", "--loadInputs",
           "--exportOutput", "--exportTimes", "--exportProfile", "--warmUp", "--duration", "--iterations",
           "--separateProfileRun", "--help", "--exportLayerInfo", "--profilingVerbosity"}
ONLY_82 = {"--exportLayerInfo", "--profilingVerbosity"}  # 8.0's sampleOptions.cpp has neither


def version():
    return os.environ.get("EDGEMASK_TRTEXEC_STANDIN_VERSION", "8.2.1")


def code(v):
    major, minor, patch = (int(x) for x in v.split("."))
    return major * 1000 + minor * 100 + patch


def info(msg):
    print(time.strftime("[%m/%d/%Y-%H:%M:%S] ") + "[I] " + msg, flush=True)


def error(msg):
    print(time.strftime("[%m/%d/%Y-%H:%M:%S] ") + "[E] " + msg, flush=True)


def parse(argv):
    opts = {}
    for a in argv:
        key, _, value = a.partition("=")
        if key not in OPTIONS or (key in ONLY_82 and code(version()) < 8200):
            raise SystemExit(("Unknown option: %s %s" % (key, value)).strip())
        opts[key] = value
    return opts


def name_nodes(model):
    """TensorRT's ONNX parser names a layer after its node, or after the node's first output when the node has no
    name; give the model those names (onnxruntime's profile then uses them too)."""
    for n in model.graph.node:
        if not n.name:
            n.name = n.output[0]
    return model


def fused_layers(model):
    """[(layer name, [node names])]: each Conv/Gemm/MatMul with the pointwise nodes that consume it alone."""
    nodes = list(name_nodes(model).graph.node)
    consumers = {}
    for n in nodes:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    taken, layers = set(), []
    for n in nodes:
        if n.name in taken or n.op_type in ("Constant", "Identity"):
            continue
        group = [n]
        if n.op_type in FUSE_HEADS:
            cur = n
            while True:
                nxt = consumers.get(cur.output[0], [])
                if len(nxt) != 1 or nxt[0].op_type not in FUSE_TAILS or nxt[0].name in taken:
                    break
                cur = nxt[0]
                group.append(cur)
        for g in group:
            taken.add(g.name)
        layers.append((" + ".join(g.name for g in group), [g.name for g in group]))
    return layers


def load_engine(path):
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(MAGIC):
        raise SystemExit("Error: the engine file %s is not one this stand-in built" % path)
    head, _, onnx_bytes = data[len(MAGIC):].partition(b"\n")
    return json.loads(head.decode()), onnx_bytes


def build(opts):
    import onnx

    model = onnx.load(opts["--onnx"])
    onnx.checker.check_model(model)
    info("Start parsing network model")
    info("Finish parsing network model")
    layers = fused_layers(model)
    cache_path = opts.get("--timingCacheFile")
    cache = set()
    if cache_path and os.path.isfile(cache_path):
        with open(cache_path) as f:
            cache = set(json.load(f))
    keys = []
    for name, members in layers:
        node = next(n for n in model.graph.node if n.name == members[0])
        weights = [i for i in node.input[1:]]
        shapes = [list(t.dims) for t in model.graph.initializer if t.name in weights]
        keys.append("%s|%s|%s" % ("+".join(node.op_type for node in model.graph.node if node.name in members),
                                  json.dumps(shapes), "fp16" if "--fp16" in opts else "fp32"))
    t0 = time.monotonic()
    for k in keys:
        if k not in cache:
            time.sleep(TACTIC_S)
    took = time.monotonic() - t0
    head = {"layers": [l[0] for l in layers], "fp16": "--fp16" in opts, "tensorrt": version()}
    with open(opts["--saveEngine"], "wb") as f:
        f.write(MAGIC + json.dumps(head).encode() + b"\n" + name_nodes(model).SerializeToString())
    if cache_path:
        with open(cache_path, "w") as f:
            json.dump(sorted(cache | set(keys)), f)
    info("Engine built in %g sec." % took)


def _f(x):
    return "%g" % x  # std::ostream's default float format


def run(opts):
    import numpy as np
    import onnxruntime as ort

    head, onnx_bytes = load_engine(opts["--loadEngine"])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    want_profile = "--exportProfile" in opts
    if want_profile:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(os.path.dirname(os.path.abspath(opts["--exportProfile"])),
                                              "standin_ort")
    sess = ort.InferenceSession(onnx_bytes, sess_options=so, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in inp.shape]
    x = np.random.RandomState(0).rand(*shape).astype(np.float32)
    for spec in filter(None, opts.get("--loadInputs", "").split(",")):
        name, _, path = spec.rpartition(":")
        if name.strip("'") != inp.name:
            raise SystemExit("Error: no input binding %s (has %s)" % (name, inp.name))
        x = np.fromfile(path, dtype=np.float32).reshape(shape)
    if head["fp16"]:
        x = x.astype(np.float16).astype(np.float32)
    warm_ms = float(opts.get("--warmUp", 200))
    duration_s = float(opts.get("--duration", 3))
    iters = int(opts.get("--iterations", 10))
    info("Starting inference")
    trace, y = [], None
    t_start = time.perf_counter()

    def ms():
        return (time.perf_counter() - t_start) * 1000.0

    while True:
        q = {"startEnqMs": ms()}
        q["endEnqMs"] = q["startH2dMs"] = ms()
        xd = np.array(x, copy=True)
        q["endH2dMs"] = q["startComputeMs"] = ms()
        y = sess.run(None, {inp.name: xd})[0]
        q["endComputeMs"] = q["startD2hMs"] = ms()
        y = np.array(y, copy=True)
        q["endD2hMs"] = ms()
        trace.append(q)
        timed = [t for t in trace if t["startComputeMs"] >= warm_ms]
        if len(timed) >= iters and (not timed or timed[-1]["endD2hMs"] - timed[0]["startH2dMs"] >= duration_s * 1e3):
            break
    if head["fp16"]:
        y = y.astype(np.float16).astype(np.float32)
    timed = [t for t in trace if t["startComputeMs"] >= warm_ms]
    info("Warmup completed %d queries over %g ms" % (len(trace) - len(timed), warm_ms))
    lat = sorted(t["endD2hMs"] - t["startH2dMs"] for t in timed)
    info("=== Performance summary ===")
    info("Latency: min = %g ms, max = %g ms, median = %g ms" % (lat[0], lat[-1], lat[len(lat) // 2]))
    if "--exportTimes" in opts:
        with open(opts["--exportTimes"], "w") as f:  # sampleReporting.cpp, exportJSONTrace
            f.write("[\n")
            sep = "  "
            for q in trace:
                h2d, comp, d2h = (q["endH2dMs"] - q["startH2dMs"], q["endComputeMs"] - q["startComputeMs"],
                                  q["endD2hMs"] - q["startD2hMs"])
                f.write(sep + "{ ")
                sep = ", "
                f.write(", ".join('"%s" : %s' % (k, _f(v)) for k, v in (
                    ("startEnqMs", q["startEnqMs"]), ("endEnqMs", q["endEnqMs"]), ("startH2dMs", q["startH2dMs"]),
                    ("endH2dMs", q["endH2dMs"]), ("startComputeMs", q["startComputeMs"]),
                    ("endComputeMs", q["endComputeMs"]), ("startD2hMs", q["startD2hMs"]),
                    ("endD2hMs", q["endD2hMs"]), ("h2dMs", h2d), ("computeMs", comp), ("d2hMs", d2h),
                    ("latencyMs", h2d + comp + d2h), ("endToEndMs", q["endD2hMs"] - q["startH2dMs"]))) + " }\n")
            f.write("]\n")
    if "--exportOutput" in opts:
        name = sess.get_outputs()[0].name
        with open(opts["--exportOutput"], "w") as f:  # sampleReporting.cpp, exportJSONOutput
            f.write("[\n  { \"name\" : \"%s\"\n  , \"dimensions\" : \"%s\"\n  , \"values\" : [ %s ]\n  }\n]\n"
                    % (name, "x".join(str(d) for d in y.shape), ", ".join("%.9g" % v for v in y.ravel())))
    if want_profile:
        profile(sess.end_profiling(), head["layers"], len(trace), opts["--exportProfile"])
    if "--exportLayerInfo" in opts:
        with open(opts["--exportLayerInfo"], "w") as f:
            json.dump({"Layers": [_reformat_name(head)] + head["layers"],
                       "Bindings": [inp.name, sess.get_outputs()[0].name]}, f)


def _reformat_name(head):
    return "Reformatting CopyNode for Input Tensor 0 to %s" % head["layers"][0]


def profile(trace_path, layers, count, dest):
    """Per fused layer: the summed onnxruntime kernel time of its nodes over all queries (the profiler is
    attached to every query, warm-up included, as trtexec's is), written as Profiler::exportJSONProfile does."""
    with open(trace_path) as f:
        events = json.load(f)
    os.remove(trace_path)
    node_ms = {}
    for e in events:
        name = e.get("name", "")
        if e.get("cat") == "Node" and name.endswith("_kernel_time"):
            key = name[:-len("_kernel_time")]
            node_ms[key] = node_ms.get(key, 0.0) + e["dur"] / 1000.0
    rows = [(_reformat_name({"layers": layers}), 0.002 * count)]
    for layer in layers:
        rows.append((layer, sum(node_ms.get(n, 0.0) for n in layer.split(" + "))))
    total = sum(t for _, t in rows) or 1.0
    with open(dest, "w") as f:
        f.write("[\n  { \"count\" : %d }\n" % count)
        for name, t in rows:
            f.write(", { \"name\" : \"%s\", \"timeMs\" : %s, \"averageMs\" : %s, \"percentage\" : %s }\n"
                    % (name, _f(t), _f(t / count), _f(t / total * 100)))
        f.write("]\n")


def install(directory, python=None):
    """Write an executable `trtexec` in ``directory`` that runs this stand-in with ``python`` (default: this
    interpreter, which has onnx and onnxruntime); returns its path."""
    path = os.path.join(str(directory), "trtexec")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n# STAND-IN for TensorRT's trtexec (edgemask test fleet); see %s\nexec %s %s \"$@\"\n"
                % (os.path.abspath(__file__), python or sys.executable, os.path.abspath(__file__)))
    os.chmod(path, 0o755)
    return path


def main(argv):
    cmdline = " ".join([sys.argv[0]] + argv)
    test = "TensorRT.trtexec [TensorRT v%d]" % code(version())
    print("&&&& RUNNING %s # %s" % (test, cmdline), flush=True)
    try:
        opts = parse(argv)
    except SystemExit as e:
        error(str(e))
        print("&&&& FAILED %s # %s" % (test, cmdline), flush=True)
        return 1
    if "--help" in opts:
        print("=== Model Options ===\n  --onnx=<file>               ONNX model", flush=True)
        print("&&&& PASSED %s # %s" % (test, cmdline), flush=True)
        return 0
    v = version()
    info("TensorRT version: %s" % (v if code(v) >= 8200 else code(v)))
    try:
        if "--onnx" in opts:
            build(opts)
        elif "--loadEngine" not in opts:
            raise SystemExit("Error: no model (--onnx) or engine (--loadEngine) given")
        if "--buildOnly" not in opts:
            if "--loadEngine" not in opts:
                opts["--loadEngine"] = opts["--saveEngine"]
            run(opts)
    except SystemExit as e:
        error(str(e))
        print("&&&& FAILED %s # %s" % (test, cmdline), flush=True)
        return 1
    print("&&&& PASSED %s # %s" % (test, cmdline), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
