"""Power sensors and board-status parsers on real sysfs layouts (fake trees) and real tool output."""

from __future__ import annotations

import pytest

from edgemask.devices.sensors import (
    HwmonSensor,
    Ina3221Sensor,
    RaplSensor,
    SensorMissing,
    decode_throttled,
    device_state,
    find_sensor,
    parse_nvpmodel,
    parse_tegrastats,
    rapl_delta_uj,
)

# Jetson TX2, JetPack 4.6 / L4T 32.7: two INA3221 chips; the board's input rail is VDD_IN on 0-0041.
TX2_L4T32 = {
    "0-0040/iio:device0": [("VDD_SYS_GPU", 152), ("VDD_SYS_SOC", 457), ("VDD_4V0_WIFI", 0)],
    "0-0041/iio:device1": [("VDD_IN", 3712), ("VDD_SYS_CPU", 617), ("VDD_SYS_DDR", 95)],
}


def make_tx2(put, base="sys/bus/i2c/drivers/ina3221x", layout=TX2_L4T32):
    for chip, rails in layout.items():
        for i, (name, mw) in enumerate(rails):
            put(f"{base}/{chip}/rail_name_{i}", name)
            put(f"{base}/{chip}/in_power{i}_input", str(mw))
            put(f"{base}/{chip}/in_current{i}_input", str(mw * 1000 // 19000))
            put(f"{base}/{chip}/in_voltage{i}_input", "19000")


def test_ina3221_l4t32_reads_the_input_rail_only(fake_root):
    make_tx2(fake_root)
    sensor, why = find_sensor("auto", str(fake_root.root))
    assert why is None and isinstance(sensor, Ina3221Sensor)
    assert sensor.source == "ina3221:VDD_IN"
    assert sensor.sample() == pytest.approx(3.712)  # not the sum of all six rails (5.033 W)


def test_ina3221_l4t28_layout(fake_root):
    layout = {"0-0041/iio_device": [("VDD_IN", 4180), ("VDD_SYS_CPU", 1220), ("VDD_SYS_DDR", 310)],
              "0-0040/iio_device": [("VDD_SYS_GPU", 76), ("VDD_SYS_SOC", 534), ("VDD_4V0_WIFI", 38)]}
    make_tx2(fake_root, base="sys/devices/3160000.i2c/i2c-0", layout=layout)
    sensor, _ = find_sensor("ina3221", str(fake_root.root))
    assert sensor.source == "ina3221:VDD_IN" and sensor.sample() == pytest.approx(4.18)


def test_ina3221_without_input_rail_refuses_to_sum(fake_root):
    make_tx2(fake_root, layout={"0-0040/iio:device0": TX2_L4T32["0-0040/iio:device0"]})
    with pytest.raises(SensorMissing, match="never summed") as e:
        Ina3221Sensor.discover(str(fake_root.root))
    assert "VDD_SYS_GPU" in str(e.value)


def test_hwmon_ina219_power_in_microwatts(fake_root):
    fake_root("sys/class/hwmon/hwmon0/name", "cpu_thermal")
    fake_root("sys/class/hwmon/hwmon0/temp1_input", "48312")
    fake_root("sys/class/hwmon/hwmon1/name", "ina219")
    fake_root("sys/class/hwmon/hwmon1/power1_input", "2650000")
    sensor, _ = find_sensor("auto", str(fake_root.root))
    assert isinstance(sensor, HwmonSensor) and sensor.source == "hwmon:ina219:hwmon1"
    assert sensor.sample() == pytest.approx(2.65)


def test_hwmon_ina226_current_times_bus_voltage(fake_root):
    fake_root("sys/class/hwmon/hwmon2/name", "ina226")
    fake_root("sys/class/hwmon/hwmon2/curr1_input", "512")  # mA
    fake_root("sys/class/hwmon/hwmon2/in1_input", "5080")  # mV (bus)
    fake_root("sys/class/hwmon/hwmon2/in0_input", "2")  # mV (shunt): must not be used
    sensor, _ = find_sensor("hwmon", str(fake_root.root))
    assert sensor.sample() == pytest.approx(0.512 * 5.080)


def test_rapl_wraparound_and_priming(fake_root):
    max_range = 262143328850
    assert rapl_delta_uj(1_000_000, 3_500_000, max_range) == 2_500_000
    assert rapl_delta_uj(max_range - 1000, 500, max_range) == 1500
    fake_root("sys/class/powercap/intel-rapl:0/name", "package-0")
    energy = fake_root("sys/class/powercap/intel-rapl:0/energy_uj", str(max_range - 1000))
    fake_root("sys/class/powercap/intel-rapl:0/max_energy_range_uj", str(max_range))
    sensor, _ = find_sensor("auto", str(fake_root.root))
    assert isinstance(sensor, RaplSensor) and sensor.source == "rapl:package-0"
    sensor.clock = iter([10.0, 12.0]).__next__  # seconds: the sampler's clock at the two reads
    assert sensor.sample() is None  # the first read only primes the difference
    energy.write_text("499000\n")  # wrapped: 1000 + 499000 uJ = 0.5 J in 2 s
    assert sensor.sample() == pytest.approx(0.25)


def test_no_sensor_gives_every_reason(fake_root):
    fake_root("sys/class/hwmon/hwmon0/name", "rpi_volt")
    sensor, why = find_sensor("auto", str(fake_root.root))
    assert sensor is None
    assert "ina3221:" in why and "rpi_volt" in why and "rapl:" in why
    assert find_sensor("none", str(fake_root.root))[1].startswith("power sensor disabled")
    assert "valid: auto, none, hwmon, ina3221, rapl" in find_sensor("monsoon", str(fake_root.root))[1]


TX2_LINE = ("RAM 2165/7854MB (lfb 1007x4MB) SWAP 0/3927MB (cached 0MB) CPU [2%@345,off,off,0%@345,1%@345,0%@345] "
            "EMC_FREQ 0% GR3D_FREQ 0% PLL@38C MCPU@38C PMIC@100C Tboard@33C GPU@36C BCPU@38C thermal@37.3C "
            "Tdiode@35.25C VDD_SYS_GPU 152/152 VDD_SYS_SOC 457/457 VDD_4V0_WIFI 0/0 VDD_IN 3712/3712 "
            "VDD_SYS_CPU 617/617 VDD_SYS_DDR 95/95")
ORIN_LINE = ("11-22-2026 10:00:00 RAM 2712/30536MB (lfb 6762x4MB) SWAP 0/15268MB (cached 0MB) "
             "CPU [1%@729,0%@729,0%@729,0%@729] EMC_FREQ 0%@2133 GR3D_FREQ 0%@[0,0] VIC_FREQ 729 APE 174 "
             "CPU@45.5C tj@46.2C SOC0@44.9C VDD_GPU_SOC 2371mW/2371mW VDD_CPU_CV 395mW/395mW "
             "VIN_SYS_5V0 3312mW/3312mW")


def test_tegrastats_tx2_line():
    s = parse_tegrastats(TX2_LINE)
    assert (s["ram_used_mb"], s["ram_total_mb"]) == (2165, 7854)
    assert s["cpus"][0] == {"load_pct": 2, "freq_mhz": 345} and s["cpus"][1] is None and len(s["cpus"]) == 6
    assert s["temps_c"]["thermal"] == 37.3 and s["temps_c"]["Tdiode"] == 35.25 and s["temps_c"]["PMIC"] == 100
    assert s["rails_mw"]["VDD_SYS_CPU"] == (617, 617) and "RAM" not in s["rails_mw"] and "SWAP" not in s["rails_mw"]
    assert len(s["rails_mw"]) == 6
    assert s["input_power_w"] == pytest.approx(3.712)


def test_tegrastats_orin_line_with_units():
    s = parse_tegrastats(ORIN_LINE)
    assert s["rails_mw"]["VDD_GPU_SOC"] == (2371, 2371) and s["input_power_w"] == pytest.approx(3.312)
    assert s["temps_c"]["tj"] == 46.2 and len(s["cpus"]) == 4


def test_vcgencmd_throttled_bits():
    f = decode_throttled("throttled=0x50005")
    assert f["raw"] == 0x50005
    assert f["under_voltage"] and f["throttled"] and f["under_voltage_occurred"] and f["throttled_occurred"]
    assert not f["freq_capped"] and not f["soft_temp_limit_occurred"]
    assert decode_throttled("throttled=0x0")["under_voltage"] is False
    with pytest.raises(ValueError):
        decode_throttled("error=1 error_msg=\"Command not registered\"")


def test_nvpmodel_query():
    assert parse_nvpmodel("NV Fan Mode:quiet\nNV Power Mode: MAXN\n0\n") == {"mode": "MAXN", "id": 0}
    assert parse_nvpmodel("NV Power Mode: MAXP_CORE_ARM\n3") == {"mode": "MAXP_CORE_ARM", "id": 3}


def test_device_state_from_sysfs(fake_root):
    for cpu, gov, khz in [(0, "schedutil", 1500000), (1, "schedutil", 600000), (10, "schedutil", 345600)]:
        fake_root(f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor", gov)
        fake_root(f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq", str(khz))
    fake_root("sys/class/thermal/thermal_zone0/type", "cpu-thermal")
    fake_root("sys/class/thermal/thermal_zone0/temp", "48312")
    fake_root("sys/class/thermal/thermal_zone1/type", "GPU-therm")
    fake_root("sys/class/thermal/thermal_zone1/temp", "-40000")
    fake_root("proc/loadavg", "0.42 0.30 0.25 1/123 4567")
    st = device_state(str(fake_root.root))
    assert st["governor"] == "schedutil"
    assert list(st["cpu_khz"]) == ["cpu0", "cpu1", "cpu10"]  # numeric order
    assert st["cpu_khz"]["cpu1"] == 600000
    assert st["temps_c"] == {"cpu-thermal": 48.312, "GPU-therm": -40.0}
    assert st["loadavg_1m"] == 0.42
    fake_root("sys/devices/system/cpu/cpu1/cpufreq/scaling_governor", "performance")
    assert device_state(str(fake_root.root))["governor"] == "performance,schedutil"
