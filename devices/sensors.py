"""Power sensors and board-status parsers, shared with the remote runner.

The runner (``devices/remote/runner.py``) is one self-contained script so it can be copied to a board; this
module re-exports its sensor registry and pure parsers so the host side (and the tests) use the same code.
"""

from __future__ import annotations

from devices.remote.runner import (
    INPUT_RAIL_NAMES,
    SENSOR_ORDER,
    SENSORS,
    SYSFS_ROOT_ENV,
    HwmonSensor,
    Ina3221Sensor,
    PowerSampler,
    RaplSensor,
    SensorMissing,
    decode_throttled,
    device_state,
    find_sensor,
    ina3221_rails,
    parse_nvpmodel,
    parse_tegrastats,
    rapl_delta_uj,
)

__all__ = [
    "INPUT_RAIL_NAMES", "SENSOR_ORDER", "SENSORS", "SYSFS_ROOT_ENV", "HwmonSensor", "Ina3221Sensor", "PowerSampler",
    "RaplSensor", "SensorMissing", "decode_throttled", "device_state", "find_sensor", "ina3221_rails",
    "parse_nvpmodel", "parse_tegrastats", "rapl_delta_uj",
]
