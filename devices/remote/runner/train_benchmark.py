"""A training job (formats ``pte-train``, ``torch-train``; issue #39): a client's local step timed on the board.

Load the step's program, take ONE step from the file's state on train_io.npz's minibatch and hold the loss and
the updated tensors to the host's (``reference.StepCheck``: a board never reports the speed of a step that
computes something else), then go on from there: warm up (--warmup-runs / --warmup-seconds), time steps as the
latency samples (--min-runs / --min-seconds; each sample ONE step: forward, backward and the SGD update) while
sampling power, then time --train-rounds whole local rounds of --round-steps steps back to back (the round the
client runs between two server rounds, on the same minibatch). With --profile-layers, --profile-warmup then
--profile-runs more steps run under the runtime's profiler after all of that (a profiler inflates a step: never one
of the timed ones), each as a profiled run of per-operator entries (``training.torch_step_ops``; pte-train: not
available, and why). The JSON has devices.records.Measurement's fields (``inferences_per_sample`` 1: a sample is a
step) and ``training``."""

import time

from .errors import ProfilerMissing, RunFailed
from .reference import StepCheck, read_train_io
from .sensors import PowerSampler, find_sensor, idle_power_w, power_fields
from .state import device_state, rss_kb
from .system import sha256_file
from .training import TRAINING_RUNTIMES


def _ms(t0, t1):
    return (t1 - t0) * 1000.0




# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3


def keep_freed_memory(mode):
    """``--train-malloc``: with "keep", glibc keeps what the process frees (no trim, no mmap for large blocks, 256
    MiB of top pad), so a step does not fault its working set back in; says what it did."""
    if mode != "keep":
        return "glibc defaults (--train-malloc release)"
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = (libc.mallopt(M_TRIM_THRESHOLD, 2 ** 31 - 1) and libc.mallopt(M_MMAP_THRESHOLD, 1 << 30)
              and libc.mallopt(M_TOP_PAD, 1 << 28))
    except (OSError, AttributeError):
        return "allocator defaults (no glibc mallopt here)"
    return "glibc: freed memory kept (mallopt)" if ok else "glibc defaults (mallopt refused)"


def benchmark_training(args):
    if not args.train_io:
        raise RunFailed("format %s needs --train-io (the artifact's train_io.npz)" % args.format)
    if args.round_steps < 1 or args.train_rounds < 0:
        raise RunFailed("--round-steps must be >= 1 and --train-rounds >= 0")
    state_before = device_state()
    try:
        rt = TRAINING_RUNTIMES[args.format]()
    except ImportError as e:
        raise RunFailed("runtime for format %s is not installed on this device: %s" % (args.format, e))

    allocator = keep_freed_memory(args.train_malloc)
    io = read_train_io(args.train_io)
    io_sha = sha256_file(args.train_io)

    rss_before, _ = rss_kb()
    t0 = time.perf_counter()
    rt.load(args.model, args.threads, io["lr"], io["momentum"])
    load_ms = _ms(t0, time.perf_counter())
    rss_loaded, _ = rss_kb()
    x, y = rt.tensors(io["x"], io["y"])

    # ONE step from the file's state against the host's, before anything is timed
    t0 = time.perf_counter()
    loss = rt.step(x, y)
    first_ms = _ms(t0, time.perf_counter())
    check = StepCheck(io, args.tolerance, args.rtol)
    check.check(rt.loss_value(loss), rt.trained)
    failed = check.failure()
    if failed:
        return failed

    sensor, missing = find_sensor(args.power_sensor)
    idle_w = idle_power_w(sensor, args.idle_seconds, args.power_rate_hz)

    # the steps go on from the checked state, as a client's round does
    k = 0
    t_end = time.perf_counter() + args.warmup_seconds
    while k < args.warmup_runs or time.perf_counter() < t_end:
        rt.step(x, y)
        k += 1

    step = rt.step
    sampler = PowerSampler(sensor, args.power_rate_hz) if sensor is not None else None
    if sampler is not None:
        sampler.start()
    latencies = []
    clock = time.perf_counter
    w0 = clock()
    t_end = w0 + args.min_seconds
    while len(latencies) < args.min_runs or clock() < t_end:
        t0 = clock()
        step(x, y)
        latencies.append(_ms(t0, clock()))
    window_s = clock() - w0
    power = sampler.stop() if sampler is not None else []

    round_ms = []
    for _ in range(args.train_rounds):
        t0 = clock()
        for _ in range(args.round_steps):
            step(x, y)
        round_ms.append(_ms(t0, clock()))

    _, peak = rss_kb()
    result = {
        "ok": True,
        "latency_ms": latencies,
        "inferences_per_sample": 1,
        "load_ms": load_ms,
        "first_inference_ms": first_ms,
        "peak_rss_kb": int(peak),
        "rss_growth_kb": int(rss_loaded - rss_before),
        "timed_window_s": window_s,
        "runtime_version": rt.version(),
        "threads": args.threads,
        "state_before": state_before,
        "output_max_abs_diff": check.max_diff,
        "output_check_passed": True,
        "samples_checked": int(io["x"].shape[0]),
        "accuracy": None,
        "training": {"batch_size": int(io["x"].shape[0]), "steps_per_round": args.round_steps,
                     "round_ms": round_ms, "check_max_abs_diff": check.max_diff, "train_io_sha256": io_sha,
                     "loss": rt.loss_value(loss), "allocator": allocator},
    }
    result.update(power_fields(sensor, power, sampler.achieved_rate_hz if sampler is not None else None, idle_w,
                               missing))
    result["state_after"] = device_state()
    if args.profile_layers and args.profile_runs > 0:  # after the timed steps and rounds: never in their figures
        try:
            result["profile"] = rt.profile_steps(x, y, args.profile_warmup, args.profile_runs)
        except ProfilerMissing as e:
            result["profile"] = {"available": False, "runs": [], "blocks": [], "reason": str(e)}
        except (OSError, RuntimeError, ValueError) as e:  # the timed result stands; the profile says what broke
            result["profile"] = {"available": False, "runs": [], "blocks": [],
                                 "reason": "the profiled steps failed: %s: %s" % (type(e).__name__,
                                                                                  " ".join(str(e).split())[:300])}
    return result
