"""--probe: what this device offers (platform, Python, numpy and runtime versions and sizes, disk and memory, power
sensors, state, TensorRT)."""

import os
import platform
import re
import sys

from .parsers import parse_meminfo_kb
from .runtimes import RUNTIMES
from .sensors import SENSOR_ORDER, find_sensor
from .state import device_state
from .system import read_text, runner_file
from .trt import TRTEXEC, find_trtexec, probe_tensorrt


# The distributions behind each runtime (the first installed one counts), for the installed size in --probe
RUNTIME_DISTS = (("onnxruntime", ("onnxruntime", "onnxruntime-gpu")), ("tflite", ("tflite-runtime", "ai-edge-litert")),
                 ("executorch", ("executorch",)), ("torch", ("torch",)))
# What a runtime imports without declaring it: executorch 1.5.1's Python runtime imports torch (1.4.1 declared it)
RUNTIME_IMPORTS = {"executorch": ("torch",)}


def _dist_key(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_sizes_mb():
    """Disk taken by each runtime with everything it needs installed: the runtime's distribution and, following
    its declared requirements (extras left out), every installed distribution it pulls in (torch and, for a CUDA
    build of torch, the nvidia-* wheels under ExecuTorch). {"onnxruntime": {"mb", "dists"}, ..., "all": {"mb"}}
    ("all": the union, each file once). Python < 3.8 has no importlib.metadata: {"error": why}."""
    try:
        from importlib import metadata  # novermin (guarded: Python 3.6 gets the error below)
    except ImportError:
        return {"error": "Python %s has no importlib.metadata (needs 3.8+)" % platform.python_version()}
    dists = {}
    for d in metadata.distributions():
        name = d.metadata["Name"]
        if name:
            dists.setdefault(_dist_key(name), d)
    sizes = {}

    def size(key):
        if key not in sizes:
            total = 0
            for f in dists[key].files or []:
                try:
                    total += os.path.getsize(str(dists[key].locate_file(f)))
                except OSError:
                    pass
            sizes[key] = total
        return sizes[key]

    def closure(root):
        seen, todo = set(), [root]
        while todo:
            key = todo.pop()
            if key in seen or key not in dists:
                continue
            seen.add(key)
            for req in dists[key].requires or []:
                if "extra ==" in req.replace("extra==", "extra =="):
                    continue
                m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9_.-]*)", req)
                if m:
                    todo.append(_dist_key(m.group(1)))
        return seen

    out, union = {}, set()
    for rt, names in RUNTIME_DISTS:
        root = next((_dist_key(n) for n in names if _dist_key(n) in dists), None)
        if root is None:
            continue
        keys = closure(root)
        for extra in RUNTIME_IMPORTS.get(rt, ()):
            keys |= closure(_dist_key(extra))
        union |= keys
        out[rt] = {"mb": round(sum(size(k) for k in keys) / 1e6, 1), "dists": sorted(keys)}
    if out:
        out["all"] = {"mb": round(sum(size(k) for k in union) / 1e6, 1), "dists": len(union)}
    return out


def probe():
    """What this device offers: platform, Python, numpy and runtime versions, free disk/mem, sensors, state."""
    info = {"ok": True, "arch": platform.machine(), "os": platform.platform(), "python": platform.python_version(),
            "python_executable": sys.executable, "runtimes": {}}
    try:
        import numpy
        info["numpy"] = numpy.__version__
    except ImportError as e:
        info["numpy"] = None
        info["numpy_error"] = str(e)
    for fmt, cls in sorted(RUNTIMES.items()):
        if fmt == "trt" and find_trtexec(TRTEXEC[0]) is None:
            continue  # no TensorRT here (the board's "tensorrt" section says where it looked)
        if getattr(cls, "training", False):
            continue  # below: a training format needs more of its runtime than inference does
        try:
            info["runtimes"][cls.runtime] = cls.installed_version()
        except ImportError as e:
            info["runtimes"][cls.runtime] = None
            info.setdefault("runtime_errors", {})[cls.runtime] = str(e).splitlines()[0] if str(e) else "ImportError"
    # the training formats (a client's local step): each one's runtime as it takes a step (ExecuTorch's training
    # extension, torch >= 2.1 with torch.export), and torch among the runtimes
    info["training_runtimes"] = {}
    for fmt, cls in sorted(RUNTIMES.items()):
        if not getattr(cls, "training", False):
            continue
        try:
            version = cls.installed_version()
        except ImportError as e:
            version = None
            info.setdefault("training_errors", {})[fmt] = str(e).splitlines()[0] if str(e) else "ImportError"
        info["training_runtimes"][fmt] = version
        if cls.runtime not in info["runtimes"]:  # torch: a runtime of its own
            info["runtimes"][cls.runtime] = version
            if version is None:
                info.setdefault("runtime_errors", {})[cls.runtime] = info["training_errors"][fmt]
    here = os.path.dirname(runner_file())
    st = os.statvfs(here)
    info["disk_free_mb"] = st.f_bavail * st.f_frsize // (1 << 20)
    mem = read_text("/proc/meminfo", "")
    avail = parse_meminfo_kb(mem, "MemAvailable")
    total = parse_meminfo_kb(mem, "MemTotal")
    info["mem_available_mb"] = avail // 1024 if avail is not None else None
    info["mem_total_mb"] = total // 1024 if total is not None else None
    sensors = {}
    for name in SENSOR_ORDER:
        s, why = find_sensor(name)
        sensors[name] = s.source if s is not None else None
        if s is None:
            sensors[name + "_missing"] = why
    info["power_sensors"] = sensors
    info["state"] = device_state()
    info["tensorrt"] = probe_tensorrt()
    info["installed_mb"] = installed_sizes_mb()
    return info
