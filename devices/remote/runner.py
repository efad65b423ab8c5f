#!/usr/bin/env python3
"""edgemask remote runner: load one model, check it against sample_io.npz, time it, print one JSON document.

This file is copied to the device and run with the device's own Python, so it must stay self-contained:
standard library + numpy + the one runtime it uses (onnxruntime, ExecuTorch's runtime or a TFLite interpreter),
and valid on Python 3.6 (Jetson TX2, JetPack 4.6). `vermin -t=3.6- devices/remote/runner.py` checks that.

    python3 runner.py --model FILE --format onnx|pte|tflite --sample-io FILE [settings] [--power-sensor NAME]
    python3 runner.py --probe
    python3 runner.py --strays [--lock FILE --token T]   # kill runners of this workdir left by an earlier session
    python3 runner.py --hold-lock FILE --holder JSON --watch-stdin   # hold the board for one campaign
    python3 runner.py --set-governors '{"*": "performance"}'   # or {"cpu0": "ondemand", ...} to restore
    python3 runner.py --jetson-clocks store|apply|restore --state-file FILE

With ``--watch-stdin`` the runner exits as soon as its stdin reaches end-of-file or its parent process changes:
the host keeps stdin open for as long as it waits, so a runner whose session is gone (a timeout that closed the
SSH channel, a host killed) never goes on timing beside the next job.

Output on stdout is exactly one JSON object: {"ok": true, ...fields of devices.records.Measurement...} or
{"ok": false, "error": "one-line reason"}. Anything a runtime prints is sent to stderr instead.

The host imports this module too (devices.sensors) for the pure parsers; nothing runs on import.
"""

import argparse
import glob
import json
import math
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
import traceback

SYSFS_ROOT_ENV = "EDGEMASK_SYSFS_ROOT"


def sysfs_root():
    """Prefix for every /sys and /proc path read here, so tests can point at a fake tree."""
    return os.environ.get(SYSFS_ROOT_ENV, "/")


def _p(root, path):
    return os.path.join(root, path.lstrip("/"))


def _read(path, default=None):
    try:
        with open(path) as f:
            return f.read().strip()
    except (IOError, OSError):
        return default


def _read_number(path):
    text = _read(path)
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------------
# Power sensors. Each class: discover(root) -> sensor or raises SensorMissing(reason); sample() -> watts.
# ------------------------------------------------------------------------------------------------


class SensorMissing(Exception):
    """No sensor of this kind on this device; the message says why."""


# The rail that carries the whole board's input power: already the total, so rails are never summed.
INPUT_RAIL_NAMES = ("VDD_IN", "POM_5V_IN", "VIN_SYS_5V0", "VDD_5V_IN")

# INA3221 IIO directories: L4T 32 (JetPack 4.x) under the bus driver, L4T 28 (JetPack 3.x) under iio_device.
INA3221_DIR_PATTERNS = (
    "sys/bus/i2c/drivers/ina3221x/*/iio:device*",
    "sys/bus/i2c/drivers/ina3221x/*/iio_device",
    "sys/devices/*.i2c/i2c-*/*-004*/iio_device",
    "sys/devices/*.i2c/i2c-*/*-004*/iio:device*",
)


def ina3221_rails(root):
    """All INA3221 rails as {name: power file}, names read from rail_name_N at run time."""
    rails = {}
    seen = set()
    for pattern in INA3221_DIR_PATTERNS:
        for d in sorted(glob.glob(_p(root, pattern))):
            real = os.path.realpath(d)
            if real in seen:
                continue
            seen.add(real)
            for name_file in sorted(glob.glob(os.path.join(d, "rail_name_*"))):
                idx = name_file.rsplit("_", 1)[1]
                name = _read(name_file)
                power_file = os.path.join(d, "in_power%s_input" % idx)
                if name and os.path.exists(power_file):
                    rails[name] = power_file
    return rails


class Ina3221Sensor(object):
    """Jetson INA3221 (TX1/TX2/Nano/Xavier on L4T 28-32): the input rail in mW from sysfs."""

    name = "ina3221"

    def __init__(self, rail, path):
        self.rail = rail
        self.path = path
        self.source = "ina3221:%s" % rail

    @classmethod
    def discover(cls, root):
        rails = ina3221_rails(root)
        if not rails:
            raise SensorMissing("no INA3221 rails under %s" % _p(root, "sys/bus/i2c/drivers/ina3221x"))
        for rail in INPUT_RAIL_NAMES:
            if rail in rails:
                return cls(rail, rails[rail])
        raise SensorMissing(
            "INA3221 found but none of its rails is an input rail %s (rails: %s); rails are never summed"
            % (", ".join(INPUT_RAIL_NAMES), ", ".join(sorted(rails)))
        )

    def sample(self):
        mw = _read_number(self.path)
        return None if mw is None else mw / 1000.0


HWMON_POWER_CHIPS = ("ina219", "ina226", "ina2xx", "ina209", "ina230", "ina231", "ina260")


class HwmonSensor(object):
    """Linux hwmon power monitors (INA219/INA226 boards on a Raspberry Pi): power1_input in uW, else I x V."""

    name = "hwmon"

    def __init__(self, directory, chip):
        self.dir = directory
        self.chip = chip
        self.source = "hwmon:%s:%s" % (chip, os.path.basename(directory))
        self.power_file = os.path.join(directory, "power1_input")
        if not os.path.exists(self.power_file):
            self.power_file = None

    @classmethod
    def discover(cls, root):
        found = []
        for d in sorted(glob.glob(_p(root, "sys/class/hwmon/hwmon*"))):
            chip = _read(os.path.join(d, "name"), "")
            found.append(chip)
            if chip in HWMON_POWER_CHIPS:
                has_power = os.path.exists(os.path.join(d, "power1_input"))
                has_iv = os.path.exists(os.path.join(d, "curr1_input")) and os.path.exists(
                    os.path.join(d, "in1_input"))
                if has_power or has_iv:
                    return cls(d, chip)
        raise SensorMissing("no hwmon power chip (%s) among hwmon devices [%s]"
                            % ("/".join(HWMON_POWER_CHIPS), ", ".join(found)))

    def sample(self):
        if self.power_file is not None:
            uw = _read_number(self.power_file)
            return None if uw is None else uw / 1e6
        ma = _read_number(os.path.join(self.dir, "curr1_input"))  # mA
        mv = _read_number(os.path.join(self.dir, "in1_input"))  # bus voltage, mV
        if ma is None or mv is None:
            return None
        return ma * mv / 1e6


