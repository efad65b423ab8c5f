"""Power sensors, one registry: each class has discover(root) -> sensor (or raises SensorMissing(reason)) and
sample() -> watts; PowerSampler samples one in a background thread. Imported by the host as devices.sensors."""

import glob
import os
import threading
import time

from .system import read_number, read_text, rooted, sysfs_root


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
        for d in sorted(glob.glob(rooted(root, pattern))):
            real = os.path.realpath(d)
            if real in seen:
                continue
            seen.add(real)
            for name_file in sorted(glob.glob(os.path.join(d, "rail_name_*"))):
                idx = name_file.rsplit("_", 1)[1]
                name = read_text(name_file)
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
            raise SensorMissing("no INA3221 rails under %s" % rooted(root, "sys/bus/i2c/drivers/ina3221x"))
        for rail in INPUT_RAIL_NAMES:
            if rail in rails:
                return cls(rail, rails[rail])
        raise SensorMissing(
            "INA3221 found but none of its rails is an input rail %s (rails: %s); rails are never summed"
            % (", ".join(INPUT_RAIL_NAMES), ", ".join(sorted(rails)))
        )

    def sample(self):
        mw = read_number(self.path)
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
        for d in sorted(glob.glob(rooted(root, "sys/class/hwmon/hwmon*"))):
            chip = read_text(os.path.join(d, "name"), "")
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
            uw = read_number(self.power_file)
            return None if uw is None else uw / 1e6
        ma = read_number(os.path.join(self.dir, "curr1_input"))  # mA
        mv = read_number(os.path.join(self.dir, "in1_input"))  # bus voltage, mV
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
        self.max_range = read_number(os.path.join(directory, "max_energy_range_uj")) or float(2 ** 32)
        self.source = "rapl:%s" % (read_text(os.path.join(directory, "name")) or os.path.basename(directory))
        self._last = None
        self.clock = time.monotonic

    @classmethod
    def discover(cls, root):
        d = rooted(root, "sys/class/powercap/intel-rapl:0")
        if not os.path.isdir(d):
            raise SensorMissing("no Intel RAPL domain at %s" % d)
        if read_number(os.path.join(d, "energy_uj")) is None:
            raise SensorMissing("%s is not readable (RAPL energy needs root on Linux >= 5.10)"
                                % os.path.join(d, "energy_uj"))
        return cls(d)

    def sample(self):
        e = read_number(self.energy_file)
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


def mean_w(samples):
    """The mean of power samples in W; None when there are none."""
    return sum(samples) / len(samples) if samples else None


def idle_power_w(sensor, seconds, rate_hz):
    """The mean power over ``seconds`` of doing nothing, before a job (None without a sensor or a wait)."""
    if sensor is None or not seconds > 0:
        return None
    idle = PowerSampler(sensor, rate_hz)
    idle.start()
    time.sleep(seconds)
    return mean_w(idle.stop())


def power_fields(sensor, samples, achieved_rate_hz, idle_w, missing):
    """The job result's power fields: the timed window's samples from ``sensor``, or none with why
    (``missing``: find_sensor's reason; a sensor that gave no samples is named)."""
    if sensor is not None and samples:
        return {"power_source": sensor.source, "power_w": samples, "power_rate_hz": achieved_rate_hz,
                "idle_power_w": idle_w}
    return {"power_source": None, "power_w": [], "power_rate_hz": None, "idle_power_w": None,
            "energy_missing_reason": missing or "sensor %s gave no samples" % sensor.source}
