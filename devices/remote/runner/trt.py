"""TensorRT (format "trt", Jetson boards): trtexec found and run, the engine built on the board and cached there by
(ONNX sha256, TensorRT version, build flags) with one timing cache per board (the next client's build reuses the
tactic timings of the layers it shares), and the runtime entry for --probe. Engines are not portable across GPUs,
so they are built on the board."""

import json
import os
import shutil
import subprocess
import sys
import time

from .errors import RunFailed
from .sensors import Ina3221Sensor, ina3221_rails
from .system import sha256_file, sysfs_root
from .trt_files import parse_engine_build_s, parse_trtexec_version

TRTEXEC_DEFAULT = "/usr/src/tensorrt/bin/trtexec"  # JetPack 4.6.x; not on PATH
TRT_BUILD_FLAGS = ("--fp16",)  # Pascal (TX2) has no fast INT8: FP16 is its fast mode
# An FP16 engine cannot meet the fp32 rule |y - y_ref| <= atol + rtol*|y_ref|: FP16 keeps 11 significant bits
# (2^-11 = 4.9e-4 per rounding) and a few layers' roundings stay within 1 % of the tensor's scale, not of each
# element (an element near zero, where large terms cancel, errs as much as its neighbours). So its check raises the
# rule's atol to this share of the largest |y_ref| of sample_io (never lowers it) and keeps the rule's rtol.
TRT_FP16_ATOL_SHARE = 1e-2
GPU_RAIL_NAMES = ("VDD_SYS_GPU", "GPU", "VDD_GPU_SOC", "VDD_GPU")  # TX1/TX2, Xavier, Orin


# trtexec given by the host (--trtexec), for --probe too
TRTEXEC = [None]


def find_trtexec(given=None):
    """The trtexec to use: ``given`` (the inventory's `trtexec`), else JetPack's path, else PATH; None if none."""
    for path in (given, TRTEXEC_DEFAULT):
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return shutil.which("trtexec")


def _die_with_parent():
    """In the child before exec: SIGKILL it when the runner dies (Linux prctl PR_SET_PDEATHSIG), so a trtexec
    never goes on using the GPU after its runner left with its session (the watchdog's os._exit)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    except Exception:  # not Linux: the host's timeout still ends the session
        pass


def run_trtexec(argv, timeout=7200, on_line=None):
    """Run trtexec; return (rc, stdout). ``on_line(line)`` sees each stdout line as it comes."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                         preexec_fn=_die_with_parent)
    lines = []
    deadline = time.monotonic() + timeout
    for line in p.stdout:
        lines.append(line)
        sys.stderr.write(line)  # trtexec's log goes with the runner's stderr, never its JSON
        if on_line is not None:
            on_line(line)
        if time.monotonic() > deadline:
            p.kill()
            break
    p.stdout.close()
    rc = p.wait()
    return rc, "".join(lines)


def log_tail(stdout, n=3):
    lines = [l.strip() for l in stdout.splitlines() if l.strip()]
    return " | ".join(lines[-n:])[-400:]


def trtexec_version(trtexec):
    rc, out = run_trtexec([trtexec, "--help"], timeout=120)
    return parse_trtexec_version(out)


def engine_key(onnx_sha256, trt_version, flags):
    """The engine cache's key: an engine is reused only for the same ONNX bytes, TensorRT and build flags."""
    import hashlib

    return hashlib.sha256(("%s|%s|%s" % (onnx_sha256, trt_version, " ".join(flags))).encode()).hexdigest()[:24]


def ensure_engine(trtexec, version, model, engine_dir, flags=TRT_BUILD_FLAGS):
    """Build ``model``'s engine unless the cache holds it; returns the build record
    {"engine", "key", "cached", "build_s", "trtexec_build_s", "flags", "tensorrt", "timing_cache",
    "timing_cache_bytes_before"}. The engine is written under a temporary name and renamed."""
    if not os.path.isdir(engine_dir):
        os.makedirs(engine_dir)
    onnx_sha = sha256_file(model)
    key = engine_key(onnx_sha, version, flags)
    engine = os.path.join(engine_dir, key + ".engine")
    meta_path = os.path.join(engine_dir, key + ".json")
    cache = os.path.join(engine_dir, "timing.cache")  # one per board
    if os.path.isfile(engine) and os.path.isfile(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
        meta["cached"] = True
        return meta
    before = os.path.getsize(cache) if os.path.isfile(cache) else 0
    tmp = "%s.%d.part" % (engine, os.getpid())
    argv = [trtexec, "--onnx=" + model, "--saveEngine=" + tmp, "--timingCacheFile=" + cache, "--buildOnly"]
    argv += list(flags)
    t0 = time.perf_counter()
    rc, out = run_trtexec(argv)
    build_s = time.perf_counter() - t0
    if rc != 0 or not os.path.isfile(tmp):
        if os.path.exists(tmp):
            os.remove(tmp)
        raise RunFailed("trtexec could not build an engine from %s (rc=%d): %s" % (model, rc, log_tail(out)))
    os.rename(tmp, engine)
    meta = {"engine": engine, "key": key, "onnx_sha256": onnx_sha, "tensorrt": version, "flags": list(flags),
            "build_s": build_s, "trtexec_build_s": parse_engine_build_s(out), "timing_cache": cache,
            "timing_cache_bytes_before": before}
    with open(meta_path + ".part", "w") as f:
        json.dump(meta, f)
    os.rename(meta_path + ".part", meta_path)
    meta["cached"] = False
    return meta


def gpu_rail_sensor(root=None):
    rails = ina3221_rails(sysfs_root() if root is None else root)
    for rail in GPU_RAIL_NAMES:
        if rail in rails:
            return Ina3221Sensor(rail, rails[rail])
    return None


class TensorRtRuntime(object):
    """Format "trt": its jobs go through benchmark_trt (trtexec drives the GPU); this entry gives the runtime's
    name and version for --probe and the runtime registry."""

    runtime = "tensorrt"

    @staticmethod
    def installed_version():
        trtexec = find_trtexec(TRTEXEC[0])
        if trtexec is None:
            raise ImportError("no trtexec at %s or on PATH" % (TRTEXEC[0] or TRTEXEC_DEFAULT))
        version = trtexec_version(trtexec)
        if version is None:
            raise ImportError("%s printed no TensorRT version" % trtexec)
        return "tensorrt " + version


def probe_tensorrt():
    """TensorRT on this board: trtexec's path and version, the Python bindings' version, and which GPU
    execution providers this board's onnxruntime offers (a CPU-only wheel offers none)."""
    out = {"trtexec": find_trtexec(TRTEXEC[0]), "trtexec_version": None, "python_tensorrt": None,
           "onnxruntime_providers": None, "onnxruntime_gpu_providers": []}
    if out["trtexec"]:
        out["trtexec_version"] = trtexec_version(out["trtexec"])
    try:
        import tensorrt
        out["python_tensorrt"] = tensorrt.__version__
    except ImportError as e:
        out["python_tensorrt_error"] = str(e).splitlines()[0] if str(e) else "ImportError"
    try:
        import onnxruntime
        providers = list(onnxruntime.get_available_providers())
        out["onnxruntime_providers"] = providers
        out["onnxruntime_gpu_providers"] = [p for p in providers
                                            if p in ("CUDAExecutionProvider", "TensorrtExecutionProvider")]
    except ImportError:
        pass
    return out