def rapl_delta_uj(e0, e1, max_range_uj):
    """Energy between two RAPL counter reads in uJ; the counter wraps to 0 after max_energy_range_uj."""
    if e1 >= e0:
        return e1 - e0
    return (max_range_uj - e0) + e1


class RaplSensor(object):
    """Intel RAPL package energy counter; power is the energy difference over the time between samples."""

    name = "rapl"

    def __init__(self, directory):
        self.dir = directory
        self.energy_file = os.path.join(directory, "energy_uj")
        self.max_range = _read_number(os.path.join(directory, "max_energy_range_uj")) or float(2 ** 32)
        self.source = "rapl:%s" % (_read(os.path.join(directory, "name")) or os.path.basename(directory))
        self._last = None
        self.clock = time.monotonic

    @classmethod
    def discover(cls, root):
        d = _p(root, "sys/class/powercap/intel-rapl:0")
        if not os.path.isdir(d):
            raise SensorMissing("no Intel RAPL domain at %s" % d)
        if _read_number(os.path.join(d, "energy_uj")) is None:
            raise SensorMissing("%s is not readable (RAPL energy needs root on Linux >= 5.10)"
                                % os.path.join(d, "energy_uj"))
        return cls(d)

    def sample(self):
        e = _read_number(self.energy_file)
        t = self.clock()
        if e is None:
            return None
        last, self._last = self._last, (t, e)
        if last is None or t <= last[0]:
            return None
        return rapl_delta_uj(last[1], e, self.max_range) / 1e6 / (t - last[0])


# One registry: name -> sensor class. "auto" tries them in this order.
SENSORS = {"ina3221": Ina3221Sensor, "hwmon": HwmonSensor, "rapl": RaplSensor}
SENSOR_ORDER = ("ina3221", "hwmon", "rapl")


def find_sensor(choice, root=None):
    """(sensor, None) or (None, reason). choice: a name in SENSORS, "auto" or "none"."""
    root = sysfs_root() if root is None else root
    if choice == "none":
        return None, "power sensor disabled for this device (power_sensor = \"none\")"
    if choice == "auto":
        names = SENSOR_ORDER
    elif choice in SENSORS:
        names = (choice,)
    else:
        return None, "unknown power sensor %r; valid: auto, none, %s" % (choice, ", ".join(sorted(SENSORS)))
    reasons = []
    for name in names:
        try:
            sensor = SENSORS[name].discover(root)
        except SensorMissing as e:
            reasons.append("%s: %s" % (name, e))
            continue
        return sensor, None
    return None, "no power sensor: " + "; ".join(reasons)


class PowerSampler(object):
    """Samples one sensor at a fixed rate in a background thread; keeps every sample."""

    def __init__(self, sensor, rate_hz):
        self.sensor = sensor
        self.period = 1.0 / rate_hz
        self.samples = []
        self._stop = threading.Event()
        self._thread = None
        self.started = None
        self.stopped = None

    def _loop(self):
        self.sensor.sample()  # prime differencing sensors (RAPL)
        nxt = time.monotonic() + self.period
        while not self._stop.is_set():
            delay = nxt - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                break
            w = self.sensor.sample()
            if w is not None:
                self.samples.append(w)
            nxt += self.period

    def start(self):
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="power-sampler")
        self._thread.daemon = True
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join()
        self.stopped = time.monotonic()
        return self.samples

    @property
    def achieved_rate_hz(self):
        span = (self.stopped or time.monotonic()) - self.started
        return len(self.samples) / span if span > 0 else float("nan")


# ------------------------------------------------------------------------------------------------
# Pure parsers (imported by the host as devices.sensors and tested there).
# ------------------------------------------------------------------------------------------------

_TEGRA_RAIL = re.compile(r"\b([A-Z][A-Z0-9_]*) (\d+)(?:mW)?/(\d+)(?:mW)?(?=\s|$)")
_TEGRA_TEMP = re.compile(r"\b([A-Za-z][A-Za-z0-9_]*)@(-?\d+(?:\.\d+)?)C\b")
_TEGRA_RAM = re.compile(r"\bRAM (\d+)/(\d+)MB")
_TEGRA_CPU = re.compile(r"\bCPU \[([^\]]*)\]")


def parse_tegrastats(line):
    """One tegrastats line -> {"ram_used_mb", "ram_total_mb", "cpus", "temps_c", "rails_mw", "input_power_w"}.

    rails_mw maps rail -> (current mW, average mW); input_power_w is the input rail's current value (the
    board's total), None when the line has no input rail. Works for L4T 28/32 ("VDD_IN 3712/3712") and
    L4T 34+ ("VDD_IN 3712mW/3712mW") lines.
    """
    out = {"ram_used_mb": None, "ram_total_mb": None, "cpus": [], "temps_c": {}, "rails_mw": {},
           "input_power_w": None}
    m = _TEGRA_RAM.search(line)
    if m:
        out["ram_used_mb"], out["ram_total_mb"] = int(m.group(1)), int(m.group(2))
    m = _TEGRA_CPU.search(line)
    if m:
        for core in m.group(1).split(","):
            core = core.strip()
            if core == "off":
                out["cpus"].append(None)
                continue
            cm = re.match(r"(\d+)%@(\d+)", core)
            if cm:
                out["cpus"].append({"load_pct": int(cm.group(1)), "freq_mhz": int(cm.group(2))})
    for name, temp in _TEGRA_TEMP.findall(line):
        out["temps_c"][name] = float(temp)
    for name, cur, avg in _TEGRA_RAIL.findall(line):
        if name in ("RAM", "SWAP", "IRAM"):
            continue
        out["rails_mw"][name] = (int(cur), int(avg))
    for rail in INPUT_RAIL_NAMES:
        if rail in out["rails_mw"]:
            out["input_power_w"] = out["rails_mw"][rail][0] / 1000.0
            break
    return out


THROTTLE_BITS = {
    0: "under_voltage", 1: "freq_capped", 2: "throttled", 3: "soft_temp_limit",
    16: "under_voltage_occurred", 17: "freq_capped_occurred", 18: "throttled_occurred",
    19: "soft_temp_limit_occurred",
}


def decode_throttled(text):
    """`vcgencmd get_throttled` output ("throttled=0x50005") -> {"raw": int, flag name: bool, ...}."""
    m = re.search(r"throttled=(0x[0-9a-fA-F]+|\d+)", text)
    if not m:
        raise ValueError("not a get_throttled answer: %r" % text)
    raw = int(m.group(1), 0)
    out = {"raw": raw}
    for bit, name in sorted(THROTTLE_BITS.items()):
        out[name] = bool(raw >> bit & 1)
    return out


