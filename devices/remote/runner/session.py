"""Dying with the session, and the runners that did not: the watchdog that ends this process when its host stops
listening, and the benchmark runners of this workdir an earlier session left behind (found, then killed)."""

import os
import threading
import time

from .system import read_first_number, read_text, runner_file


WATCHDOG_EXIT = 75  # rc of a runner that left because its session went away


def start_watchdog(period=0.5):
    """Exit (the whole process, at once) when stdin reaches EOF or the parent process changes.

    sshd closes the command's stdin when the channel closes (the host timed out, was killed or lost the
    link); a local host's pipe closes when the host dies. Either way nobody waits for this result any more.
    """
    import select

    parent = os.getppid()

    def watch():
        while True:
            try:
                ready = select.select([0], [], [], period)[0]
                if ready and not os.read(0, 4096):
                    break
            except (OSError, ValueError):
                break
            if os.getppid() != parent:
                break
        os._exit(WATCHDOG_EXIT)

    t = threading.Thread(target=watch, name="session-watchdog")
    t.daemon = True
    t.start()


def _proc_argv(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except (IOError, OSError):
        return None


def _proc_uid(pid):
    try:
        return os.stat("/proc/%d" % pid).st_uid
    except OSError:
        return None


def _proc_age_s(pid):
    """Seconds since the process started (from /proc/PID/stat and /proc/uptime); None if unknown."""
    stat = read_text("/proc/%d/stat" % pid)
    uptime = read_first_number("/proc/uptime")
    if stat is None or uptime is None:
        return None
    try:
        start_ticks = float(stat.rsplit(")", 1)[1].split()[19])
        return round(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 1)
    except (IndexError, ValueError, OSError):
        return None


def is_our_runner(argv, blobs_dir):
    """True for `PYTHON <blobs_dir>/<sha>.pyz ... --model ...`: a benchmark run of a runner deployed here (``.py``:
    one deployed before the runner became a zipapp)."""
    if not argv or "--model" not in argv:
        return False
    for arg in argv[1:3]:  # the script comes right after the interpreter (or after one interpreter option)
        if arg.endswith((".pyz", ".py")) and os.path.dirname(os.path.realpath(arg)) == blobs_dir:
            return True
    return False


def find_strays(blobs_dir=None, kill=True, grace_s=2.0):
    """Benchmark runners of this workdir (same user, a runner deployed in ``blobs_dir``) other than this process
    and its ancestors; killed with SIGTERM, then SIGKILL after ``grace_s``. Returns [{"pid", "age_s", "argv",
    "killed"}]. Nothing else is touched: another user's process, another workdir's, a probe, a shell."""
    import signal

    blobs_dir = os.path.realpath(blobs_dir or os.path.dirname(runner_file()))
    mine = set()
    pid = os.getpid()
    while pid > 1 and pid not in mine:
        mine.add(pid)
        stat = read_text("/proc/%d/stat" % pid)
        try:
            pid = int(stat.rsplit(")", 1)[1].split()[1]) if stat else 1
        except (IndexError, ValueError):
            break
    uid = os.getuid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        pid = int(entry)
        argv = _proc_argv(pid)
        if argv is None or _proc_uid(pid) != uid or not is_our_runner(argv, blobs_dir):
            continue
        found.append({"pid": pid, "age_s": _proc_age_s(pid), "argv": " ".join(argv)[:300], "killed": False})
    if kill:
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, grace_s)):
            alive = [p for p in found if not p["killed"]]
            for p in alive:
                try:
                    os.kill(p["pid"], sig)
                except OSError:
                    p["killed"] = True  # gone already
            deadline = time.monotonic() + wait
            while alive and time.monotonic() < deadline:
                for p in alive:
                    if not os.path.exists("/proc/%d" % p["pid"]) or _proc_state(p["pid"]) == "Z":
                        p["killed"] = True
                alive = [p for p in alive if not p["killed"]]
                if alive:
                    time.sleep(0.05)
    return found


def _proc_state(pid):
    stat = read_text("/proc/%d/stat" % pid)
    try:
        return stat.rsplit(")", 1)[1].split()[0] if stat else None
    except IndexError:
        return None
