"""The device's state (governor, clocks, temperatures, throttling, power mode) and this process's memory."""

import glob
import os
import resource

from .parsers import decode_throttled, parse_meminfo_kb, parse_nvpmodel
from .system import cpu_index, read_number, read_text, rooted, run_tool, sysfs_root


def device_state(root=None):
    """Governor, clocks (kHz), temperatures (deg C), throttling flags and power mode, where the board has them."""
    root = sysfs_root() if root is None else root
    state = {"governors": {}, "cpu_khz": {}, "temps_c": {}}
    for d in sorted(glob.glob(rooted(root, "sys/devices/system/cpu/cpu[0-9]*/cpufreq")), key=cpu_index):
        cpu = "cpu%d" % cpu_index(d)
        gov = read_text(os.path.join(d, "scaling_governor"))
        if gov is not None:
            state["governors"][cpu] = gov
        khz = read_number(os.path.join(d, "scaling_cur_freq"))
        if khz is not None:
            state["cpu_khz"][cpu] = int(khz)
    govs = sorted(set(state["governors"].values()))
    state["governor"] = govs[0] if len(govs) == 1 else (",".join(govs) or None)
    for d in sorted(glob.glob(rooted(root, "sys/class/thermal/thermal_zone*"))):
        kind = read_text(os.path.join(d, "type")) or os.path.basename(d)
        milli = read_number(os.path.join(d, "temp"))
        if milli is not None:
            state["temps_c"][kind] = milli / 1000.0
    load = read_text(rooted(root, "proc/loadavg"))
    if load:
        state["loadavg_1m"] = float(load.split()[0])
    throttled = run_tool(["vcgencmd", "get_throttled"])
    if throttled:
        try:
            state["throttled"] = decode_throttled(throttled)
        except ValueError:
            state["throttled"] = {"unparsed": throttled}
    nvp = run_tool(["nvpmodel", "-q"])
    if nvp:
        state["nvpmodel"] = parse_nvpmodel(nvp)
    return state


def rss_kb():
    """(current RSS, peak RSS) of this process in kB."""
    text = read_text("/proc/self/status", "")
    cur = parse_meminfo_kb(text, "VmRSS")
    peak = parse_meminfo_kb(text, "VmHWM")
    if peak is None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux
    return (cur if cur is not None else 0), peak