def parse_nvpmodel(text):
    """`nvpmodel -q` output ("NV Power Mode: MAXN\\n0") -> {"mode": "MAXN", "id": 0}."""
    m = re.search(r"NV Power Mode:\s*(\S+)", text)
    ids = re.findall(r"^\s*(\d+)\s*$", text, re.M)
    return {"mode": m.group(1) if m else None, "id": int(ids[-1]) if ids else None}


def parse_meminfo_kb(text, key):
    m = re.search(r"^%s:\s+(\d+) kB" % re.escape(key), text, re.M)
    return int(m.group(1)) if m else None


# ------------------------------------------------------------------------------------------------
# Device state and memory
# ------------------------------------------------------------------------------------------------


def _cpu_index(path):
    m = re.search(r"cpu(\d+)", path)
    return int(m.group(1)) if m else -1


def _command(argv, timeout=5):
    if shutil.which(argv[0]) is None:
        return None
    try:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        out, _ = p.communicate(timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.strip() if p.returncode == 0 else None


def device_state(root=None):
    """Governor, clocks (kHz), temperatures (deg C), throttling flags and power mode, where the board has them."""
    root = sysfs_root() if root is None else root
    state = {"governors": {}, "cpu_khz": {}, "temps_c": {}}
    for d in sorted(glob.glob(_p(root, "sys/devices/system/cpu/cpu[0-9]*/cpufreq")), key=_cpu_index):
        cpu = "cpu%d" % _cpu_index(d)
        gov = _read(os.path.join(d, "scaling_governor"))
        if gov is not None:
            state["governors"][cpu] = gov
        khz = _read_number(os.path.join(d, "scaling_cur_freq"))
        if khz is not None:
            state["cpu_khz"][cpu] = int(khz)
    govs = sorted(set(state["governors"].values()))
    state["governor"] = govs[0] if len(govs) == 1 else (",".join(govs) or None)
    for d in sorted(glob.glob(_p(root, "sys/class/thermal/thermal_zone*"))):
        kind = _read(os.path.join(d, "type")) or os.path.basename(d)
        milli = _read_number(os.path.join(d, "temp"))
        if milli is not None:
            state["temps_c"][kind] = milli / 1000.0
    load = _read(_p(root, "proc/loadavg"))
    if load:
        state["loadavg_1m"] = float(load.split()[0])
    throttled = _command(["vcgencmd", "get_throttled"])
    if throttled:
        try:
            state["throttled"] = decode_throttled(throttled)
        except ValueError:
            state["throttled"] = {"unparsed": throttled}
    nvp = _command(["nvpmodel", "-q"])
    if nvp:
        state["nvpmodel"] = parse_nvpmodel(nvp)
    return state


def rss_kb():
    """(current RSS, peak RSS) of this process in kB."""
    text = _read("/proc/self/status", "")
    cur = parse_meminfo_kb(text, "VmRSS")
    peak = parse_meminfo_kb(text, "VmHWM")
    if peak is None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux
    return (cur if cur is not None else 0), peak


# ------------------------------------------------------------------------------------------------
# Runtimes: name -> class with load(path, threads), run(x) -> output array, version()
# ------------------------------------------------------------------------------------------------


def _has_module(name):
    import importlib.util
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


class OnnxRuntime(object):
    runtime = "onnxruntime"

    @staticmethod
    def installed_version():
        """Version string without loading a model, or raises ImportError."""
        import onnxruntime
        return "onnxruntime " + onnxruntime.__version__

    def __init__(self):
        import onnxruntime  # noqa: F401  (imported before the RSS baseline)
        self.ort = onnxruntime

    def version(self):
        return "onnxruntime " + self.ort.__version__

    def load(self, path, threads, profile_dir=None):
        opts = self.ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = self.ort.ExecutionMode.ORT_SEQUENTIAL
        if profile_dir is not None:
            opts.enable_profiling = True
            opts.profile_file_prefix = os.path.join(profile_dir, "onnxruntime_profile")
        self.sess = self.ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])
        self.input_name = self.sess.get_inputs()[0].name

    def run(self, x):
        return self.sess.run(None, {self.input_name: x})[0]

    def collect_profile(self, warmup, end_to_end_ms, profile_dir):
        return onnxruntime_profile(self.sess.end_profiling(), warmup, end_to_end_ms)


class ExecuTorchRuntime(object):
    runtime = "executorch"

    @staticmethod
    def installed_version():
        # Importing the runtime loads libtorch (seconds): look for the modules instead.
        for mod in ("executorch.runtime", "torch"):
            if not _has_module(mod):
                raise ImportError("no module named %r" % mod)
        return ExecuTorchRuntime.version(None)

    def __init__(self):
        import torch
        from executorch.runtime import Runtime
        self.torch = torch
        self.et = Runtime.get()

    def version(self):
        try:
            from executorch.version import __version__
        except ImportError:
            __version__ = "unknown"
        return "executorch " + __version__

    def load(self, path, threads, profile_dir=None):
        try:
            from executorch.extension.pybindings import portable_lib
            portable_lib._unsafe_reset_threadpool(threads)
        except (ImportError, AttributeError):
            pass
        if profile_dir is None:
            self.program = self.et.load_program(path)
        else:
            try:
                # no debug buffer: with one, the ETDump also logs every intermediate output, and a run that
                # fills it aborts the process (etdump_flatcc.cpp log_evalue assert, ExecuTorch 1.5.1)
                self.program = self.et.load_program(path, enable_etdump=True)
            except TypeError:
                raise ProfilerMissing("this executorch.runtime has no enable_etdump (ExecuTorch < 0.7)")
        self.method = self.program.load_method("forward")

    def run(self, x):
        out = self.method.execute([self.torch.from_numpy(x)])[0]
        return out.numpy()

    def collect_profile(self, warmup, end_to_end_ms, profile_dir):
        return executorch_profile(self.program, warmup, end_to_end_ms, profile_dir)


