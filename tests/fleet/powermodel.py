"""EMULATION — a stand-in device's power sensor, driven by a power model. Not a measurement of anything.

Real boards expose their power monitors in sysfs: a Jetson's INA3221 as an IIO device with `rail_name_N` and
`in_power<N>_input` (mW), a Raspberry Pi's INA219/INA226 hat as hwmon `power1_input` (µW). This process writes
files of exactly those layouts into the stand-in's emulated sysfs root (the runner reads it through
`EDGEMASK_SYSFS_ROOT`), so the runner's real sensor code samples them. The value written is

    P = idle_w + (busy_w - idle_w) * u,   u = CPU time the device's cgroup used / (wall time × its CPU quota)

updated `--rate-hz` times a second. Every tree it writes carries an `EMULATED-BY-EDGEMASK-TEST-FLEET` file.

    python powermodel.py --sysfs DIR --kind ina3221|hwmon --usage-file F --usage-unit ns|us --cores 0.5
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

MARKER = "EMULATED-BY-EDGEMASK-TEST-FLEET"
INA3221_DIR = "sys/bus/i2c/drivers/ina3221x/0-0040/iio:device0"
HWMON_DIR = "sys/class/hwmon/hwmon0"


def power_w(used_cpu_s: float, wall_s: float, cores: float, idle_w: float, busy_w: float) -> float:
    """The model: linear in the cgroup's CPU utilisation over the interval, clipped to [0, 1]."""
    u = 0.0 if wall_s <= 0 else min(1.0, max(0.0, used_cpu_s / (wall_s * cores)))
    return idle_w + (busy_w - idle_w) * u


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
    ap.add_argument("--parent-pid", type=int, default=0, help="exit when this process is gone")
    args = ap.parse_args()

    out = layout(args.sysfs, args.kind, args.volts)
    scale = 1000.0 if args.kind == "ina3221" else 1e6  # mW for INA3221, µW for hwmon
    t0, u0 = time.monotonic(), read_usage_s(args.usage_file, args.usage_unit)
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
        _write(out, str(int(power_w(u1 - u0, t1 - t0, args.cores, args.idle_w, args.busy_w) * scale)))
        t0, u0 = t1, u1


if __name__ == "__main__":
    main()
