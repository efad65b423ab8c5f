"""The board's files and tools: /sys and /proc read under a root tests can move, a tool run with a timeout, and
where this runner lives (a zipapp in <workdir>/blobs/ on a board)."""

import os
import re
import shutil
import subprocess

SYSFS_ROOT_ENV = "EDGEMASK_SYSFS_ROOT"


def runner_file():
    """The file this runner was started from: the zipapp ``<workdir>/blobs/<sha256>.pyz`` on a board (a module's
    ``__file__`` lies inside it), or this package's folder when run from a checkout (``python -m``)."""
    path = os.path.dirname(os.path.abspath(__file__))
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def sysfs_root():
    """Prefix for every /sys and /proc path read here, so tests can point at a fake tree."""
    return os.environ.get(SYSFS_ROOT_ENV, "/")


def rooted(root, path):
    """``path`` (absolute, e.g. "/sys/class/hwmon") under ``root``."""
    return os.path.join(root, path.lstrip("/"))


def read_text(path, default=None):
    """A small file's stripped text, or ``default`` when it cannot be read."""
    try:
        with open(path) as f:
            return f.read().strip()
    except (IOError, OSError):
        return default


def read_number(path):
    """A file holding one number (sysfs), or None."""
    text = read_text(path)
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def cpu_index(path):
    """".../cpu3/cpufreq" -> 3 (-1 when no cpuN in the path): CPUs sort by number, not by name."""
    m = re.search(r"cpu(\d+)", path)
    return int(m.group(1)) if m else -1


def run_tool(argv, timeout=5):
    """A board tool's stripped stdout (vcgencmd, nvpmodel, jetson_clocks --show); None when it is missing, fails
    or hangs past ``timeout`` seconds."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        out, _ = p.communicate(timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.strip() if p.returncode == 0 else None


def read_first_number(path):
    """The first number of a file's text (/proc/uptime), or None."""
    text = read_text(path)
    try:
        return float(text.split()[0]) if text else None
    except ValueError:
        return None


def sha256_file(path):
    """The file's sha256, read in 1 MiB blocks."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
