"""Power sensors and board-status parsers, shared with the remote runner.

The runner (``devices/remote/runner/``) is a stdlib-only package shipped to a board as one zipapp; this module
re-exports its sensor registry and pure parsers from the rooms that hold them (``sensors``, ``parsers``,
``state``), so the host side (and the tests) use the same code.
"""

from __future__ import annotations

from edgemask.devices.remote.runner.parsers import decode_throttled, parse_nvpmodel, parse_tegrastats
from edgemask.devices.remote.runner.sensors import (
    INPUT_RAIL_NAMES,
    SENSOR_ORDER,
    SENSORS,
    HwmonSensor,
    Ina3221Sensor,
    PowerSampler,
    RaplSensor,
    SensorMissing,
    find_sensor,
    ina3221_rails,
    rapl_delta_uj,
)
from edgemask.devices.remote.runner.state import device_state
from edgemask.devices.remote.runner.system import SYSFS_ROOT_ENV

__all__ = [
    "INPUT_RAIL_NAMES", "SENSOR_ORDER", "SENSORS", "SYSFS_ROOT_ENV", "HwmonSensor", "Ina3221Sensor", "PowerSampler",
    "RaplSensor", "SensorMissing", "decode_throttled", "device_state", "find_sensor", "ina3221_rails",
    "parse_nvpmodel", "parse_tegrastats", "rapl_delta_uj",
]
