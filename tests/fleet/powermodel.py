"""EMULATION — a stand-in device's power sensor, driven by a power model. Not a measurement of anything.

Real boards expose their power monitors in sysfs: a Jetson's INA3221 as an IIO device with `rail_name_N` and
`in_power<N>_input` (mW), a Raspberry Pi's INA219/INA226 hat as hwmon `power1_input` (µW). This process writes
files of exactly those layouts into the stand-in's emulated sysfs root (the runner reads it through
`EDGEMASK_SYSFS_ROOT`), so the runner's real sensor code samples them. The value written is

    P = idle_w + (busy_w - idle_w) * u,   u = CPU time the device's cgroup used / (wall time × its CPU quota)

over the last `--window-s` seconds, updated `--rate-hz` times a second. Every tree it writes carries an
`EMULATED-BY-EDGEMASK-TEST-FLEET` file.

The window is one of the cgroup's CFS periods (100 ms), as a real INA3221 averages its conversions. The quota
runs the device's processes in bursts (25 ms of every 100 ms for a quarter of a CPU), and the runner's sampler
is one of those processes, so it reads the sensor only during a burst. A window shorter than a period (it was
the 50 ms update interval) then held the usage of the throttled stretch just before the burst at most of those
reads: a busy device read as idle in about one timed window out of ten, depending only on how the update ticks
fell against the bursts (25 windows in a row measured a busy mean of 2.4-4.9 W; with this window, 5.7-5.9 W, idle
2.4-2.9 W). A window of a whole period sees about the same usage whatever the phase.

    python powermodel.py --sysfs DIR --kind ina3221|hwmon --usage-file F --usage-unit ns|us --cores 0.5 \
        --window-s 0.1
"""

from __future__ import annotations

import argparse
import os
import time
from collections import deque
from pathlib import Path

MARKER = "EMULATED-BY-EDGEMASK-TEST-FLEET"
INA3221_DIR = "sys/bus/i2c/drivers/ina3221x/0-0040/iio:device0"
HWMON_DIR = "sys/class/hwmon/hwmon0"


def power_w(used_cpu_s: float, wall_s: float, cores: float, idle_w: float, busy_w: float) -> float:
    """The model: linear in the cgroup's CPU utilisation over the interval, clipped to [0, 1]."""
    u = 0.0 if wall_s <= 0 else min(1.0, max(0.0, used_cpu_s / (wall_s * cores)))
    return idle_w + (busy_w - idle_w) * u


class UsageWindow:
    """The cgroup's CPU use over the last ``window_s`` seconds of (wall, cumulative usage) readings: each
    :meth:`add` returns (usage, wall) between the newest reading and the oldest one still at least a window old."""

    def __init__(self, window_s: float, t: float, usage_s: float) -> None:
        self.window_s = window_s
        self.readings = deque([(t, usage_s)])

    def add(self, t: float, usage_s: float) -> tuple[float, float]:
        self.readings.append((t, usage_s))
        while len(self.readings) > 2 and t - self.readings[1][0] >= self.window_s:
            self.readings.popleft()
        t0, u0 = self.readings[0]
        return usage_s - u0, t - t0


def read_usage_s(path: Path, unit: str) -> float:
    """Cumulative CPU time of the cgroup in seconds (v1 cpuacct.usage in ns, v2 cpu.stat usage_usec in µs)."""
    text = path.read_text()
    if unit == "us":  # cgroup v2 cpu.stat: "usage_usec N" among other lines
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        raise ValueError(f"{path}: no usage_usec line")
    return int(text.strip()) / 1e9


def _write(path: Path, text: str) -> None:
    tmp = path.with_name("." + path.name + ".tmp")  # hidden: no sysfs glob matches it
    tmp.write_text(text + "\n")
    os.replace(tmp, path)  # a reader sees the old or the new value, never half a number


def layout(root: Path, kind: str, volts: float) -> Path:
    """Create the static files of the sensor's sysfs layout; return the file the power goes into."""
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).write_text("This tree is an emulation written by tests/fleet/powermodel.py, not a real sensor.\n")
    if kind == "ina3221":
        d = root / INA3221_DIR
        d.mkdir(parents=True, exist_ok=True)
        # channel 0 is the board's input rail (already the total); 1 and 2 are sub-rails, never summed
        for i, name in enumerate(("VDD_IN", "VDD_SYS_GPU", "VDD_SYS_CPU")):
            _write(d / f"rail_name_{i}", name)
            _write(d / f"in_voltage{i}_input", str(int(volts * 1000)))
            _write(d / f"in_power{i}_input", "0")
        (d / MARKER).write_text("emulated\n")
        return d / "in_power0_input"
    if kind == "hwmon":
        d = root / HWMON_DIR
        d.mkdir(parents=True, exist_ok=True)
        _write(d / "name", "ina226")
        _write(d / "in1_input", str(int(volts * 1000)))
        _write(d / "power1_input", "0")
        (d / MARKER).write_text("emulated\n")
        return d / "power1_input"
    raise ValueError(f"unknown sensor kind {kind!r}; valid: ina3221, hwmon")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sysfs", type=Path, required=True)
    ap.add_argument("--kind", choices=("ina3221", "hwmon"), required=True)
    ap.add_argument("--usage-file", type=Path, required=True)
    ap.add_argument("--usage-unit", choices=("ns", "us"), default="ns")
    ap.add_argument("--cores", type=float, required=True, help="the cgroup's CPU quota in cores")
    ap.add_argument("--idle-w", type=float, default=2.0)
    ap.add_argument("--busy-w", type=float, default=6.0)
    ap.add_argument("--volts", type=float, default=5.0)
    ap.add_argument("--rate-hz", type=float, default=20.0)
    ap.add_argument("--window-s", type=float, required=True, help="the usage is averaged over this long (a whole "
                                                                  "CFS period of the cgroup)")
    ap.add_argument("--parent-pid", type=int, default=0, help="exit when this process is gone")
    args = ap.parse_args()

    out = layout(args.sysfs, args.kind, args.volts)
    scale = 1000.0 if args.kind == "ina3221" else 1e6  # mW for INA3221, µW for hwmon
    window = UsageWindow(args.window_s, time.monotonic(), read_usage_s(args.usage_file, args.usage_unit))
    _write(out, str(int(args.idle_w * scale)))
    while True:
        time.sleep(1.0 / args.rate_hz)
        if args.parent_pid and not os.path.exists(f"/proc/{args.parent_pid}"):
            return
        try:
            u1 = read_usage_s(args.usage_file, args.usage_unit)
        except (OSError, ValueError):
            return  # the cgroup is gone: the device was torn down
        t1 = time.monotonic()
        used, wall = window.add(t1, u1)
        _write(out, str(int(power_w(used, wall, args.cores, args.idle_w, args.busy_w) * scale)))


if __name__ == "__main__":
    main()