class TfliteRuntime(object):
    runtime = "tflite"

    @staticmethod
    def installed_version():
        for name in ("tflite_runtime", "ai_edge_litert"):
            if _has_module(name + ".interpreter"):
                mod = __import__(name)
                return "%s %s" % (name, getattr(mod, "__version__", "unknown"))
        raise ImportError("neither tflite_runtime nor ai_edge_litert is installed")

    def __init__(self):
        try:
            from tflite_runtime.interpreter import Interpreter
            import tflite_runtime as mod
        except ImportError:
            from ai_edge_litert.interpreter import Interpreter
            import ai_edge_litert as mod
        self.Interpreter = Interpreter
        self.mod = mod

    def version(self):
        return "%s %s" % (self.mod.__name__, getattr(self.mod, "__version__", "unknown"))

    def load(self, path, threads, profile_dir=None):
        if profile_dir is not None:
            raise ProfilerMissing(TFLITE_NO_PROFILER)
        self.interp = self.Interpreter(model_path=path, num_threads=threads)
        self.interp.allocate_tensors()
        self.inp = self.interp.get_input_details()[0]
        self.out = self.interp.get_output_details()[0]
        # an int8 file's input and output are integer tensors: q = round(x / s) + z in, (q - z) * s out
        self.quantized = _is_quantized(self.inp) or _is_quantized(self.out)

    def run(self, x):
        if self.quantized:
            x = _tflite_quantize(x, self.inp)
        self.interp.set_tensor(self.inp["index"], x)
        self.interp.invoke()
        y = self.interp.get_tensor(self.out["index"])
        return _tflite_dequantize(y, self.out) if self.quantized else y


def _is_quantized(detail):
    import numpy as np

    return np.dtype(detail["dtype"]).kind != "f" and detail["quantization"][0] != 0


def _tflite_quantize(x, detail):
    import numpy as np

    if not _is_quantized(detail):
        return x.astype(detail["dtype"])
    scale, zero = detail["quantization"]
    info = np.iinfo(detail["dtype"])
    return np.clip(np.round(x / scale) + zero, info.min, info.max).astype(detail["dtype"])


def _tflite_dequantize(q, detail):
    import numpy as np

    if not _is_quantized(detail):
        return q
    scale, zero = detail["quantization"]
    return ((q.astype(np.float32) - zero) * scale).astype(np.float32)


RUNTIMES = {"onnx": OnnxRuntime, "pte": ExecuTorchRuntime, "tflite": TfliteRuntime}  # "trt" added below


# ------------------------------------------------------------------------------------------------
# Dying with the session; stray runners
# ------------------------------------------------------------------------------------------------

WATCHDOG_EXIT = 75  # rc of a runner that left because its session went away


def start_watchdog(period=0.5):
    """Exit (the whole process, at once) when stdin reaches EOF or the parent process changes.

    sshd closes the command's stdin when the channel closes (the host timed out, was killed or lost the
    link); a local host's pipe closes when the host dies. Either way nobody waits for this result any more.
    """
    import select

    parent = os.getppid()

    def watch():
        while True:
            try:
                ready = select.select([0], [], [], period)[0]
                if ready and not os.read(0, 4096):
                    break
            except (OSError, ValueError):
                break
            if os.getppid() != parent:
                break
        os._exit(WATCHDOG_EXIT)

    t = threading.Thread(target=watch, name="session-watchdog")
    t.daemon = True
    t.start()


def _proc_argv(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except (IOError, OSError):
        return None


def _proc_uid(pid):
    try:
        return os.stat("/proc/%d" % pid).st_uid
    except OSError:
        return None


def _proc_age_s(pid):
    """Seconds since the process started (from /proc/PID/stat and /proc/uptime); None if unknown."""
    stat = _read("/proc/%d/stat" % pid)
    uptime = _read_number_first("/proc/uptime")
    if stat is None or uptime is None:
        return None
    try:
        start_ticks = float(stat.rsplit(")", 1)[1].split()[19])
        return round(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 1)
    except (IndexError, ValueError, OSError):
        return None


def _read_number_first(path):
    text = _read(path)
    try:
        return float(text.split()[0]) if text else None
    except ValueError:
        return None


def is_our_runner(argv, blobs_dir):
    """True for `PYTHON <blobs_dir>/<sha>.py ... --model ...`: a benchmark run of a runner deployed here."""
    if not argv or "--model" not in argv:
        return False
    for arg in argv[1:3]:  # the script comes right after the interpreter (or after one interpreter option)
        if arg.endswith(".py") and os.path.dirname(os.path.realpath(arg)) == blobs_dir:
            return True
    return False


def find_strays(blobs_dir=None, kill=True, grace_s=2.0):
    """Benchmark runners of this workdir (same user, a runner deployed in ``blobs_dir``) other than this process
    and its ancestors; killed with SIGTERM, then SIGKILL after ``grace_s``. Returns [{"pid", "age_s", "argv",
    "killed"}]. Nothing else is touched: another user's process, another workdir's, a probe, a shell."""
    import signal

    blobs_dir = os.path.realpath(blobs_dir or os.path.dirname(os.path.abspath(__file__)))
    mine = set()
    pid = os.getpid()
    while pid > 1 and pid not in mine:
        mine.add(pid)
        stat = _read("/proc/%d/stat" % pid)
        try:
            pid = int(stat.rsplit(")", 1)[1].split()[1]) if stat else 1
        except (IndexError, ValueError):
            break
    uid = os.getuid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        pid = int(entry)
        argv = _proc_argv(pid)
        if argv is None or _proc_uid(pid) != uid or not is_our_runner(argv, blobs_dir):
            continue
        found.append({"pid": pid, "age_s": _proc_age_s(pid), "argv": " ".join(argv)[:300], "killed": False})
    if kill:
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, grace_s)):
            alive = [p for p in found if not p["killed"]]
            for p in alive:
                try:
                    os.kill(p["pid"], sig)
                except OSError:
                    p["killed"] = True  # gone already
            deadline = time.monotonic() + wait
            while alive and time.monotonic() < deadline:
                for p in alive:
                    if not os.path.exists("/proc/%d" % p["pid"]) or _proc_state(p["pid"]) == "Z":
                        p["killed"] = True
                alive = [p for p in alive if not p["killed"]]
                if alive:
                    time.sleep(0.05)
    return found


def read_lock_holder(path):
    """The holder a board lock file names ({"host", "pid", "campaign", "since", "token", "lock_pid"}); {} when
    it names none (never taken, or being written this instant)."""
    try:
        with open(path) as f:
            doc = json.loads(f.read() or "{}")
    except (IOError, OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def take_lock(path, holder):
    """Try to take the board lock ``path`` (flock, exclusive, not waiting).

    Returns (result, fd): ({"ok": true, "holder": ...}, fd) when taken, the holder written into the file (with
    this process's pid as "lock_pid") so that a refused campaign can name it; ({"ok": false, "busy": true,
    "holder": {...}}, None) when another process holds it. The kernel drops the lock when this process exits,
    however it exits, so a board is never left locked by a dead campaign."""
    import errno
    import fcntl

    folder = os.path.dirname(path)
    if folder and not os.path.isdir(folder):
        os.makedirs(folder)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (IOError, OSError) as e:
        os.close(fd)
        if e.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        return {"ok": False, "busy": True, "holder": read_lock_holder(path)}, None
    holder = dict(holder, lock_pid=os.getpid())
    data = json.dumps(holder, sort_keys=True).encode("utf-8")
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, 0)
    os.write(fd, data)
    os.fsync(fd)
    return {"ok": True, "holder": holder}, fd


