"""A "trt" job: the engine's outputs checked and timed by trtexec, power sampled while it infers, and its profiled
runs (trtexec --exportProfile)."""

import math
import os
import shutil
import sys
import time
import traceback

from .errors import RunFailed
from .reference import OutputCheck, read_sample_io
from .sensors import PowerSampler, find_sensor, idle_power_w, mean_w, power_fields
from .state import device_state, rss_kb
from .system import runner_file
from .trt import (TRT_FP16_ATOL_SHARE, TRTEXEC_DEFAULT, ensure_engine, find_trtexec, gpu_rail_sensor,
                  log_tail, run_trtexec, trtexec_version)
from .trt_files import (foreign_node_blocks, parse_layer_info, parse_trtexec_output, parse_trtexec_profile,
                        parse_trtexec_times, timed_queries, trace_window_s)


def benchmark_trt(args):
    """The "trt" format: build (or reuse) the FP16 engine, check its outputs on every sample of sample_io
    (trtexec --loadInputs / --exportOutput, one trtexec call per sample), then time it with trtexec under the
    same protocol as the other formats (at least --min-runs queries and --min-seconds after --warmup-seconds),
    sampling the input rail and, on a Jetson, the GPU rail while trtexec infers."""
    import tempfile

    import numpy as np

    state_before = device_state()
    trtexec = find_trtexec(args.trtexec)
    if trtexec is None:
        raise RunFailed("no trtexec on this device (looked at %s and PATH); install TensorRT (JetPack) or set "
                        "trtexec = \"PATH\" for this device in devices.toml" % (args.trtexec or TRTEXEC_DEFAULT))
    version = trtexec_version(trtexec)
    if version is None:
        raise RunFailed("%s --help printed no TensorRT version; is it trtexec?" % trtexec)
    if not args.input_name:
        raise RunFailed("--input-name is required for format trt (trtexec --loadInputs names the binding)")
    engine_dir = args.engine_dir or os.path.join(os.path.dirname(os.path.dirname(runner_file())), "trt-engines")
    build = ensure_engine(trtexec, version, args.model, engine_dir)
    engine = build["engine"]

    inputs, expected, labels = read_sample_io(args.sample_io)
    n = inputs.shape[0]
    atol = max(args.tolerance, TRT_FP16_ATOL_SHARE * float(np.max(np.abs(expected))))  # FP16: see trt.py
    work = tempfile.mkdtemp(prefix="edgemask-trt-")
    try:
        check = OutputCheck(expected, labels, atol, args.rtol, "FP16 engine output")
        first_ms = None
        for i in range(n):
            x = os.path.join(work, "input%d.bin" % i)
            inputs[i:i + 1].tofile(x)
            out_json = os.path.join(work, "output%d.json" % i)
            t0 = time.perf_counter()
            rc, out = run_trtexec([trtexec, "--loadEngine=" + engine, "--loadInputs='%s':%s" % (args.input_name, x),
                                    "--exportOutput=" + out_json, "--iterations=1", "--warmUp=0", "--duration=0"],
                                   timeout=600)
            if first_ms is None:
                first_ms = (time.perf_counter() - t0) * 1000.0
            if rc != 0 or not os.path.isfile(out_json):
                raise RunFailed("trtexec could not run the engine of %s (rc=%d): %s" % (args.model, rc, log_tail(out)))
            with open(out_json) as f:
                outputs = parse_trtexec_output(f.read())
            dims, values = list(outputs.values())[0]
            check.add(i, values)
        failed = check.failure()
        if failed:
            return failed

        sensor, missing = find_sensor(args.power_sensor)
        idle_w = idle_power_w(sensor, args.idle_seconds, args.power_rate_hz)
        gpu_sensor = gpu_rail_sensor() if sensor is not None and sensor.name == "ina3221" else None
        samplers = [PowerSampler(s, args.power_rate_hz) for s in (sensor, gpu_sensor) if s is not None]

        def on_line(line):  # power is sampled while trtexec infers, not while it loads the engine
            if "Starting inference" in line:
                for s in samplers:
                    s.start()

        times_json = os.path.join(work, "times.json")
        warmup_ms = int(round(args.warmup_seconds * 1000))
        argv = [trtexec, "--loadEngine=" + engine, "--warmUp=%d" % warmup_ms,
                "--iterations=%d" % args.min_runs, "--duration=%d" % int(math.ceil(args.min_seconds)),
                "--exportTimes=" + times_json]
        rc, out = run_trtexec(argv, timeout=3600, on_line=on_line)
        power = [s.stop() for s in samplers if s._thread is not None]
        if rc != 0 or not os.path.isfile(times_json):
            raise RunFailed("trtexec could not time the engine (rc=%d): %s" % (rc, log_tail(out)))
        with open(times_json) as f:
            queries = timed_queries(parse_trtexec_times(f.read()), warmup_ms)
        latencies = [float(q["latencyMs"]) for q in queries]
        result = {
            "ok": True, "latency_ms": latencies, "inferences_per_sample": 1, "load_ms": None,
            "first_inference_ms": first_ms, "peak_rss_kb": int(rss_kb()[1]), "rss_growth_kb": 0,
            "timed_window_s": trace_window_s(queries), "runtime_version": "tensorrt " + version,
            "threads": args.threads, "state_before": state_before,
        }
        result.update(check.fields())
        compute = sorted(float(q["computeMs"]) for q in queries)
        trt = {"trtexec": trtexec, "tensorrt": version, "output_tolerance": atol, "output_rtol": args.rtol,
               "gpu_compute_ms_median": compute[len(compute) // 2] if compute else None}
        trt.update((k, v) for k, v in build.items() if k != "engine")
        board = power[0] if power else []
        result.update(power_fields(sensor, board, samplers[0].achieved_rate_hz if board else None, idle_w, missing))
        if board and gpu_sensor is not None and len(power) > 1 and power[1]:
            trt.update(gpu_power_source=gpu_sensor.source, gpu_power_w_mean=mean_w(power[1]),
                       gpu_power_samples=len(power[1]))
        result["state_after"] = device_state()
        result["state_after"]["tensorrt"] = trt
        if args.profile_layers and args.profile_runs > 0:  # after the timed window; a broken profile never
            # loses the timed result
            try:
                result["profile"] = trt_profile(trtexec, version, engine, args.profile_runs, work)
            except (OSError, ValueError, KeyError) as e:
                traceback.print_exc(file=sys.stderr)
                result["profile"] = {"available": False, "runs": [], "blocks": [],
                                     "reason": "the trtexec profile could not be read: %s: %s"
                                               % (type(e).__name__, " ".join(str(e).split())[:300])}
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def trt_profile(trtexec, version, engine, runs, work):
    """Profiled runs (trtexec --exportProfile): TensorRT's profiler sums each engine layer's time over the
    iterations, so the runs come back as ONE entry holding the per-iteration averages, beside the median of the
    iterations' latency. Layer names are the engine's (fused ONNX node names joined by " + "); the host splits
    them (profiling/trt_profile.py)."""
    prof = os.path.join(work, "profile.json")
    times = os.path.join(work, "profile_times.json")
    argv = [trtexec, "--loadEngine=" + engine, "--iterations=%d" % runs, "--warmUp=0", "--duration=0",
            "--exportProfile=" + prof, "--exportTimes=" + times]
    info = os.path.join(work, "layers.json")
    if tuple(int(p) for p in version.split(".")[:2]) >= (8, 2):
        argv.append("--exportLayerInfo=" + info)
    rc, out = run_trtexec(argv, timeout=3600)
    if rc != 0 or not os.path.isfile(prof):
        return {"available": False, "runs": [], "blocks": [],
                "reason": "trtexec --exportProfile failed (rc=%d): %s" % (rc, log_tail(out))}
    with open(prof) as f:
        count, layers = parse_trtexec_profile(f.read())
    with open(times) as f:
        lat = sorted(float(q["latencyMs"]) for q in parse_trtexec_times(f.read()))
    e2e = lat[len(lat) // 2] if lat else None
    res = {"available": True, "profiler": "trtexec --exportProfile (per-iteration averages)",
           "iterations": count,
           "runs": [{"end_to_end_ms": e2e, "ops": [[l["name"], "TensorRT", float(l["averageMs"]) * 1000.0,
                                                    "TensorRT"] for l in layers]}],
           "blocks": foreign_node_blocks([l["name"] for l in layers])}
    if os.path.isfile(info):
        with open(info) as f:
            res["engine_layers"] = parse_layer_info(f.read())
    return res
