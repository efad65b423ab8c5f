"""Pure parsers of what the boards print: tegrastats lines, `vcgencmd get_throttled`, `nvpmodel -q`,
/proc/meminfo (imported by the host as devices.sensors, and tested there)."""

import re

from .sensors import INPUT_RAIL_NAMES


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