def lock_held_by(path, token):
    """None when ``path`` is held (flocked) and names ``token``; else why not (no runner may be killed then)."""
    import errno
    import fcntl

    if not os.path.isfile(path):
        return "the board lock %s does not exist" % path
    fd = os.open(path, os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (IOError, OSError) as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
        else:
            return "nobody holds the board lock %s" % path
    finally:
        os.close(fd)  # releases it if this call took it
    holder = read_lock_holder(path)
    if holder.get("token") != token:
        return "the board lock %s is held by campaign %r of %s pid %s, not by the caller" % (
            path, holder.get("campaign"), holder.get("host"), holder.get("pid"))
    return None


def _proc_state(pid):
    stat = _read("/proc/%d/stat" % pid)
    try:
        return stat.rsplit(")", 1)[1].split()[0] if stat else None
    except IndexError:
        return None


# ------------------------------------------------------------------------------------------------
# Board settings: CPU governor and jetson_clocks (root, or `sudo -n` where allowed)
# ------------------------------------------------------------------------------------------------

GOVERNOR_SUDOERS = "/usr/bin/tee /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor"


def _cpufreq_dirs(root):
    return sorted(glob.glob(_p(root, "sys/devices/system/cpu/cpu[0-9]*/cpufreq")), key=_cpu_index)


def read_governors(root=None):
    """{"cpu0": "ondemand", ...} for every CPU with cpufreq."""
    root = sysfs_root() if root is None else root
    out = {}
    for d in _cpufreq_dirs(root):
        gov = _read(os.path.join(d, "scaling_governor"))
        if gov is not None:
            out["cpu%d" % _cpu_index(d)] = gov
    return out


def _sudo_write(path, text):
    """Write ``text`` to ``path`` with `sudo -n tee`; None if done, else why not."""
    if shutil.which("sudo") is None:
        return "not root and no sudo on the device"
    try:
        p = subprocess.Popen(["sudo", "-n", "tee", path], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, universal_newlines=True)
        _, err = p.communicate(text, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return "sudo -n tee failed: %s" % e
    return None if p.returncode == 0 else "sudo -n refused: %s" % " ".join(err.split())[:200]


def set_governors(wanted, root=None):
    """Set each CPU's governor: ``wanted`` maps "cpuN" (or "*" for every CPU) to a governor name.

    Returns {"ok", "before", "after", "denied": [{"path", "why"}], "error"}; "after" is read back from sysfs,
    so it is the state actually set, whatever was asked."""
    root = sysfs_root() if root is None else root
    before = read_governors(root)
    denied = []
    errors = []
    for d in _cpufreq_dirs(root):
        cpu = "cpu%d" % _cpu_index(d)
        gov = wanted.get(cpu, wanted.get("*"))
        if gov is None or before.get(cpu) == gov:
            continue
        available = (_read(os.path.join(d, "scaling_available_governors")) or "").split()
        if available and gov not in available:
            errors.append("%s has no governor %s (available: %s)" % (cpu, gov, " ".join(available)))
            continue
        path = os.path.join(d, "scaling_governor")
        try:
            with open(path, "w") as f:
                f.write(gov + "\n")
        except (IOError, OSError) as e:
            why = str(e)
            if os.geteuid() != 0:
                why = _sudo_write(path, gov + "\n")
            if why is not None:
                denied.append({"path": path, "why": why})
    after = read_governors(root)
    out = {"ok": not denied and not errors, "before": before, "after": after, "denied": denied,
           "sudoers": GOVERNOR_SUDOERS}
    if errors or denied:
        out["error"] = "; ".join(errors + ["cannot write %s (%s)" % (d["path"], d["why"]) for d in denied[:1]])
    return out


def jetson_clocks(action, state_file):
    """`jetson_clocks --store FILE` / `jetson_clocks` / `jetson_clocks --restore FILE`, with `sudo -n` when not
    root. Returns {"ok", "show": `jetson_clocks --show` afterwards (the state actually set), "error"}."""
    if shutil.which("jetson_clocks") is None:
        return {"ok": False, "error": "no jetson_clocks on this device (not a Jetson, or not on PATH)"}
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    args = {"store": ["--store", state_file], "apply": [], "restore": ["--restore", state_file]}[action]
    try:
        p = subprocess.Popen(prefix + ["jetson_clocks"] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True)
        out, err = p.communicate(timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"ok": False, "error": "jetson_clocks %s failed: %s" % (action, e)}
    if p.returncode != 0:
        return {"ok": False, "error": "%s exited with %d: %s" % (" ".join(prefix + ["jetson_clocks"] + args),
                                                                   p.returncode, " ".join((err or out).split())[:300])}
    show = _command(prefix + ["jetson_clocks", "--show"], timeout=30)
    return {"ok": True, "show": show}


# ------------------------------------------------------------------------------------------------
# Per-operator profiling: profiled runs, separate from the timed ones (a profiler inflates latency).
# profile_runs(...) -> {"available": bool, "profiler", "reason" (when not available), "runs": [{"end_to_end_ms",
# "total_us" (the runtime's own time for the run), "ops": [[name, op type, microseconds, provider], ...]}],
# "blocks" (delegates that report as one block), "etdump" (ExecuTorch: its file on the board), "etdump_b64",
# "etdump_sha256", "etdump_bytes" (ExecuTorch: the ETDump itself, its ops filled in on the host)}.
# ------------------------------------------------------------------------------------------------

ETDUMP_MAX_BYTES = 16 * 1000 * 1000  # an ETDump larger than this stays on the board (JSON over SSH)
ORT_KERNEL_SUFFIX = "_kernel_time"
TFLITE_NO_PROFILER = ("the TFLite Python interpreter exposes no per-operator profiler (its op profiling is only "
                      "in the benchmark_model binary: --enable_op_profiling=true)")
ETDUMP_MISSING = ("this ExecuTorch runtime wrote no ETDump: it was built without its event tracer "
                  "(EXECUTORCH_ENABLE_EVENT_TRACER=OFF, as in the pip wheels); rebuild with it ON to profile layers")


class ProfilerMissing(Exception):
    """The runtime offers no per-operator profiler here; the message says why."""


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


# ------------------------------------------------------------------------------------------------
# TensorRT (format "trt", Jetson boards): the board builds an engine from the artifact's ONNX with trtexec and
# times it with trtexec. Engines are not portable across GPUs, so they are built on the board, cached there by
# (ONNX sha256, TensorRT version, build flags), with one timing cache per board (the next client's build reuses
# the tactic timings of the layers it shares). The parsers below read the files trtexec writes, in the formats
# of TensorRT 8.0.1 / 8.2.1's samples/common/sampleReporting.cpp (identical in both releases):
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
# ------------------------------------------------------------------------------------------------

TRTEXEC_DEFAULT = "/usr/src/tensorrt/bin/trtexec"  # JetPack 4.6.x; not on PATH
TRT_BUILD_FLAGS = ("--fp16",)  # Pascal (TX2) has no fast INT8: FP16 is its fast mode
# An FP16 engine cannot match fp32 outputs to 1e-5: its output check allows this fraction of the largest
# |reference output| (FP16 keeps 11 significant bits, 2^-11 = 4.9e-4 per rounding; a few layers' roundings
# stay within 1 %), and never less than the fp32 tolerance.
TRT_FP16_RELATIVE_TOLERANCE = 1e-2
GPU_RAIL_NAMES = ("VDD_SYS_GPU", "GPU", "VDD_GPU_SOC", "VDD_GPU")  # TX1/TX2, Xavier, Orin
_TRT_VERSION_CODE = re.compile(r"\[TensorRT v(\d+)\]")
_TRT_VERSION_LINE = re.compile(r"TensorRT version: (\d+(?:\.\d+)*)")
_TRT_BUILT = re.compile(r"Engine built in ([0-9.eE+-]+) sec")

# trtexec given by the host (--trtexec), for --probe too
TRTEXEC = [None]


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


def _run_trtexec(argv, timeout=7200, on_line=None):
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


def _tail(stdout, n=3):
    lines = [l.strip() for l in stdout.splitlines() if l.strip()]
    return " | ".join(lines[-n:])[-400:]


def trtexec_version(trtexec):
    rc, out = _run_trtexec([trtexec, "--help"], timeout=120)
    return parse_trtexec_version(out)


def _sha256(path):
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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
    onnx_sha = _sha256(model)
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
    rc, out = _run_trtexec(argv)
    build_s = time.perf_counter() - t0
    if rc != 0 or not os.path.isfile(tmp):
        if os.path.exists(tmp):
            os.remove(tmp)
        raise RunFailed("trtexec could not build an engine from %s (rc=%d): %s" % (model, rc, _tail(out)))
    os.rename(tmp, engine)
    meta = {"engine": engine, "key": key, "onnx_sha256": onnx_sha, "tensorrt": version, "flags": list(flags),
            "build_s": build_s, "trtexec_build_s": parse_engine_build_s(out), "timing_cache": cache,
            "timing_cache_bytes_before": before}
    with open(meta_path + ".part", "w") as f:
        json.dump(meta, f)
    os.rename(meta_path + ".part", meta_path)
    meta["cached"] = False
    return meta


def _gpu_rail_sensor(root=None):
    rails = ina3221_rails(sysfs_root() if root is None else root)
    for rail in GPU_RAIL_NAMES:
        if rail in rails:
            return Ina3221Sensor(rail, rails[rail])
    return None


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
    engine_dir = args.engine_dir or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                 "trt-engines")
    build = ensure_engine(trtexec, version, args.model, engine_dir)
    engine = build["engine"]

    with np.load(args.sample_io, allow_pickle=False) as npz:
        inputs = np.ascontiguousarray(npz["input"], dtype=np.float32)
        expected = np.asarray(npz["output"], dtype=np.float32)
        labels = npz["label"] if "label" in npz.files else None
    n = inputs.shape[0]
    tolerance = max(args.tolerance, TRT_FP16_RELATIVE_TOLERANCE * float(np.max(np.abs(expected))))
    work = tempfile.mkdtemp(prefix="edgemask-trt-")
    try:
        max_diff, correct = 0.0, 0
        first_ms = None
        for i in range(n):
            x = os.path.join(work, "input%d.bin" % i)
            inputs[i:i + 1].tofile(x)
            out_json = os.path.join(work, "output%d.json" % i)
            t0 = time.perf_counter()
            rc, out = _run_trtexec([trtexec, "--loadEngine=" + engine, "--loadInputs='%s':%s" % (args.input_name, x),
                                    "--exportOutput=" + out_json, "--iterations=1", "--warmUp=0", "--duration=0"],
                                   timeout=600)
            if first_ms is None:
                first_ms = _ms(t0, time.perf_counter())
            if rc != 0 or not os.path.isfile(out_json):
                raise RunFailed("trtexec could not run the engine of %s (rc=%d): %s" % (args.model, rc, _tail(out)))
            with open(out_json) as f:
                outputs = parse_trtexec_output(f.read())
            dims, values = list(outputs.values())[0]
            y = np.asarray(values, dtype=np.float32).reshape(1, -1)
            ref = expected[i].reshape(1, -1)
            if y.shape != ref.shape:
                raise RunFailed("engine output shape %s differs from sample_io output shape %s" % (y.shape, ref.shape))
            max_diff = max(max_diff, float(np.max(np.abs(y - ref))))
            if labels is not None and int(np.argmax(y)) == int(labels[i]):
                correct += 1
        if not max_diff <= tolerance:
            return {"ok": False, "output_max_abs_diff": max_diff if math.isfinite(max_diff) else None,
                    "error": "FP16 engine output differs from sample_io by %.3g > tolerance %.3g on %d samples"
                             % (max_diff, tolerance, n)}

        sensor, missing = find_sensor(args.power_sensor)
        idle_w = None
        if sensor is not None and args.idle_seconds > 0:
            idle = PowerSampler(sensor, args.power_rate_hz)
            idle.start()
            time.sleep(args.idle_seconds)
            idle_w = _mean(idle.stop())
        gpu_sensor = _gpu_rail_sensor() if sensor is not None and sensor.name == "ina3221" else None
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
        rc, out = _run_trtexec(argv, timeout=3600, on_line=on_line)
        power = [s.stop() for s in samplers if s._thread is not None]
        if rc != 0 or not os.path.isfile(times_json):
            raise RunFailed("trtexec could not time the engine (rc=%d): %s" % (rc, _tail(out)))
        with open(times_json) as f:
            queries = timed_queries(parse_trtexec_times(f.read()), warmup_ms)
        latencies = [float(q["latencyMs"]) for q in queries]
        result = {
            "ok": True, "latency_ms": latencies, "inferences_per_sample": 1, "load_ms": None,
            "first_inference_ms": first_ms, "peak_rss_kb": int(rss_kb()[1]), "rss_growth_kb": 0,
            "output_max_abs_diff": max_diff, "output_check_passed": True,
            "accuracy": correct / float(n) if labels is not None else None, "samples_checked": n,
            "timed_window_s": trace_window_s(queries), "runtime_version": "tensorrt " + version,
            "threads": args.threads, "state_before": state_before,
        }
        compute = sorted(float(q["computeMs"]) for q in queries)
        trt = {"trtexec": trtexec, "tensorrt": version, "output_tolerance": tolerance,
               "gpu_compute_ms_median": compute[len(compute) // 2] if compute else None}
        trt.update((k, v) for k, v in build.items() if k != "engine")
        if sensor is not None and power and power[0]:
            result.update({"power_source": sensor.source, "power_w": power[0],
                           "power_rate_hz": samplers[0].achieved_rate_hz, "idle_power_w": idle_w})
            if gpu_sensor is not None and len(power) > 1 and power[1]:
                trt.update(gpu_power_source=gpu_sensor.source, gpu_power_w_mean=_mean(power[1]),
                           gpu_power_samples=len(power[1]))
        else:
            result.update({"power_source": None, "power_w": [], "power_rate_hz": None, "idle_power_w": None,
                           "energy_missing_reason": missing or "sensor %s gave no samples" % sensor.source})
        result["state_after"] = device_state()
        result["state_after"]["tensorrt"] = trt
        if args.profile_runs > 0:  # after the timed window; a broken profile never loses the timed result
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
    rc, out = _run_trtexec(argv, timeout=3600)
    if rc != 0 or not os.path.isfile(prof):
        return {"available": False, "runs": [], "blocks": [],
                "reason": "trtexec --exportProfile failed (rc=%d): %s" % (rc, _tail(out))}
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


RUNTIMES["trt"] = TensorRtRuntime


# ------------------------------------------------------------------------------------------------
# The benchmark
# ------------------------------------------------------------------------------------------------


class RunFailed(Exception):
    """The model cannot be measured (bad output, missing runtime, unreadable file)."""


def _ms(t0, t1):
    return (t1 - t0) * 1000.0


def _mean(xs):
    return sum(xs) / len(xs) if xs else None


def inferences_per_sample(sample_min_ms, warm_ms):
    """How many back-to-back inferences one latency sample times: enough that a sample lasts at least
    ``sample_min_ms`` at the warm-up's mean latency ``warm_ms`` (pyperf's calibration of ``loops`` to its
    ``min_time``). 0 (the default) or a model slower than the target: 1, every sample one inference."""
    if not sample_min_ms > 0 or not warm_ms > 0:
        return 1
    return max(1, int(math.ceil(sample_min_ms / warm_ms)))


def benchmark(args):
    import numpy as np

    if args.format == "trt":
        return benchmark_trt(args)

    state_before = device_state()
    try:
        rt = RUNTIMES[args.format]()
    except ImportError as e:
        raise RunFailed("runtime for format %s is not installed on this device: %s" % (args.format, e))

    with np.load(args.sample_io, allow_pickle=False) as npz:
        for key in ("input", "output"):
            if key not in npz.files:
                raise RunFailed("%s has no array %r (has %s)" % (args.sample_io, key, ", ".join(npz.files)))
        inputs = np.ascontiguousarray(npz["input"], dtype=np.float32)  # (N, *input_shape[1:])
        expected = np.asarray(npz["output"], dtype=np.float32)  # (N, n_out)
        labels = npz["label"] if "label" in npz.files else None  # (N,)
    n = inputs.shape[0]
    if n == 0:
        raise RunFailed("%s holds no samples" % args.sample_io)
    batches = [inputs[i:i + 1] for i in range(n)]  # each (1, *input_shape[1:])

    rss_before, _ = rss_kb()
    t0 = time.perf_counter()
    rt.load(args.model, args.threads)
    load_ms = _ms(t0, time.perf_counter())
    rss_loaded, _ = rss_kb()

    t0 = time.perf_counter()
    first = rt.run(batches[0])
    first_ms = _ms(t0, time.perf_counter())

    # Check every sample, batch 1, against the host's reference outputs.
    max_diff = 0.0
    correct = 0
    for i in range(n):
        out = first if i == 0 else rt.run(batches[i])
        out = np.asarray(out, dtype=np.float32).reshape(1, -1)
        ref = expected[i].reshape(1, -1)
        if out.shape != ref.shape:
            raise RunFailed("output shape %s differs from sample_io output shape %s" % (out.shape, ref.shape))
        max_diff = max(max_diff, float(np.max(np.abs(out - ref))))
        if labels is not None and int(np.argmax(out)) == int(labels[i]):
            correct += 1
    if not max_diff <= args.tolerance:  # also catches NaN
        return {"ok": False, "output_max_abs_diff": max_diff if math.isfinite(max_diff) else None,
                "error": "output differs from sample_io by %.3g > tolerance %.3g on %d samples"
                         % (max_diff, args.tolerance, n)}
    accuracy = correct / float(n) if labels is not None else None

    sensor, missing = find_sensor(args.power_sensor)
    idle_w = None
    if sensor is not None and args.idle_seconds > 0:
        idle = PowerSampler(sensor, args.power_rate_hz)
        idle.start()
        time.sleep(args.idle_seconds)
        idle_w = _mean(idle.stop())

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
        "output_max_abs_diff": max_diff,
        "output_check_passed": True,
        "accuracy": accuracy,
        "samples_checked": n,
        "timed_window_s": window_s,
        "runtime_version": rt.version(),
        "threads": args.threads,
        "state_before": state_before,
    }
    if sensor is not None and power:
        result.update({"power_source": sensor.source, "power_w": power,
                       "power_rate_hz": sampler.achieved_rate_hz, "idle_power_w": idle_w})
    else:
        result.update({"power_source": None, "power_w": [], "power_rate_hz": None, "idle_power_w": None,
                       "energy_missing_reason": missing or "sensor %s gave no samples" % sensor.source})
    result["state_after"] = device_state()
    if args.profile_runs > 0:  # after the timed window: profiling never touches the end-to-end figures
        try:
            result["profile"] = profile_runs(args.format, args.model, batches, args.threads, args.profile_warmup,
                                             args.profile_runs, args.profile_dir)
        except (OSError, RuntimeError, ValueError) as e:  # the timed result stands; the profile says what broke
            traceback.print_exc(file=sys.stderr)
            result["profile"] = {"available": False, "runs": [], "blocks": [],
                                 "reason": "the profiled runs failed: %s: %s" % (type(e).__name__,
                                                                                 " ".join(str(e).split())[:300])}
    return result


# The distributions behind each runtime (the first installed one counts), for the installed size in --probe
RUNTIME_DISTS = (("onnxruntime", ("onnxruntime", "onnxruntime-gpu")), ("tflite", ("tflite-runtime", "ai-edge-litert")),
                 ("executorch", ("executorch",)))
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
        try:
            info["runtimes"][cls.runtime] = cls.installed_version()
        except ImportError as e:
            info["runtimes"][cls.runtime] = None
            info.setdefault("runtime_errors", {})[cls.runtime] = str(e).splitlines()[0] if str(e) else "ImportError"
    here = os.path.dirname(os.path.abspath(__file__))
    st = os.statvfs(here)
    info["disk_free_mb"] = st.f_bavail * st.f_frsize // (1 << 20)
    mem = _read("/proc/meminfo", "")
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


def build_parser():
    p = argparse.ArgumentParser(description="edgemask remote runner")
    p.add_argument("--probe", action="store_true", help="describe this device and exit")
    p.add_argument("--model")
    p.add_argument("--format", choices=sorted(RUNTIMES))
    p.add_argument("--sample-io")
    p.add_argument("--warmup-runs", type=int, default=1)
    p.add_argument("--warmup-seconds", type=float, default=0.5)
    p.add_argument("--min-runs", type=int, default=50)
    p.add_argument("--min-seconds", type=float, default=1.0)
    p.add_argument("--sample-min-ms", type=float, default=0.0,
                   help="time back-to-back inferences per latency sample until it lasts this long (0: one each)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tolerance", type=float, default=1e-5)
    p.add_argument("--power-rate-hz", type=float, default=50.0)
    p.add_argument("--idle-seconds", type=float, default=0.5)
    p.add_argument("--power-sensor", default="auto")
    p.add_argument("--watch-stdin", action="store_true", help="exit when stdin closes or the parent changes")
    p.add_argument("--strays", action="store_true", help="kill benchmark runners of this workdir and exit")
    p.add_argument("--lock", help="--strays: only if this board lock is held by --token (never another "
                   "campaign's runners)")
    p.add_argument("--token", help="--strays: the caller's board lock token")
    p.add_argument("--hold-lock", metavar="FILE", help="take this board lock, print the result, hold it until "
                   "stdin closes (with --watch-stdin)")
    p.add_argument("--holder", metavar="JSON", default="{}", help="--hold-lock: who holds it")
    p.add_argument("--set-governors", metavar="JSON", help='{"*": "performance"} or {"cpu0": "ondemand", ...}')
    p.add_argument("--jetson-clocks", choices=("store", "apply", "restore"))
    p.add_argument("--state-file", help="jetson_clocks --store/--restore file")
    p.add_argument("--profile-runs", type=int, default=0, help="per-operator profiled runs after the timed ones")
    p.add_argument("--profile-warmup", type=int, default=5)
    p.add_argument("--profile-dir", help="keep the profiler's files (ETDump) here; default: a removed temp dir")
    p.add_argument("--trtexec", help="format trt: the board's trtexec (default %s, then PATH)" % TRTEXEC_DEFAULT)
    p.add_argument("--input-name", help="format trt: the ONNX input's name (trtexec --loadInputs)")
    p.add_argument("--engine-dir", help="format trt: the engine cache (default: trt-engines in the workdir)")
    return p


def _clean(obj):
    """NaN and infinities become null: the output is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return dict((k, _clean(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _hold_lock(args, out_fd):
    """--hold-lock: print the one JSON line at once, then (when taken) hold the lock until the session ends.

    The host keeps this process's stdin open for as long as its campaign runs; when the campaign ends, is killed
    or loses its link, stdin reaches EOF and the watchdog (--watch-stdin) exits this process, which drops the
    lock. Without --watch-stdin nothing would ever end it, so it is refused."""
    if not args.watch_stdin:
        result, fd = {"ok": False, "error": "--hold-lock needs --watch-stdin"}, None
    else:
        result, fd = take_lock(args.hold_lock, json.loads(args.holder))
    with os.fdopen(out_fd, "w") as out:
        out.write(json.dumps(_clean(result), sort_keys=True))
        out.write("\n")
    if fd is None:
        return 0 if result.get("busy") else 1
    while True:  # the watchdog ends the process
        time.sleep(60)


def main(argv=None):
    # Keep the real stdout for the one JSON document; whatever a runtime prints goes to stderr.
    out_fd = os.dup(1)
    sys.stdout.flush()
    os.dup2(2, 1)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        result = {"ok": False, "error": "bad runner arguments (exit %s); see stderr" % e.code}
        args = None
    if args is not None:
        try:
            if args.watch_stdin:
                start_watchdog()
            TRTEXEC[0] = args.trtexec
            if args.probe:
                result = probe()
            elif args.hold_lock:
                return _hold_lock(args, out_fd)
            elif args.strays:
                why = lock_held_by(args.lock, args.token) if args.lock else None
                if why is not None:
                    raise RunFailed("%s: no runner killed" % why)
                result = {"ok": True, "found": find_strays()}
            elif args.set_governors:
                result = set_governors(json.loads(args.set_governors))
            elif args.jetson_clocks:
                if not args.state_file:
                    raise RunFailed("--jetson-clocks needs --state-file")
                result = jetson_clocks(args.jetson_clocks, args.state_file)
            else:
                for name in ("model", "format", "sample_io"):
                    if getattr(args, name) is None:
                        raise RunFailed("--%s is required" % name.replace("_", "-"))
                for path in (args.model, args.sample_io):
                    if not os.path.isfile(path):
                        raise RunFailed("no such file: %s" % path)
                result = benchmark(args)
        except RunFailed as e:
            result = {"ok": False, "error": str(e)}
        except Exception as e:  # the JSON must say what broke, whatever it was
            traceback.print_exc(file=sys.stderr)
            msg = " ".join(str(e).split()) or type(e).__name__
            result = {"ok": False, "error": "%s: %s" % (type(e).__name__, msg[:500])}
    sys.stdout.flush()
    with os.fdopen(out_fd, "w") as out:
        out.write(json.dumps(_clean(result), sort_keys=True))
        out.write("\n")
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
