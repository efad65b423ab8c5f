"""One job: load the model, check every sample of sample_io.npz against the host's outputs, warm up, time it
(at least --min-runs samples and --min-seconds, like TFLite's benchmark_model) while sampling power, then the
profiled runs. Returns the JSON document (devices.records.Measurement's fields)."""

import math
import shutil
import sys
import time
import traceback

from .errors import ProfilerMissing, RunFailed
from .reference import OutputCheck, read_sample_io
from .runtimes import RUNTIMES
from .sensors import PowerSampler, find_sensor, idle_power_w, power_fields
from .state import device_state, rss_kb
from .train_benchmark import benchmark_training
from .trt_benchmark import benchmark_trt


def _ms(t0, t1):
    return (t1 - t0) * 1000.0


def inferences_per_sample(sample_min_ms, warm_ms):
    """How many back-to-back inferences one latency sample times: enough that a sample lasts at least
    ``sample_min_ms`` at the warm-up's mean latency ``warm_ms`` (pyperf's calibration of ``loops`` to its
    ``min_time``). 0 (the default) or a model slower than the target: 1, every sample one inference."""
    if not sample_min_ms > 0 or not warm_ms > 0:
        return 1
    return max(1, int(math.ceil(sample_min_ms / warm_ms)))


def benchmark(args):
    if args.format == "trt":
        return benchmark_trt(args)
    if getattr(RUNTIMES[args.format], "training", False):  # a local training step (issue #39), not an inference model
        return benchmark_training(args)

    state_before = device_state()
    try:
        rt = RUNTIMES[args.format]()
    except ImportError as e:
        raise RunFailed("runtime for format %s is not installed on this device: %s" % (args.format, e))

    inputs, expected, labels = read_sample_io(args.sample_io)
    n = inputs.shape[0]
    batches = [inputs[i:i + 1] for i in range(n)]  # each (1, *input_shape[1:])

    rss_before, _ = rss_kb()
    t0 = time.perf_counter()
    rt.load(args.model, args.threads)
    load_ms = _ms(t0, time.perf_counter())
    rss_loaded, _ = rss_kb()

    t0 = time.perf_counter()
    first = rt.run(batches[0])
    first_ms = _ms(t0, time.perf_counter())

    # every sample, batch 1, against the host's reference outputs, by export's rule (the host sends its numbers)
    check = OutputCheck(expected, labels, args.tolerance, args.rtol)
    for i in range(n):
        check.add(i, first if i == 0 else rt.run(batches[i]))
    failed = check.failure()
    if failed:
        return failed

    sensor, missing = find_sensor(args.power_sensor)
    idle_w = idle_power_w(sensor, args.idle_seconds, args.power_rate_hz)

    # Warm-up: at least warmup_runs runs and at least warmup_seconds.
    k = 0
    w0 = time.perf_counter()
    t_end = w0 + args.warmup_seconds
    while k < args.warmup_runs or time.perf_counter() < t_end:
        rt.run(batches[k % n])
        k += 1
    loops = inferences_per_sample(args.sample_min_ms, _ms(w0, time.perf_counter()) / k)

    sampler = PowerSampler(sensor, args.power_rate_hz) if sensor is not None else None
    if sampler is not None:
        sampler.start()
    latencies = []
    clock = time.perf_counter
    w0 = clock()
    t_end = w0 + args.min_seconds
    i = 0
    if loops == 1:  # one inference per sample: nothing between the clock reads but the call
        while len(latencies) < args.min_runs or clock() < t_end:
            x = batches[i % n]
            t0 = clock()
            rt.run(x)
            latencies.append(_ms(t0, clock()))
            i += 1
    else:  # each sample: the mean of `loops` back-to-back inferences (pyperf's loops, timeit's number)
        run = rt.run
        while len(latencies) < args.min_runs or clock() < t_end:
            xs = [batches[(i + j) % n] for j in range(loops)]
            t0 = clock()
            for x in xs:
                run(x)
            latencies.append(_ms(t0, clock()) / loops)
            i += loops
    window_s = clock() - w0
    power = sampler.stop() if sampler is not None else []

    _, peak = rss_kb()
    result = {
        "ok": True,
        "latency_ms": latencies,
        "inferences_per_sample": loops,
        "load_ms": load_ms,
        "first_inference_ms": first_ms,
        "peak_rss_kb": int(peak),
        "rss_growth_kb": int(rss_loaded - rss_before),
        "timed_window_s": window_s,
        "runtime_version": rt.version(),
        "threads": args.threads,
        "state_before": state_before,
    }
    result.update(check.fields())
    result.update(power_fields(sensor, power, sampler.achieved_rate_hz if sampler is not None else None, idle_w,
                               missing))
    result["state_after"] = device_state()
    if args.profile_layers and args.profile_runs > 0:  # after the timed window: profiling never touches the
        # end-to-end figures
        try:
            result["profile"] = profile_runs(args.format, args.model, batches, args.threads, args.profile_warmup,
                                             args.profile_runs, args.profile_dir)
        except (OSError, RuntimeError, ValueError) as e:  # the timed result stands; the profile says what broke
            traceback.print_exc(file=sys.stderr)
            result["profile"] = {"available": False, "runs": [], "blocks": [],
                                 "reason": "the profiled runs failed: %s: %s" % (type(e).__name__,
                                                                                 " ".join(str(e).split())[:300])}
    return result


def profile_runs(fmt, model, batches, threads, warmup, runs, profile_dir=None):
    """Load ``model`` with its runtime's profiler on, run ``warmup`` then ``runs`` batches (cycling), and collect
    the per-operator events. Files go to ``profile_dir`` (a temporary directory, removed, when None)."""
    import tempfile

    rt = RUNTIMES[fmt]()
    own = profile_dir is None
    where = tempfile.mkdtemp(prefix="edgemask-profile-") if own else profile_dir
    try:
        try:
            rt.load(model, threads, profile_dir=where)
        except ProfilerMissing as e:
            return {"available": False, "reason": str(e), "runs": [], "blocks": []}
        for k in range(warmup):
            rt.run(batches[k % len(batches)])
        e2e = []
        for k in range(runs):
            t0 = time.perf_counter()
            rt.run(batches[k % len(batches)])
            e2e.append(_ms(t0, time.perf_counter()))
        try:
            res = rt.collect_profile(warmup, e2e, where)
            if own and res.get("etdump"):
                res["etdump"] = None  # written into the temporary directory: pass --profile-dir to keep it
            return res
        except ProfilerMissing as e:
            return {"available": False, "reason": str(e), "runs": [{"end_to_end_ms": ms, "ops": []} for ms in e2e],
                    "blocks": []}
    finally:
        if own:
            shutil.rmtree(where, ignore_errors=True)
