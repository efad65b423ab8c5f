"""Board settings a campaign applies and restores: each CPU's governor and jetson_clocks (as root, or with `sudo -n`
where the sudoers file allows it)."""

import glob
import os
import shutil
import subprocess

from .system import cpu_index, read_text, rooted, run_tool, sysfs_root


GOVERNOR_SUDOERS = "/usr/bin/tee /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor"


def _cpufreq_dirs(root):
    return sorted(glob.glob(rooted(root, "sys/devices/system/cpu/cpu[0-9]*/cpufreq")), key=cpu_index)


def read_governors(root=None):
    """{"cpu0": "ondemand", ...} for every CPU with cpufreq."""
    root = sysfs_root() if root is None else root
    out = {}
    for d in _cpufreq_dirs(root):
        gov = read_text(os.path.join(d, "scaling_governor"))
        if gov is not None:
            out["cpu%d" % cpu_index(d)] = gov
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
        cpu = "cpu%d" % cpu_index(d)
        gov = wanted.get(cpu, wanted.get("*"))
        if gov is None or before.get(cpu) == gov:
            continue
        available = (read_text(os.path.join(d, "scaling_available_governors")) or "").split()
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
    show = run_tool(prefix + ["jetson_clocks", "--show"], timeout=30)
    return {"ok": True, "show": show}
